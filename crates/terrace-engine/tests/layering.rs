//! The engine's modules import only downwards: no import cycles.
//!
//! The test reads every `.rs` file under `src/`, collects the modules each
//! top-level module refers to (`crate::x` paths, the names of a
//! `use crate::{x, y}` group, and `super::` paths that climb out of a
//! submodule), leaving out each file's `#[cfg(test)] mod tests` and what
//! follows it, then finds the strongly connected components of that graph
//! (Tarjan). A component of more than one module is a cycle; the test fails
//! on any, naming its modules and the imports between them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

#[test]
fn the_engine_modules_import_no_cycle() {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = module_graph(&source);
    assert!(
        graph.contains_key("space") && graph.contains_key("pool"),
        "the graph was read: {graph:?}"
    );
    let found: Vec<String> = cycles(&graph)
        .iter()
        .map(|cycle| describe(&graph, cycle))
        .collect();
    assert!(
        found.is_empty(),
        "a module imports a module above it (each cycle with its edges):\n{}",
        found.join("\n")
    );
}

/// The marker in docs/ARCHITECTURE.md after which its module levels stand.
const LEVELS_MARKER: &str = "<!-- module levels: checked against the code by tests/layering.rs -->";

#[test]
fn the_module_levels_in_the_architecture_are_the_codes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let graph = module_graph(&root.join("src"));
    if !cycles(&graph).is_empty() {
        return; // the test above names the cycle
    }
    let expected = render_levels(&levels(&graph));
    let doc = std::fs::read_to_string(root.join("../../docs/ARCHITECTURE.md"))
        .expect("read docs/ARCHITECTURE.md");
    let written = doc
        .split_once(LEVELS_MARKER)
        .and_then(|(_, after)| after.split_once("```text\n"))
        .and_then(|(_, block)| block.split_once("```"))
        .map(|(block, _)| block.to_string());
    assert_eq!(
        written.as_deref(),
        Some(expected.as_str()),
        "docs/ARCHITECTURE.md's module levels (after {LEVELS_MARKER}) are not the code's; \
         they are:\n```text\n{expected}```"
    );
}

/// Each module's level: 0 for a module that imports no other, else one
/// above the highest it imports. `graph` has no cycle.
fn levels(graph: &Graph) -> BTreeMap<String, usize> {
    fn level(graph: &Graph, module: &str, known: &mut BTreeMap<String, usize>) -> usize {
        if let Some(&found) = known.get(module) {
            return found;
        }
        let mine = graph[module]
            .iter()
            .map(|dep| level(graph, dep, known) + 1)
            .max()
            .unwrap_or(0);
        known.insert(module.to_string(), mine);
        mine
    }
    let mut known = BTreeMap::new();
    for module in graph.keys() {
        level(graph, module, &mut known);
    }
    known
}

/// The levels, highest first, one line each: the level, then its modules.
fn render_levels(levels: &BTreeMap<String, usize>) -> String {
    let top = levels.values().copied().max().unwrap_or(0);
    let mut text = String::new();
    for level in (0..=top).rev() {
        let modules: Vec<&str> = levels
            .iter()
            .filter(|(_, l)| **l == level)
            .map(|(m, _)| m.as_str())
            .collect();
        text.push_str(&format!("{level:>2}  {}\n", modules.join(", ")));
    }
    text
}

#[test]
fn a_cycle_is_found_with_its_modules_and_edges() {
    let graph: Graph = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a", "d"]),
        ("d", vec![]),
    ]
    .into_iter()
    .map(|(m, deps)| (m.to_string(), deps.into_iter().map(String::from).collect()))
    .collect();
    let found = cycles(&graph);
    assert_eq!(found, vec![vec!["a", "b", "c"]]);
    assert_eq!(
        describe(&graph, &found[0]),
        "cycle of 3: a, b, c\n  a -> b\n  b -> c\n  c -> a"
    );
}

