//! The pinned address layout (`[process] address_randomization = "deny"`, the `address-layout`
//! layer) under a container profile that refuses `personality(ADDR_NO_RANDOMIZE)`, as
//! podman's and Docker's defaults (hence Kubernetes' `RuntimeDefault`) do, imposed by
//! `examples/container_sim.rs --deny-personality`: `run` and `serve` degrade it with the
//! reason, `check` says so beforehand, and a policy that requires it stops with 125. Also:
//! under each simulated profile, `check` predicts what `run` degrades for every built-in
//! (scripts/test-oci does the same in a real runtime).

use std::process::Command;

use serde_json::Value;

use crate::common::{Outcome, PY, Scratch, container_sim, run_reported, serve_scratch, wfjail_bin};

/// Podman's and Docker's rule for `personality`.
const DENY_PERSONALITY: &str = "--deny-personality";

/// `wfjail <args>` under the simulated profile (or on the bare host when `sim` is false).
fn wfjail(sim: bool, s: &Scratch, args: &[&str]) -> Outcome {
    sim_wfjail(if sim { &[DENY_PERSONALITY] } else { &[] }, s, args)
}

/// A workflow-like program: the clock, randomness and an address.
const PROGRAM: &str = "import time, random, uuid\n\
                       print('T', time.time(), random.random(), uuid.uuid4(), id(object()))\n";

fn run(sim: bool, policy: &str) -> Outcome {
    let s = Scratch::new("layout");
    wfjail(
        sim,
        &s,
        &[
            "run",
            "-p",
            policy,
            "--clock",
            "@1700000000",
            "--seed",
            "7",
            "--raw",
            "--",
            PY,
            "-c",
            PROGRAM,
        ],
    )
}

