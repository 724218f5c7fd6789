//! `scripts/install` with the tests' binary: every file lands where the
//! system looks for it, and each is sane (the unit verifies, the man pages
//! render without warnings, the completions complete).

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

fn install_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/install")
}

/// Run `scripts/install --binary <the tests' binary>` with `args`.
#[track_caller]
fn install(args: &[&str]) -> Run {
    run_ok(
        Command::new("bash")
            .arg(install_script())
            .args(["--binary", TERRACE])
            .args(args),
    )
}

#[track_caller]
fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// What the bash completion in `script` offers for `terrace WORD`.
fn bash_completes(script: &Path, word: &str) -> String {
    let line = format!(
        "source {} && COMP_WORDS=(terrace {word}) && COMP_CWORD=1 && COMP_LINE='terrace {word}' \
         && COMP_POINT=${{#COMP_LINE}} && _terrace terrace {word} terrace \
         && printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        script.display()
    );
    let completed = run_ok(Command::new("bash").args(["-c", &line]));
    completed.stdout.trim().to_string()
}

#[test]
fn install_puts_binary_unit_man_pages_and_completions_in_place() {
    let temp = tempfile::tempdir().expect("temp dir");
    let prefix = temp.path().join("usr");
    install(&["--prefix", prefix.to_str().expect("UTF-8 path")]);

    let binary = prefix.join("bin/terrace");
    let mode = std::fs::metadata(&binary)
        .expect("bin/terrace installed")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755, "bin/terrace mode {mode:o}");
    run_ok(Command::new(&binary).arg("--version"));

    let unit = prefix.join("lib/systemd/system/terrace.service");
    let text = read(&unit);
    let exec = format!("ExecStart={} daemon", binary.display());
    assert!(text.contains(&exec), "no `{exec}` in the unit:\n{text}");
    assert!(text.contains("Type=notify"), "{text}");
    // The unit's Documentation= names man pages: found where they were installed.
    let verify = run(command("systemd-analyze")
        .arg("verify")
        .arg(&unit)
        .env("MANPATH", prefix.join("share/man")));
    assert!(
        verify.success() && verify.stderr.trim().is_empty(),
        "systemd-analyze verify is not clean\n{}",
        verify.describe()
    );

    let man = prefix.join("share/man/man1");
    for page in [
        "terrace.1",
        "terrace-pool.1",
        "terrace-pool-create.1",
        "terrace-daemon.1",
    ] {
        let rendered = run(command("man")
            .args(["-l", "--warnings", "-Tutf8"])
            .arg(man.join(page))
            .env("MANWIDTH", "80"));
        assert!(
            rendered.success() && rendered.stderr.trim().is_empty(),
            "{page} does not render cleanly\n{}",
            rendered.describe()
        );
        let title = page.trim_end_matches(".1");
        assert!(
            rendered.stdout.contains(title),
            "{page} does not name {title}"
        );
    }
    assert!(
        !man.join("terrace-generate.1").exists(),
        "the hidden generate command got a man page"
    );

    let bash = prefix.join("share/bash-completion/completions/terrace");
    assert_eq!(bash_completes(&bash, "po"), "pool");
    // The hidden command is not offered.
    assert_eq!(bash_completes(&bash, "ge"), "");

    let zsh = read(&prefix.join("share/zsh/site-functions/_terrace"));
    assert!(zsh.starts_with("#compdef terrace"), "{}", tail(&zsh, 5));
}

#[test]
fn install_into_a_root_keeps_the_prefix_for_the_unit() {
    let temp = tempfile::tempdir().expect("temp dir");
    let root = temp.path().join("root");
    install(&["--root", root.to_str().expect("UTF-8 path")]);

    let prefix = root.join("usr/local");
    assert!(prefix.join("bin/terrace").is_file());
    let text = read(&prefix.join("lib/systemd/system/terrace.service"));
    assert!(
        text.contains("ExecStart=/usr/local/bin/terrace daemon"),
        "{text}"
    );
    for file in [
        "share/man/man1/terrace-space-create.1",
        "share/bash-completion/completions/terrace",
        "share/zsh/site-functions/_terrace",
    ] {
        assert!(prefix.join(file).is_file(), "{file} not installed");
    }
}