#[test]
fn references_are_read_from_paths_groups_and_super() {
    let text = "use crate::{alpha, beta::Thing, gamma::{x, y}};\n\
                use super::super::delta::D;\n\
                fn f() { crate::epsilon::go(); let _ = super::local; }\n\
                #[cfg(test)]\nmod tests { use crate::zeta; }\n";
    let found = references(text, &["jobs".into(), "run".into()]);
    let expected: BTreeSet<String> = ["alpha", "beta", "gamma", "delta", "epsilon", "jobs"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(found, expected);
}

/// Each top-level module of the crate at `source` with the top-level modules
/// it refers to (itself and names that are not modules left out).
fn module_graph(source: &Path) -> Graph {
    let mut files = Vec::new();
    rust_files(source, &mut files);
    let mut graph = Graph::new();
    for file in files {
        let relative = file.strip_prefix(source).expect("under src");
        let mut path: Vec<String> = relative
            .iter()
            .map(|part| part.to_string_lossy().trim_end_matches(".rs").to_string())
            .collect();
        if path.len() > 1 && path.last().is_some_and(|last| last == "mod") {
            path.pop();
        }
        let top = path[0].clone();
        if top == "lib" || top == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read a source file");
        let deps = graph.entry(top).or_default();
        deps.extend(references(&text, &path));
    }
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    for (module, deps) in graph.iter_mut() {
        deps.retain(|dep| dep != module && modules.contains(dep));
    }
    graph
}

fn rust_files(folder: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(folder).expect("read a source folder");
    for entry in entries {
        let path = entry.expect("a folder entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level modules `text`, the file of module `path`, refers to.
fn references(text: &str, path: &[String]) -> BTreeSet<String> {
    let text = match find_test_module(text) {
        Some(start) => &text[..start],
        None => text,
    };
    let mut found = BTreeSet::new();
    for (start, _) in text.match_indices("crate::") {
        if start > 0 && is_identifier(text[..start].chars().next_back()) {
            continue;
        }
        let rest = &text[start + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            found.extend(group_names(group));
        } else if let Some(name) = leading_identifier(rest) {
            found.insert(name.to_string());
        }
    }
    for (start, _) in text.match_indices("super::") {
        if start > 0
            && (is_identifier(text[..start].chars().next_back()) || text[..start].ends_with("::"))
        {
            continue;
        }
        let mut rest = &text[start..];
        let mut climbs = 0;
        while let Some(after) = rest.strip_prefix("super::") {
            climbs += 1;
            rest = after;
        }
        if climbs < path.len() {
            found.insert(path[0].clone());
        } else if let Some(name) = leading_identifier(rest) {
            found.insert(name.to_string());
        }
    }
    found
}

/// Where the file's `#[cfg(test)] mod tests` begins, if it has one.
fn find_test_module(text: &str) -> Option<usize> {
    text.match_indices("#[cfg(test)]")
        .find_map(|(start, marker)| {
            let after = text[start + marker.len()..].trim_start();
            let after = after.strip_prefix("mod")?;
            let after = after.trim_start().strip_prefix("tests")?;
            after.trim_start().starts_with('{').then_some(start)
        })
}

/// The first names of the items of a `{a, b::c, d::{e}}` group, `group`
/// starting after its `{`.
fn group_names(group: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut depth = 1;
    let mut item_start = true;
    for (index, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            ',' if depth == 1 => item_start = true,
            c if c.is_whitespace() => {}
            _ if depth == 1 && item_start => {
                item_start = false;
                if let Some(name) = leading_identifier(&group[index..]) {
                    names.push(name.to_string());
                }
            }
            _ => {}
        }
    }
    names
}

fn leading_identifier(text: &str) -> Option<&str> {
    let end = text
        .char_indices()
        .find(|(_, c)| !is_identifier(Some(*c)))
        .map_or(text.len(), |(index, _)| index);
    let name = &text[..end];
    let first = name.chars().next()?;
    (first.is_ascii_lowercase() || first == '_').then_some(name)
}

fn is_identifier(c: Option<char>) -> bool {
    c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The strongly connected components of more than one module (Tarjan),
/// each sorted.
fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    struct Tarjan<'g> {
        graph: &'g Graph,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        found: Vec<Vec<String>>,
    }

    impl<'g> Tarjan<'g> {
        fn visit(&mut self, module: &'g str) {
            let number = self.index.len();
            self.index.insert(module, number);
            self.low.insert(module, number);
            self.stack.push(module);
            self.on_stack.insert(module);
            let graph = self.graph;
            for dep in graph.get(module).into_iter().flatten() {
                let dep = dep.as_str();
                if !self.index.contains_key(dep) {
                    self.visit(dep);
                    let low = self.low[module].min(self.low[dep]);
                    self.low.insert(module, low);
                } else if self.on_stack.contains(dep) {
                    let low = self.low[module].min(self.index[dep]);
                    self.low.insert(module, low);
                }
            }
            if self.low[module] == self.index[module] {
                let mut component = Vec::new();
                while let Some(member) = self.stack.pop() {
                    self.on_stack.remove(member);
                    component.push(member.to_string());
                    if member == module {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }

    let mut tarjan = Tarjan {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for module in graph.keys() {
        if !tarjan.index.contains_key(module.as_str()) {
            tarjan.visit(module);
        }
    }
    tarjan.found
}

/// A cycle as `import_cycles.py` prints it: its modules, then each with the
/// members it imports.
fn describe(graph: &Graph, cycle: &[String]) -> String {
    let members: BTreeSet<&str> = cycle.iter().map(String::as_str).collect();
    let mut lines = vec![format!("cycle of {}: {}", cycle.len(), cycle.join(", "))];
    for module in cycle {
        let ups: Vec<&str> = graph[module]
            .iter()
            .map(String::as_str)
            .filter(|dep| members.contains(dep))
            .collect();
        lines.push(format!("  {module} -> {}", ups.join(", ")));
    }
    lines.join("\n")
}
