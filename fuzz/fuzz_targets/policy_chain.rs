//! Policy files that extend each other (`policy::load_from` with `policy::InMemory` sources:
//! relative `extends`, cycles, depth, missing files, built-ins, then the merge and validation
//! of `policy::load`, with no file I/O).
//!
//! Input: up to three texts separated by NUL bytes, the files `a.toml`, `sub/b.toml` and
//! `c.toml` (a missing text is a missing file); `a.toml` is loaded. From `a.toml`, `b` is
//! `sub/b.toml`; from `sub/b.toml`, `c` is `../c.toml` and `a` is `../a.toml`.
//!
//! Checked: no panic; a policy that loads can be shown, and what is shown loads again and
//! shows the same; an error names a file of the chain (or a built-in) at a line and column
//! inside that file's text.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use wfjail::policy::{self, BUILTINS, InMemory, Location, PolicyError, Sources};

const FILES: [&str; 3] = ["a.toml", "sub/b.toml", "c.toml"];

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut sources = InMemory::new();
    for (name, t) in FILES.iter().zip(text.splitn(FILES.len(), '\0')) {
        sources.insert(name, t);
    }
    match policy::load_from(FILES[0], &sources) {
        Ok(p) => {
            assert_eq!(p.name, FILES[0]);
            let shown = p.to_toml();
            let again = policy::from_source(FILES[0], &shown)
                .unwrap_or_else(|e| panic!("`policy show` output does not load: {e}\n{shown}"));
            assert_eq!(again.to_toml(), shown, "shown twice, shown differently");
        }
        Err(e) => {
            assert!(!e.to_string().is_empty());
            let at = match &e {
                PolicyError::Invalid { at, .. }
                | PolicyError::Cycle { at, .. }
                | PolicyError::TooDeep { at, .. } => at,
                other => panic!("a.toml exists and is a path: {other}"),
            };
            inside(at, &sources, &e);
        }
    }
});

/// Asserts that `at` names a file of `sources` or a built-in, at a line and column of its text.
fn inside(at: &Location, sources: &InMemory, e: &PolicyError) {
    let text = match at.file.strip_prefix("builtin:") {
        Some(name) => BUILTINS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, t)| t.to_string()),
        None => sources.read(Path::new(&at.file)).ok().map(|s| s.text),
    };
    let text = text.unwrap_or_else(|| panic!("{e}: names no file of the chain"));
    let lines: Vec<&str> = text.split('\n').collect();
    assert!(at.line >= 1 && at.line <= lines.len(), "{e}: no such line");
    let width = lines[at.line - 1].chars().count();
    assert!(
        at.column >= 1 && at.column <= width + 1,
        "{e}: no such column"
    );
}
