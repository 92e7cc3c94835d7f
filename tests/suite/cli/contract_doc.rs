//! The contract stays inside the repository and matches the code: no file cites a contract
//! outside the repository, `docs/contract.md` lists every status of `report::Status` with its
//! exit code, and `Status::ALL` lists every variant of the enum. No process is spawned.

use std::path::{Path, PathBuf};
use std::process::Command;

use wfjail::report::Status;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The repository's files: tracked and untracked ones, without what `.gitignore` excludes
/// (`target/`, `__pycache__/`). Without git (a source tarball), every file outside `target/`,
/// `.git/` and `__pycache__/`.
fn repository_files() -> Vec<PathBuf> {
    let git = Command::new("git")
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ])
        .current_dir(root())
        .output();
    match git {
        Ok(out) if out.status.success() => out
            .stdout
            .split(|&b| b == 0)
            .filter(|p| !p.is_empty())
            .map(|p| root().join(String::from_utf8_lossy(p).as_ref()))
            .collect(),
        _ => {
            let mut files = Vec::new();
            walk(root(), &mut files);
            files
        }
    }
}

fn walk(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let entry = entry.unwrap();
        let path = entry.path();
        let name = entry.file_name();
        let kind = entry.file_type().unwrap();
        if kind.is_dir() {
            if !["target", ".git", "__pycache__"].contains(&name.to_str().unwrap_or("")) {
                walk(&path, files);
            }
        } else if kind.is_file() {
            files.push(path);
        }
    }
}

#[test]
fn no_file_cites_a_contract_outside_the_repository() {
    // Spelt in pieces so that this file does not match itself.
    let needles = [concat!("PRODUCT", ".md"), concat!("..", "/shared/")];
    let files = repository_files();
    assert!(
        files.iter().any(|f| f.ends_with("docs/contract.md")),
        "docs/contract.md is not among the repository's files: {} files listed",
        files.len()
    );
    let mut hits = Vec::new();
    for file in &files {
        if file
            .strip_prefix(root())
            .is_ok_and(|p| p.starts_with("target"))
        {
            continue;
        }
        let bytes = match std::fs::read(file) {
            Ok(b) => b,
            // Deleted in the work tree but still in the index.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => panic!("{}: {e}", file.display()),
        };
        for needle in needles {
            if bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                hits.push(format!("{}: {needle}", file.display()));
            }
        }
    }
    assert!(
        hits.is_empty(),
        "these files cite a contract outside the repository; cite docs/ instead \
         (docs/contract.md, docs/security.md...):\n{}",
        hits.join("\n")
    );
}

/// The rows of the table under `## Statuses and exit codes`, as (status, exit status cell).
fn contract_status_rows() -> Vec<(String, String)> {
    let path = root().join("docs/contract.md");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let section = text
        .split("\n## ")
        .find(|s| s.starts_with("Statuses and exit codes\n"))
        .expect("docs/contract.md has a section \"## Statuses and exit codes\"");
    section
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            // "| `ok` | 0 | when |" splits into ["", "`ok`", "0", "when", ""].
            let name = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            Some((name.to_string(), cells.get(2)?.to_string()))
        })
        .collect()
}

#[test]
fn every_status_and_its_exit_code_is_in_the_contract() {
    let rows = contract_status_rows();
    for status in Status::ALL {
        let name = status.as_str();
        // The report spells the status the way as_str does.
        assert_eq!(
            serde_json::to_string(&status).unwrap(),
            format!("\"{name}\""),
            "{status:?}"
        );
        let (_, codes) = rows
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("docs/contract.md: no row for status `{name}` in {rows:?}"));
        let code = status.exit_code().to_string();
        assert!(
            codes
                .split(|c: char| !c.is_ascii_digit())
                .any(|n| n == code),
            "docs/contract.md: status `{name}` exits {code}, but its row says {codes:?}"
        );
    }
    let known: Vec<&str> = Status::ALL.iter().map(|s| s.as_str()).collect();
    for (name, _) in &rows {
        assert!(
            known.contains(&name.as_str()),
            "docs/contract.md lists status `{name}`, which report::Status does not have"
        );
    }
    assert_eq!(
        rows.len(),
        Status::ALL.len(),
        "one row per status: {rows:?}"
    );
}

#[test]
fn status_all_lists_every_variant() {
    let path = root().join("src/report.rs");
    let source = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let body = source
        .split("pub enum Status {")
        .nth(1)
        .and_then(|rest| rest.split('}').next())
        .expect("src/report.rs declares `pub enum Status { ... }`");
    let variants: Vec<&str> = body
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("//") && !l.starts_with("#["))
        .map(|l| l.trim_end_matches(','))
        .collect();
    let all: Vec<String> = Status::ALL.iter().map(|s| format!("{s:?}")).collect();
    assert_eq!(
        variants, all,
        "Status::ALL must list every variant of report::Status, in declaration order"
    );
}
