//! Names of spaces: NBD export names, and `NAME@POOL`.
//!
//! A space's export name is fixed when it is created and stored with it
//! (a space of an older pool gets one at the import that first reads it:
//! its name, or `POOL/SPACE` if another open pool has that name), so the
//! name a client opens never changes meaning under it. A new space whose
//! export name any open pool's space has is refused. A pool imported with
//! a space whose export name an open pool's space has already does not
//! take the name over: the space of the pool opened first keeps it, and
//! the other is served only under its alias `POOL/SPACE`, which every
//! space has and which never changes meaning either (names have no `/`).
//!
//! Commands name a space `NAME`, or `NAME@POOL` (or `NAME --pool POOL`)
//! when two pools have a space of that name.

use std::collections::BTreeMap;
use std::sync::Arc;

use terrace_engine::Space;

use super::registry::Registry;

/// A space as the NBD server sees it.
pub struct Export {
    pub pool: String,
    pub space: Arc<Space>,
    /// Its export name.
    pub name: String,
    /// The (pool, space) that serves `name`, when it is not this space.
    pub served_by: Option<(String, String)>,
}

impl Export {
    /// The name clients open it by: its export name, or its alias when
    /// another space serves that.
    pub fn served_name(&self) -> String {
        match self.served_by {
            None => self.name.clone(),
            Some(_) => alias(&self.pool, self.space.name()),
        }
    }

    /// Why its export name is not served, and how clients reach it.
    pub fn not_served(&self) -> Option<String> {
        let (pool, space) = self.served_by.as_ref()?;
        Some(format!(
            "export {} is not served for this space: space {space} of pool {pool}, open \
             before this pool was imported, has that export name and keeps it; clients \
             reach this space as {}",
            self.name,
            self.served_name()
        ))
    }
}

/// The alias `POOL/SPACE` every space has.
pub fn alias(pool: &str, space: &str) -> String {
    format!("{pool}/{space}")
}

/// Every space of every open pool, pools in the order they were opened;
/// each export name is served for the first space that has it.
pub fn exports(registry: &Registry) -> Vec<Export> {
    let mut claimed: BTreeMap<String, (String, String)> = BTreeMap::new();
    let mut all = Vec::new();
    for entry in registry.all() {
        let pool = entry.pool.name().to_string();
        for space in entry.pool.spaces() {
            let name = space
                .export_name()
                .map_or_else(|| alias(&pool, space.name()), str::to_string);
            let served_by = match claimed.get(&name) {
                Some(first) => Some(first.clone()),
                None => {
                    claimed.insert(name.clone(), (pool.clone(), space.name().to_string()));
                    None
                }
            };
            all.push(Export {
                pool: pool.clone(),
                space,
                name,
                served_by,
            });
        }
    }
    all
}

/// The (pool, space) that has export name `name`, served or not.
pub fn holder_of(registry: &Registry, name: &str) -> Option<(String, String)> {
    exports(registry)
        .into_iter()
        .find(|export| export.name == name)
        .map(|export| (export.pool, export.space.name().to_string()))
}

/// Every export name open pools' spaces have (for an import to keep
/// clear of).
pub fn export_names(registry: &Registry) -> Vec<String> {
    exports(registry)
        .into_iter()
        .map(|export| export.name)
        .collect()
}

/// A space named `NAME` or `NAME@POOL`, with `--pool` perhaps given too:
/// the pool (if named) and the space's name.
pub fn parse_space_name(
    name: &str,
    pool: Option<&str>,
) -> Result<(Option<String>, String), String> {
    let Some((space, named_pool)) = name.split_once('@') else {
        return Ok((pool.map(str::to_string), name.to_string()));
    };
    if space.is_empty() || named_pool.is_empty() {
        return Err(format!(
            "{name:?}: name a space NAME or NAME@POOL, as in vm or vm@tank"
        ));
    }
    match pool {
        Some(pool) if pool != named_pool => Err(format!(
            "{name:?} names pool {named_pool}, --pool names {pool}: give one"
        )),
        _ => Ok((Some(named_pool.to_string()), space.to_string())),
    }
}

/// The refusal for a space name that several pools have.
pub fn ambiguous(name: &str, pools: &[String]) -> String {
    let options: Vec<String> = pools.iter().map(|pool| format!("{name}@{pool}")).collect();
    format!(
        "space {name} is in pools {}: use {}",
        joined(pools, "and"),
        joined(&options, "or")
    )
}

/// "a", "a and b", "a, b and c".
fn joined(items: &[String], conjunction: &str) -> String {
    match items.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, first)) => format!("{} {conjunction} {last}", first.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_space_is_named_alone_at_a_pool_or_with_the_pool_option() {
        assert_eq!(parse_space_name("vm", None), Ok((None, "vm".into())));
        assert_eq!(
            parse_space_name("vm", Some("tank")),
            Ok((Some("tank".into()), "vm".into()))
        );
        assert_eq!(
            parse_space_name("vm@tank", None),
            Ok((Some("tank".into()), "vm".into()))
        );
        assert_eq!(
            parse_space_name("vm@tank", Some("tank")),
            Ok((Some("tank".into()), "vm".into()))
        );
        assert!(parse_space_name("vm@tank", Some("other")).is_err());
        assert!(parse_space_name("@tank", None).is_err());
        assert!(parse_space_name("vm@", None).is_err());
    }

    #[test]
    fn an_ambiguous_name_lists_every_way_to_say_it() {
        assert_eq!(
            ambiguous("m2", &["a".into(), "b".into()]),
            "space m2 is in pools a and b: use m2@a or m2@b"
        );
        assert_eq!(
            ambiguous("m2", &["a".into(), "b".into(), "c".into()]),
            "space m2 is in pools a, b and c: use m2@a, m2@b or m2@c"
        );
    }
}
