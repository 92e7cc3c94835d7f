//! The escape catalogue (issue 7, "What to build" 2): every route a hostile guest might take
//! out of the sandbox, one confined `wfjail run` each, asserting the exact refusal the guest
//! sees AND the report entry the supervisor writes.
//!
//! The attempts are data: tests/escapes/catalogue.toml (one row each; the format is described
//! at its top). C attempts run tests/escapes/attempt.c, compiled once per test run with `cc`;
//! Python attempts run tests/escapes/attempt.py, raw (`--raw`) or framed
//! (tests/escapes/framed_guest.py). One test function per route group; each collects every
//! mismatch of its group before failing, and prints each row's id, what was expected and what
//! happened. The outcome of every row is also written to
//! `$CARGO_TARGET_TMPDIR/escapes/<group>.json` for docs/security.md to quote.
//!
//! Every row must pass, except rows marked `open`: limits left open on purpose
//! (docs/security.md says why), which keep the secure expectation. Their mismatch is printed
//! and does not fail; such a row fails once it passes, so that the mark and the docs follow.
//!
//! Run: `nice cargo test --test suite -- run::escapes`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Condvar, Mutex, OnceLock};

use serde::Deserialize;
use serde_json::{Value, json};

use crate::common::{Outcome, PY, Scratch, run_reported, wfjail_bin};

/// At most this many confined runs at once, across all test functions.
const PARALLEL: usize = 4;
/// Wall-clock limit of each attempt (a row that hangs fails on its own, not the suite).
const TIMEOUT: &str = "10s";

const CATALOGUE: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/escapes/catalogue.toml"
));

fn escapes_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/escapes")
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Catalogue {
    attempt: Vec<Row>,
}

/// One escape attempt. See the top of catalogue.toml.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Row {
    id: String,
    /// The route group (one test function each).
    group: String,
    /// The denied category the attempt belongs to (the report's category when it is reported).
    category: String,
    policy: String,
    #[serde(default = "raw")]
    mode: String,
    /// `NAME ARGS...` of attempt.c (`sys NAME|NR ARGS...` is a raw syscall).
    c: Option<String>,
    /// The body of a Python function (attempt.py).
    py: Option<String>,
    /// The refusal: an errno name, another result token, or a signal name (`SIGKILL`).
    expect: String,
    /// `CATEGORY SYSCALL` of the expected violation, or `none`.
    report: String,
    /// A piece of the violation's decoded arguments.
    args: Option<String>,
    /// Something the decoded arguments must not say.
    args_not: Option<String>,
    /// The violation's action (default `denied`).
    action: Option<String>,
    /// The report's status (default `violation` with a report entry, `ok` without).
    status: Option<String>,
    /// Why the row expects what it does (required with `report = "none"`).
    note: Option<String>,
    /// A known limit that stays open (docs/security.md says why). The row keeps the secure
    /// expectation; its mismatch is printed and does not fail, but a row that starts to pass
    /// fails until the mark (and the docs) are updated.
    open: Option<String>,
}

fn raw() -> String {
    "raw".into()
}

fn catalogue() -> &'static [Row] {
    static ROWS: OnceLock<Vec<Row>> = OnceLock::new();
    ROWS.get_or_init(|| {
        toml::from_str::<Catalogue>(CATALOGUE)
            .unwrap_or_else(|e| panic!("tests/escapes/catalogue.toml: {e}"))
            .attempt
    })
}

/// A counting semaphore over all test threads.
struct Slots {
    free: Mutex<usize>,
    cv: Condvar,
}

fn slots() -> &'static Slots {
    static S: OnceLock<Slots> = OnceLock::new();
    S.get_or_init(|| Slots {
        free: Mutex::new(PARALLEL),
        cv: Condvar::new(),
    })
}

fn with_slot<T>(f: impl FnOnce() -> T) -> T {
    let s = slots();
    {
        let mut free = s.free.lock().unwrap();
        while *free == 0 {
            free = s.cv.wait(free).unwrap();
        }
        *free -= 1;
    }
    let out = f();
    *s.free.lock().unwrap() += 1;
    s.cv.notify_one();
    out
}

/// The attempt program, compiled once per test run into the target's temp dir (kept there,
/// not in /tmp): `<dir>/bin/attempt`, statically, so that `strict`, which reads
/// `${exe_dir}/..`, needs nothing else ([`crate::common::cc_static`]).
fn helper() -> &'static Path {
    static HELPER: OnceLock<PathBuf> = OnceLock::new();
    HELPER.get_or_init(|| {
        let src = escapes_dir().join("attempt.c");
        crate::common::cc_static("escapes-bin", "attempt", &src, &["-pthread"])
    })
}

