//! Root without `CAP_SETFCAP`, as in a pod with `capabilities: drop: ["ALL"]`: since Linux
//! 5.12 it can make a user namespace but not map uid 0 into it. `check` must say so (its probe
//! writes the id maps `run` writes) and `run` must degrade the namespaces, not exit 125 at
//! "writing the user namespace id maps". `setpriv --bounding-set -setfcap` takes the
//! capability away (root's effective set after exec is its bounding set).
//! scripts/test-pod shows the same in a real pod.

use std::process::Command;

use serde_json::Value;

use crate::common::{PY, Scratch, run_reported, wfjail_bin};

fn without_setfcap() -> Command {
    let mut c = Command::new("setpriv");
    c.args(["--bounding-set", "-setfcap", "--"])
        .arg(wfjail_bin());
    c
}

#[test]
fn root_without_setfcap_runs_without_a_user_namespace_as_check_predicts() {
    if !nix::unistd::geteuid().is_root()
        || Command::new("setpriv").arg("--version").output().is_err()
    {
        eprintln!("skipped: needs root and setpriv");
        return;
    }
    let s = Scratch::new("root-id-maps");
    let mut c = without_setfcap();
    c.current_dir(&s.0);
    let check = run_reported(
        c,
        &["check", "-p", "default", "--json"],
        &s.path("unused.json"),
    );
    let doc: Value = serde_json::from_str(&check.stdout).expect("check --json");
    let row = doc["rows"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["layer"] == "user-ns"))
        .expect("a user-ns row")
        .clone();

    let mut c = without_setfcap();
    c.current_dir(&s.0);
    let run = run_reported(
        c,
        &[
            "run",
            "-p",
            "default",
            "--raw",
            "--",
            PY,
            "-c",
            "print('ok')",
        ],
        &s.path("report.json"),
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.contains("ok"), "{}", run.stdout);
    // Each entry is "LAYER: why".
    let degraded: Vec<&str> = run.report["layers"]["degraded"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let user_ns_degraded = degraded.iter().any(|d| d.starts_with("user-ns:"));
    if row["available"] == false {
        // Linux >= 5.12: the maps are refused, and check names the capability.
        assert!(
            row["detail"]
                .as_str()
                .unwrap_or("")
                .contains("root's id maps"),
            "{row}"
        );
        assert!(
            row["enable"].as_str().unwrap_or("").contains("CAP_SETFCAP"),
            "{row}"
        );
        assert!(user_ns_degraded, "{degraded:?}");
    } else {
        assert!(!user_ns_degraded, "{degraded:?}");
    }
}
