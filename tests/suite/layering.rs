//! The crate's layers (docs/architecture.md, "Layers"): a top-level module of `src/` imports
//! only modules of the layers below its own, so that no two modules import each other, in a
//! loop or directly. Read from the source: every `crate::<module>` a file names outside
//! comments, strings and `#[cfg(test)]` items (`super::` stays inside a module). A new module
//! is given its layer here and in the document.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Lowest first. A module may import the modules of the layers before its own.
const LAYERS: &[&[&str]] = &[
    &["procfs", "timing", "echo", "workflow_time"],
    &["sys"],
    &["guest_memory", "merging"],
    &["policy"],
    &["report"],
    &["protocol"],
    &["plan"],
    &["confine"],
    &["process"],
    &["answers"],
    &["notify"],
    &["supervise"],
    &["run"],
    &["serve", "learn", "check", "determinism", "cli"],
];

/// One `crate::<module>` of a file: which module, where.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Import {
    module: String,
    line: usize,
}

/// The source as code only: comments, the contents of string and character literals, and
/// `#[cfg(test)]` items blanked (newlines kept, so lines still count).
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = b.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in &mut out[from..to.min(b.len())] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    let mut i = 0;
    while i < b.len() {
        let rest = &b[i..];
        if rest.starts_with(b"//") {
            let end = rest
                .iter()
                .position(|&c| c == b'\n')
                .map_or(b.len(), |p| i + p);
            blank(&mut out, i, end);
            i = end;
        } else if rest.starts_with(b"/*") {
            let (mut depth, mut j) = (0usize, i);
            while j < b.len() {
                if b[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if b[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if (rest.starts_with(b"r\"") || rest.starts_with(b"r#") || rest.starts_with(b"br"))
            && (i == 0 || !is_ident(b[i - 1]))
        {
            // A raw string: r"..", r#".."#, br"..".
            let start = i + rest.iter().position(|&c| c == b'r').unwrap() + 1;
            let hashes = b[start..].iter().take_while(|&&c| c == b'#').count();
            if b.get(start + hashes) != Some(&b'"') {
                i += 1;
                continue;
            }
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            let body = start + hashes + 1;
            let end = b[body..]
                .windows(close.len())
                .position(|w| w == close.as_slice())
                .map_or(b.len(), |p| body + p + close.len());
            blank(&mut out, body, end - close.len());
            i = end;
        } else if b[i] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            blank(&mut out, i + 1, j);
            i = j + 1;
        } else if b[i] == b'\'' {
            // A character literal ('x', '\n', '\u{..}'), not a lifetime ('a).
            let end = if rest.get(1) == Some(&b'\\') {
                rest.iter()
                    .skip(2)
                    .position(|&c| c == b'\'')
                    .map(|p| i + 2 + p)
            } else {
                let ch = src[i + 1..].chars().next().map_or(1, char::len_utf8);
                (rest.get(1 + ch) == Some(&b'\'')).then_some(i + 1 + ch)
            };
            match end {
                Some(end) => {
                    blank(&mut out, i + 1, end);
                    i = end + 1;
                }
                None => i += 1,
            }
        } else {
            i += 1;
        }
    }
    let mut code = String::from_utf8(out).expect("blanking keeps UTF-8 at ASCII boundaries");
    while let Some(at) = code.find("#[cfg(test)]") {
        let b = code.as_bytes();
        let mut j = at;
        let mut depth = 0usize;
        while j < b.len() {
            match b[j] {
                b';' if depth == 0 => break,
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
            j += 1;
        }
        let blanked: String = code[at..=j.min(b.len() - 1)]
            .chars()
            .map(|c| if c == '\n' { '\n' } else { ' ' })
            .collect();
        code.replace_range(at..=j.min(b.len() - 1), &blanked);
    }
    code
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The modules a file's code names as `crate::<module>` (or `$crate::`), a `use crate::{..}`
/// group giving the first name of each of its paths.
fn imports(src: &str) -> Vec<Import> {
    let code = code_only(src);
    let b = code.as_bytes();
    let line_of = |at: usize| 1 + b[..at].iter().filter(|&&c| c == b'\n').count();
    let mut found = vec![];
    let mut from = 0;
    while let Some(p) = code[from..].find("crate::") {
        let at = from + p;
        from = at + "crate::".len();
        if at > 0 && is_ident(b[at - 1]) {
            continue;
        }
        let rest = &code[from..];
        if let Some(group) = rest.strip_prefix('{') {
            // Each path at the group's top level: its first name.
            let (mut depth, mut start) = (0usize, true);
            for (k, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if start && (c.is_alphanumeric() || c == '_') => {
                        let name: String = group[k..]
                            .chars()
                            .take_while(|c| c.is_alphanumeric() || *c == '_')
                            .collect();
                        found.push(Import {
                            module: name,
                            line: line_of(from + 1 + k),
                        });
                        start = false;
                    }
                    _ => {}
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            found.push(Import {
                module: name,
                line: line_of(at),
            });
        }
    }
    found
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The top-level modules `src/lib.rs` declares.
fn modules() -> Vec<String> {
    let lib = std::fs::read_to_string(src_dir().join("lib.rs")).unwrap();
    lib.lines()
        .filter_map(|l| {
            l.trim()
                .strip_prefix("pub mod ")?
                .strip_suffix(';')
                .map(str::to_string)
        })
        .collect()
}

fn rust_files(dir: &Path, into: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            into.push(path);
        }
    }
}

/// Every import of one top-level module by another: (importer, imported) → where, as
/// `src/..:line`.
fn graph() -> BTreeMap<(String, String), Vec<String>> {
    let modules = modules();
    let mut files = vec![];
    rust_files(&src_dir(), &mut files);
    files.sort();
    let mut edges: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(src_dir()).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_str()
            .unwrap();
        let owner = first.strip_suffix(".rs").unwrap_or(first);
        if !modules.iter().any(|m| m == owner) {
            continue; // lib.rs declares the modules, main.rs is the binary above them all
        }
        for import in imports(&std::fs::read_to_string(&file).unwrap()) {
            if import.module != owner && modules.contains(&import.module) {
                edges
                    .entry((owner.to_string(), import.module))
                    .or_default()
                    .push(format!("src/{}:{}", rel.display(), import.line));
            }
        }
    }
    edges
}

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

#[test]
fn every_module_of_the_crate_has_a_layer() {
    let modules = modules();
    let missing: Vec<_> = modules.iter().filter(|m| layer_of(m).is_none()).collect();
    assert!(
        missing.is_empty(),
        "src/lib.rs declares {missing:?}, which LAYERS (tests/suite/layering.rs) and docs/architecture.md do not place"
    );
    let gone: Vec<_> = LAYERS
        .iter()
        .flat_map(|l| l.iter())
        .filter(|m| !modules.iter().any(|n| n == *m))
        .collect();
    assert!(
        gone.is_empty(),
        "LAYERS names {gone:?}, which src/lib.rs does not declare"
    );
}

#[test]
fn no_module_imports_its_own_layer_or_one_above() {
    let mut wrong = vec![];
    for ((from, to), at) in graph() {
        let (Some(lf), Some(lt)) = (layer_of(&from), layer_of(&to)) else {
            continue;
        };
        if lt >= lf {
            for place in at {
                wrong.push(format!(
                    "{place}: {from} (layer {lf}) imports {to} (layer {lt})"
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the layers (lower never imports higher):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn no_import_cycle() {
    let edges = graph();
    let mut cycles = vec![];
    // A cycle through each edge a → b: a path from b back to a (breadth first, shortest).
    for (a, b) in edges.keys() {
        let mut back: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([b.as_str()]);
        back.insert(b, a);
        while let Some(m) = queue.pop_front() {
            if m == a {
                break;
            }
            for (x, y) in edges.keys().filter(|(x, _)| x == m) {
                if !back.contains_key(y.as_str()) {
                    back.insert(y, x);
                    queue.push_back(y);
                }
            }
        }
        if a != b && back.contains_key(a.as_str()) {
            let mut path = vec![a.as_str()];
            let mut m = a.as_str();
            while m != b {
                m = back[m];
                path.push(m);
            }
            path.push(a);
            path.reverse();
            let hops: Vec<_> = path
                .windows(2)
                .map(|w| {
                    format!(
                        "{} → {} ({})",
                        w[0],
                        w[1],
                        edges[&(w[0].to_string(), w[1].to_string())][0]
                    )
                })
                .collect();
            let text = hops.join(", ");
            if !cycles.contains(&text) && path[0] == path.iter().min().copied().unwrap() {
                cycles.push(text);
            }
        }
    }
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

#[test]
fn a_use_group_names_the_first_module_of_each_path_on_its_line() {
    let src =
        "use crate::{\n    policy::X,\n    report::{Y, Z},\n};\nfn f() { crate::sys::g(); }\n";
    let names: Vec<_> = imports(src)
        .into_iter()
        .map(|i| (i.module, i.line))
        .collect();
    assert_eq!(
        names,
        [
            ("policy".into(), 2),
            ("report".into(), 3),
            ("sys".into(), 5)
        ]
    );
}

#[test]
fn comments_strings_and_test_items_import_nothing() {
    let src = "/// see [`crate::serve`]\n// crate::run\nconst S: &str = \"crate::cli\";\nconst R: &str = r#\"crate::learn\"#;\nconst C: char = '{';\n#[cfg(test)]\nmod tests {\n    use crate::check;\n    fn f() { let _ = \"}\"; }\n}\n#[cfg(test)]\nuse crate::determinism;\nfn g<'a>(_: &'a str) { crate::sys::h(); }\n";
    let names: Vec<_> = imports(src)
        .into_iter()
        .map(|i| (i.module, i.line))
        .collect();
    assert_eq!(names, [("sys".into(), 13)]);
}