/// The directories one attempt plays with.
struct Dirs {
    scratch: Scratch,
}

impl Dirs {
    /// `rw/` (granted read-write), `ro/` (granted read-only, with `sub/`), `out/` (no grant),
    /// each with a file `f.txt` (`out/secret.txt`).
    fn new(id: &str) -> Dirs {
        let scratch = Scratch::new(&format!("esc-{id}"));
        for d in ["rw", "ro/sub", "out"] {
            std::fs::create_dir_all(scratch.path(d)).unwrap();
        }
        scratch.write("rw/f.txt", "rw\n");
        scratch.write("ro/f.txt", "ro\n");
        scratch.write("out/secret.txt", "secret\n");
        Dirs { scratch }
    }

    fn expand(&self, s: &str) -> String {
        let p = |n: &str| self.scratch.path(n).to_str().unwrap().to_string();
        s.replace("{rw}", &p("rw"))
            .replace("{ro}", &p("ro"))
            .replace("{out}", &p("out"))
            .replace("{test_pid}", &std::process::id().to_string())
    }
}

/// `sys NAME ...`: the syscall's number from wfjail's own table, so that rows name syscalls.
fn c_argv(spec: &str) -> Vec<String> {
    let mut argv: Vec<String> = spec.split_whitespace().map(str::to_string).collect();
    if argv.first().map(String::as_str) == Some("sys")
        && let Some(name) = argv.get(1)
        && name.parse::<i64>().is_err()
    {
        let nr = wfjail::policy::syscalls::number(name)
            .unwrap_or_else(|| panic!("unknown syscall {name} in `{spec}`"));
        argv[1] = nr.to_string();
    }
    argv
}

fn policy_arg(policy: &str) -> String {
    if policy.ends_with(".toml") {
        escapes_dir()
            .join("policies")
            .join(policy)
            .to_str()
            .unwrap()
            .to_string()
    } else {
        policy.to_string()
    }
}

/// Runs one attempt under its policy and mode, and compares: (what happened, mismatches).
fn run_row(row: &Row) -> (Value, Vec<String>) {
    let dirs = Dirs::new(&row.id);
    let report = dirs.scratch.path("report.json");
    let mut args: Vec<String> = vec![
        "run".into(),
        "-p".into(),
        policy_arg(&row.policy),
        "--timeout".into(),
        TIMEOUT.into(),
        "--rw".into(),
        dirs.expand("{rw}"),
        "--ro".into(),
        dirs.expand("{ro}"),
    ];
    let framed = row.mode == "framed";
    if let Some(c) = &row.c {
        let bin = helper();
        args.extend([
            "--ro".into(),
            bin.parent().unwrap().to_str().unwrap().into(),
        ]);
        args.extend(["--raw".into(), "--".into(), bin.to_str().unwrap().into()]);
        args.extend(c_argv(&dirs.expand(c)));
    } else {
        let src = dirs.expand(row.py.as_deref().unwrap_or(""));
        let here = escapes_dir();
        args.extend(["--ro".into(), here.to_str().unwrap().into()]);
        if framed {
            let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("python");
            let input = dirs.scratch.write("request.txt", &src);
            args.extend(["--ro".into(), python.to_str().unwrap().into()]);
            args.extend(["--input".into(), input.to_str().unwrap().into()]);
            args.extend(["--".into(), PY.into()]);
            args.push(here.join("framed_guest.py").to_str().unwrap().into());
        } else {
            let boot = format!(
                "import sys; sys.path.insert(0, {:?}); import attempt; attempt.main()",
                here.to_str().unwrap()
            );
            args.extend([
                "--raw".into(),
                "--".into(),
                PY.into(),
                "-c".into(),
                boot,
                src,
            ]);
        }
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = with_slot(|| run_reported(Command::new(wfjail_bin()), &args, &report));
    (got(&o), mismatches(row, |a| dirs.expand(a), &o))
}

/// The `result=` token of the attempt (raw: its stdout; framed: the RESULT frame).
fn token(o: &Outcome) -> Option<&str> {
    o.stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("result="))
}

fn exit_for(status: &str) -> i32 {
    match status {
        "ok" => 0,
        "guest_error" => 1,
        "violation" => 3,
        "timeout" => 4,
        "limit" => 5,
        "crashed" => 6,
        _ => 125,
    }
}