fn degraded_of(o: &Outcome) -> Vec<String> {
    o.report["layers"]["degraded"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|d| d.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// `wfjail check -p POLICY --json`: its exit code and the `address-layout` row.
fn check_row(sim: bool, policy: &str) -> (i32, Value) {
    let s = Scratch::new("layout-check");
    let o = wfjail(sim, &s, &["check", "-p", policy, "--json"]);
    let doc: Value = serde_json::from_str(&o.stdout).unwrap_or(Value::Null);
    let row = doc["rows"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["layer"] == "address-layout"))
        .cloned()
        .unwrap_or(Value::Null);
    (o.code, row)
}

fn require_policy(s: &Scratch, base: &str) -> String {
    s.write(
        "require.toml",
        &format!(
            "extends = \"{base}\"\nrequire = [\"seccomp\", \"landlock\", \"address-layout\"]\n"
        ),
    )
    .display()
    .to_string()
}

#[test]
fn a_refused_personality_degrades_the_address_layout_and_the_run_completes() {
    let o = run(true, "temporal-python");
    o.check(
        o.code == 0 && o.status() == "ok",
        "temporal-python runs under a profile that refuses personality(ADDR_NO_RANDOMIZE)",
    );
    o.check(
        o.stdout.starts_with("T 1700000000.0 "),
        "the virtual clock still reads the workflow time",
    );
    let d = degraded_of(&o);
    o.check(
        d.iter().any(|e| {
            e.starts_with("address-layout: Operation not permitted")
                && e.contains("id()")
                && e.contains("personality(0x40000)")
        }),
        "layers.degraded names address-layout, the errno, what it costs and what to allow",
    );
    o.check(
        o.stderr.contains("address-layout"),
        "the console summary names it",
    );
    // Seeded randomness is not the layout's: the same run twice prints the same numbers but
    // for the address.
    let again = run(true, "temporal-python");
    let words = |o: &Outcome| -> Vec<String> {
        o.stdout
            .split_whitespace()
            .take(4)
            .map(String::from)
            .collect()
    };
    o.check(words(&o) == words(&again), "time, random and uuid4 repeat");

    // On the bare host nothing is degraded.
    let bare = run(false, "temporal-python");
    bare.check(
        !degraded_of(&bare)
            .iter()
            .any(|e| e.starts_with("address-layout")),
        "without the profile the layout is pinned",
    );

    // `check` said so beforehand: available no, used by the policy, not required (exit 0).
    let (code, row) = check_row(true, "temporal-python");
    assert_eq!(
        code, 0,
        "check exits 0: nothing required is missing ({row})"
    );
    assert_eq!(row["available"], false, "{row}");
    assert_eq!(row["used"], true, "{row}");
    assert_eq!(row["required"], false, "{row}");
    assert!(
        row["detail"]
            .as_str()
            .unwrap_or("")
            .contains("refused (EPERM"),
        "{row}"
    );
    assert!(
        row["enable"]
            .as_str()
            .unwrap_or("")
            .contains("personality(0x40000)"),
        "{row}"
    );
    let (_, bare_row) = check_row(false, "temporal-python");
    assert_eq!(bare_row["available"], true, "{bare_row}");
    // A policy that leaves the layout random does not use the layer: run does not list it.
    let (_, default_row) = check_row(true, "default");
    assert_eq!(default_row["used"], false, "{default_row}");
    let plain = wfjail(
        true,
        &Scratch::new("layout-default"),
        &[
            "run",
            "-p",
            "default",
            "--raw",
            "--",
            PY,
            "-c",
            "print(id(object()))",
        ],
    );
    plain.check(
        plain.code == 0
            && !degraded_of(&plain)
                .iter()
                .any(|e| e.starts_with("address-layout")),
        "default (layout random) runs without an address-layout entry",
    );
}

#[test]
fn a_policy_that_requires_the_address_layout_stops_with_125_naming_it() {
    let s = Scratch::new("layout-require");
    let policy = require_policy(&s, "temporal-python");
    let o = run(true, &policy);
    o.check(
        o.code == 125,
        "exit 125 when the required layout is refused",
    );
    o.check(
        o.stderr.contains("address-layout") && o.stderr.contains("personality"),
        "the error names the layer and the call",
    );
    let (code, row) = check_row(true, &policy);
    assert_eq!(code, 125, "check predicts the 125 ({row})");
    assert_eq!(row["required"], true, "{row}");
    // Where personality is allowed the same policy runs, with the layout pinned.
    let a = run(false, &policy);
    let b = run(false, &policy);
    a.check(a.code == 0 && b.code == 0, "runs on the bare host");
    a.check(a.stdout == b.stdout, "the same id() in both runs");
    // Requiring the layer pins the layout even where the policy leaves it random.
    let random = require_policy(&s, "default");
    let code = "print(id(object()), repr(object()))";
    let ids = |p: &str| {
        let s = Scratch::new("layout-ids");
        wfjail(false, &s, &["run", "-p", p, "--raw", "--", PY, "-c", code])
    };
    let (x, y) = (ids(&random), ids(&random));
    x.check(
        x.code == 0 && x.stdout == y.stdout,
        "require = [\"address-layout\"] pins the layout",
    );
}

/// The zygote's module: a workflow-like call.
const HANDLERS: &str = r#"
import time, random
def step(req):
    return ("%s %s %d" % (time.time(), random.random(), id(object()))).encode()
"#;

#[test]
fn serve_zygote_degrades_the_address_layout_and_its_sessions_complete() {
    let worker = r#"
c = Client()
out = []
for i in range(2):
    with c.session(handler=MOD + ":step", seed=7, time_ns=1_700_000_000_000_000_000) as s:
        r = s.call(b"x")
    out.append({"result": r.decode(), "status": s.report["status"],
                "degraded": s.report["layers"]["degraded"]})
print(json.dumps(out))
"#;
    let (s, module) = serve_scratch("layout-serve", "al", HANDLERS, "", &[], worker);
    let policy = s.path("policy.toml").display().to_string();
    let mut args = vec!["serve", "-p", policy.as_str()];
    let zygote = crate::common::zygote_args(&module, "1");
    args.extend(zygote.iter().map(String::as_str));
    let worker_path = s.path("worker.py").display().to_string();
    args.extend(["--", PY, worker_path.as_str()]);
    let o = wfjail(true, &s, &args);
    o.check(o.code == 0, "serve --zygote exits 0 under the profile");
    o.check(
        o.stderr
            .contains("wfjail: sessions run without address-layout"),
        "serve says at start what its sessions run without",
    );
    let sessions: Value = serde_json::from_str(o.stdout.trim()).unwrap_or(Value::Null);
    let sessions = sessions.as_array().cloned().unwrap_or_default();
    o.check(sessions.len() == 2, "two sessions completed");
    for session in &sessions {
        o.check(session["status"] == "ok", "status ok");
        o.check(
            session["result"]
                .as_str()
                .unwrap_or("")
                .starts_with("1700000000.0 "),
            "the session reads the workflow time",
        );
        o.check(
            session["degraded"].as_array().is_some_and(|d| {
                d.iter().any(|e| {
                    e.as_str()
                        .unwrap_or("")
                        .starts_with("address-layout: Operation not permitted")
                })
            }),
            "the session's report lists address-layout in degraded",
        );
    }
    // The same seed and clock: the same numbers in both sessions (the layout aside).
    let first = |v: &Value| -> Vec<String> {
        v["result"]
            .as_str()
            .unwrap_or("")
            .split(' ')
            .take(2)
            .map(String::from)
            .collect()
    };
    if sessions.len() == 2 {
        o.check(
            first(&sessions[0]) == first(&sessions[1]),
            "seeded randomness and the clock repeat",
        );
    }
}

/// `check -p POLICY --json` under `sim` flags: (exit, used-and-missing rows that are not
/// required, used-and-missing rows that are).
fn predicted(sim: &[&str], policy: &str) -> (i32, Vec<String>, Vec<String>) {
    let s = Scratch::new("predict");
    let o = sim_wfjail(sim, &s, &["check", "-p", policy, "--json"]);
    let doc: Value = serde_json::from_str(&o.stdout).unwrap_or(Value::Null);
    let (mut degraded, mut fatal) = (vec![], vec![]);
    for r in doc["rows"].as_array().into_iter().flatten() {
        if r["used"] == true && r["available"] == false {
            let name = r["layer"].as_str().unwrap_or("").to_string();
            if r["required"] == true {
                fatal.push(name);
            } else {
                degraded.push(name);
            }
        }
    }
    degraded.sort();
    (o.code, degraded, fatal)
}

/// `wfjail <args>` under `container_sim` with `flags` (none: the bare host).
fn sim_wfjail(flags: &[&str], s: &Scratch, args: &[&str]) -> Outcome {
    let mut cmd = if flags.is_empty() {
        Command::new(wfjail_bin())
    } else {
        let mut c = Command::new(container_sim());
        c.args(flags).arg("--").arg(wfjail_bin());
        c
    };
    cmd.current_dir(&s.0);
    run_reported(cmd, args, &s.path("report.json"))
}

#[test]
fn check_predicts_what_run_does_for_every_builtin_under_each_simulated_profile() {
    // The bare host; Docker's default for root (no CAP_SYS_ADMIN) with its personality rule;
    // podman's (sethostname and personality refused); and each runtime restriction
    // container_sim knows alone.
    let profiles: [&[&str]; 7] = [
        &[],
        &[
            "--deny-namespaces",
            "--deny-personality",
            "--drop-sys-admin",
        ],
        &["--deny-sethostname", "--deny-personality"],
        &["--deny-notify"],
        &["--deny-landlock"],
        &["--deny-ptrace"],
        &["--deny-process-vm"],
    ];
    for sim in profiles {
        for policy in ["default", "permissive", "strict", "temporal-python"] {
            let (code, degraded, fatal) = predicted(sim, policy);
            if !sim.is_empty() && sim.contains(&DENY_PERSONALITY) && policy == "temporal-python" {
                assert!(
                    degraded.iter().any(|d| d == "address-layout"),
                    "{sim:?}: {degraded:?}"
                );
            }
            if sim.contains(&"--deny-namespaces") {
                assert!(
                    degraded.iter().any(|d| d == "pid-ns"),
                    "{sim:?}: {degraded:?}"
                );
            }
            let s = Scratch::new("predict-run");
            let o = sim_wfjail(
                sim,
                &s,
                &["run", "-p", policy, "--raw", "--", PY, "-c", "print('ok')"],
            );
            let what = format!(
                "{sim:?} {policy}: check exit {code}, fatal {fatal:?}, degraded {degraded:?}"
            );
            if !fatal.is_empty() {
                o.check(
                    code == 125 && o.code == 125,
                    &format!("{what}: both exit 125"),
                );
                continue;
            }
            let mut got: Vec<String> = degraded_of(&o)
                .iter()
                .map(|d| d.split(':').next().unwrap_or("").to_string())
                .collect();
            got.sort();
            got.dedup();
            o.check(
                code == 0 && o.code == 0 && got == degraded,
                &format!("{what}; run degraded {got:?}"),
            );
        }
    }
}