/// What happened, in the catalogue's terms (for mismatch messages and the results file).
fn got(o: &Outcome) -> Value {
    let violations: Vec<String> = o.report["violations"]
        .as_array()
        .map(|l| {
            l.iter()
                .map(|v| {
                    format!(
                        "{} {}({}) {}",
                        v["category"].as_str().unwrap_or("?"),
                        v["syscall"].as_str().unwrap_or("?"),
                        v["args"].as_str().unwrap_or(""),
                        v["action"].as_str().unwrap_or("?")
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let tail = o.stderr.chars().rev().take(400).collect::<String>();
    json!({
        "result": token(o).map_or_else(|| o.report["signal"].clone(), |t| json!(t)),
        "status": o.status(),
        "exit": o.code,
        "violations": violations,
        "stderr_tail": tail.chars().rev().collect::<String>(),
    })
}

/// Every way `o` differs from what `row` expects (empty: the row passes).
fn mismatches(row: &Row, dirs_expand: impl Fn(&str) -> String, o: &Outcome) -> Vec<String> {
    let mut bad = Vec::new();
    if o.report.is_null() {
        bad.push("no report was written".to_string());
        return bad;
    }
    // The refusal the guest saw.
    if row.expect.starts_with("SIG") {
        if o.report["signal"] != row.expect.as_str() {
            bad.push(format!(
                "expected the guest killed by {}, got signal {} (result {:?})",
                row.expect,
                o.report["signal"],
                token(o)
            ));
        }
    } else if token(o) != Some(row.expect.as_str()) {
        bad.push(format!(
            "expected result {}, got {:?}",
            row.expect,
            token(o)
        ));
    }
    // The report entry.
    let list = o.report["violations"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let default_status = if row.report == "none" {
        "ok"
    } else {
        "violation"
    };
    let status = row.status.as_deref().unwrap_or(default_status);
    if o.status() != status {
        bad.push(format!("expected status {status}, got {}", o.status()));
    }
    if o.code != exit_for(status) {
        bad.push(format!(
            "expected wfjail exit {}, got {}",
            exit_for(status),
            o.code
        ));
    }
    if row.report == "none" {
        if !list.is_empty() {
            bad.push(format!("expected no violation, got {} listed", list.len()));
        }
        return bad;
    }
    let (category, syscall) = row.report.split_once(' ').unwrap();
    // The entry of this syscall and category whose arguments the row names (an attempt may
    // make related denied calls first, e.g. FS_IOC_GETFLAGS before FS_IOC_SETFLAGS).
    let same = |v: &&Value| v["syscall"] == syscall && v["category"] == category;
    let named = |v: &&Value| {
        row.args.as_ref().is_none_or(|a| {
            v["args"]
                .as_str()
                .is_some_and(|s| s.contains(&dirs_expand(a)))
        })
    };
    let Some(v) = list
        .iter()
        .find(|v| same(v) && named(v))
        .or_else(|| list.iter().find(same))
    else {
        bad.push(format!("expected a violation `{category} {syscall}`"));
        return bad;
    };
    let action = row.action.as_deref().unwrap_or("denied");
    if v["action"] != action {
        bad.push(format!("expected action {action}, got {}", v["action"]));
    }
    let vargs = v["args"].as_str().unwrap_or("");
    if let Some(a) = &row.args
        && !vargs.contains(&dirs_expand(a))
    {
        bad.push(format!("expected args containing {a:?}, got {vargs:?}"));
    }
    if let Some(a) = &row.args_not
        && vargs.contains(a.as_str())
    {
        bad.push(format!("expected args without {a:?}, got {vargs:?}"));
    }
    for field in ["hint", "rule"] {
        if v[field].as_str().unwrap_or("").is_empty() {
            bad.push(format!("the violation has no {field}"));
        }
    }
    bad
}

/// Runs every row of `group` (in parallel, bounded), writes the results file, and fails with
/// every mismatch listed.
fn run_group(group: &str) {
    let rows: Vec<&Row> = catalogue().iter().filter(|r| r.group == group).collect();
    assert!(!rows.is_empty(), "no rows in group {group}");
    let results: Vec<(&Row, Value, Vec<String>)> = std::thread::scope(|s| {
        let handles: Vec<_> = rows
            .iter()
            .map(|&row| {
                s.spawn(move || {
                    let (got, bad) = run_row(row);
                    (row, got, bad)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut failures = Vec::new();
    let mut known = Vec::new();
    let mut out = Vec::new();
    for (row, got, bad) in &results {
        out.push(json!({
            "id": row.id, "group": row.group, "category": row.category, "policy": row.policy,
            "mode": row.mode, "expect": row.expect, "report": row.report,
            "open": row.open,
            "pass": bad.is_empty(), "got": got, "mismatches": bad,
        }));
        if bad.is_empty() {
            if let Some(why) = &row.open {
                failures.push(format!(
                    "{} is marked open ({why}) but passes now: drop the mark and update docs/security.md",
                    row.id
                ));
            }
            continue;
        }
        let mark = row
            .open
            .as_ref()
            .map_or_else(String::new, |f| format!(" [open: {f}]"));
        let text = format!(
            "{}{mark}\n    policy {} {} {}\n    expected: {} / report {}\n    {}\n    got: {}",
            row.id,
            row.policy,
            row.mode,
            row.c.as_deref().map_or_else(
                || format!("py {:?}", row.py.as_deref().unwrap_or("")),
                |c| { format!("c `{c}`") }
            ),
            row.expect,
            row.report,
            bad.join("\n    "),
            got
        );
        if row.open.is_some() {
            known.push(text);
        } else {
            failures.push(text);
        }
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("escapes");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join(format!("{group}.json")),
        serde_json::to_string_pretty(&out).unwrap(),
    )
    .unwrap();
    let passed = results.iter().filter(|r| r.2.is_empty()).count();
    eprintln!("escapes/{group}: {passed}/{} rows pass", results.len());
    for k in &known {
        eprintln!("open (known limit, see docs/security.md): {k}");
    }
    assert!(
        failures.is_empty(),
        "{} of {} escape attempts in group {group} did not end as the catalogue says:\n\n{}",
        failures.len(),
        results.len(),
        failures.join("\n\n")
    );
}

const GROUPS: &[&str] = &[
    "network",
    "process",
    "exec",
    "memory",
    "privilege",
    "other",
    "abi",
    "signals",
    "filesystem",
    "grants",
    "time_random",
    "limits",
    "python",
];

#[test]
fn catalogue_is_complete_and_well_formed() {
    let rows = catalogue();
    assert!(rows.len() >= 120, "only {} attempts", rows.len());
    let mut ids = BTreeSet::new();
    let mut per_category: BTreeMap<&str, usize> = BTreeMap::new();
    for r in rows {
        assert!(ids.insert(&r.id), "duplicate id {}", r.id);
        assert!(
            GROUPS.contains(&r.group.as_str()),
            "{}: group {}",
            r.id,
            r.group
        );
        assert!(
            r.c.is_some() != r.py.is_some(),
            "{}: exactly one of c and py",
            r.id
        );
        assert!(
            r.mode == "raw" || (r.mode == "framed" && r.py.is_some()),
            "{}: mode {} (framed attempts are Python)",
            r.id,
            r.mode
        );
        assert!(!r.expect.is_empty(), "{}: expect", r.id);
        if r.report == "none" {
            assert!(
                r.note.as_deref().is_some_and(|n| !n.is_empty()),
                "{}: a row without a report entry says why (note)",
                r.id
            );
        } else {
            let (cat, sys) = r
                .report
                .split_once(' ')
                .unwrap_or_else(|| panic!("{}: report is `CATEGORY SYSCALL` or none", r.id));
            assert_eq!(cat, r.category, "{}: the reported category", r.id);
            assert!(!sys.is_empty(), "{}", r.id);
        }
        if let Some(mark) = &r.open {
            assert!(!mark.is_empty(), "{}: an empty mark", r.id);
        }
        if let Some(c) = &r.c {
            c_argv(c); // syscall names resolve
        }
        *per_category.entry(r.category.as_str()).or_default() += 1;
    }
    for cat in [
        "network",
        "thread",
        "subprocess",
        "exec",
        "filesystem",
        "sleep",
        "random",
        "privilege",
        "other",
    ] {
        assert!(
            per_category.contains_key(cat),
            "no attempt in category {cat}"
        );
    }
    for g in GROUPS {
        assert!(rows.iter().any(|r| r.group == *g), "empty group {g}");
    }
    eprintln!(
        "escape catalogue: {} rows; per category {per_category:?}",
        rows.len()
    );
}

#[test]
fn network() {
    run_group("network");
}

#[test]
fn process() {
    run_group("process");
}

#[test]
fn exec() {
    run_group("exec");
}

#[test]
fn memory() {
    run_group("memory");
}

#[test]
fn privilege() {
    run_group("privilege");
}

#[test]
fn other() {
    run_group("other");
}

#[test]
fn abi() {
    run_group("abi");
}

#[test]
fn signals() {
    run_group("signals");
}

#[test]
fn filesystem() {
    run_group("filesystem");
}

#[test]
fn grants() {
    run_group("grants");
}

#[test]
fn time_random() {
    run_group("time_random");
}

#[test]
fn limits() {
    run_group("limits");
}

#[test]
fn python() {
    run_group("python");
}
