//! One classifier for `run` and `serve`: the same guest under the same limits ends with the
//! same `status` and `limit` under `wfjail run` as in a `wfjail serve` session, exec'd or
//! forked from a zygote. Each limit (cpu, memory, file size, output) is met for real: the
//! kernel (or the output bound) stops the guest, and each report names the limit from the
//! kernel's evidence.

use crate::common::{Outcome, PY, Scratch, serve_scratch, wfjail, wfjail_with};
use serde_json::Value;

/// The guests: one handler per limit, imported by the zygote and by `guest.py`.
const HANDLERS: &str = r#"
import os
RW = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rw")
def spin(req):
    while True:
        pass
def fill(req):
    chunks = []
    while True:
        chunks.append(bytearray(1 << 20))
def write_big(req):
    with open(os.path.join(RW, "big"), "wb") as f:
        f.write(b"x" * (2 << 20))
    return b"written"
def burn(req):
    import time
    t = time.process_time()
    while time.process_time() - t < 0.6:
        pass
    return b"burnt"
def flood(req):
    while True:
        os.write(1, b"x" * 4096)
"#;

/// A worker that opens one session (`exec`: the guest is `guest.py HANDLER`; `zygote`: the
/// handler) and calls it once, then prints the session's report (CLOSED or FAILED).
const WORKER: &str = r#"
mode, name = sys.argv[1], sys.argv[2]
calls = int(sys.argv[3]) if len(sys.argv) > 3 else 1
if mode == "zygote":
    how = {"handler": MOD + ":" + name}
else:
    how = {"argv": [sys.executable, os.path.join(DIR, "guest.py"), name]}
try:
    with Client().session(timeout="60s", **how) as s:
        for _ in range(calls):
            try:
                s.call(b"x")
            except GuestError:
                pass
    report = s.report
except SessionFailed as e:
    report = e.report
print(json.dumps(report))
"#;

/// The scratch dir: handlers, `guest.py`, a writable `rw/`, the worker, and a policy with
/// `limits` (temporal-python plus what lets the interpreter import the handlers).
fn fixture(tag: &str, limits: &str) -> (Scratch, String) {
    let (s, module) = serve_scratch(tag, "lim", HANDLERS, limits, &[], WORKER);
    s.write(
        "guest.py",
        &format!(
            "import importlib, sys\nimport wfjail.guest\n\
             wfjail.guest.run(getattr(importlib.import_module({module:?}), sys.argv[1]))\n"
        ),
    );
    std::fs::create_dir(s.path("rw")).unwrap();
    (s, module)
}

/// `wfjail run` of `guest.py HANDLER` (framed, an empty request) under the fixture's policy.
fn run(s: &Scratch, handler: &str) -> Outcome {
    let policy = s.path("policy.toml").display().to_string();
    let rw = s.path("rw").display().to_string();
    let guest = s.path("guest.py").display().to_string();
    let o = wfjail(&[
        "run",
        "-p",
        &policy,
        "--rw",
        &rw,
        "--timeout",
        "60s",
        "--",
        PY,
        &guest,
        handler,
    ]);
    o.check(o.status() == "limit", "wfjail run: status limit");
    o
}

/// The report of one `wfjail serve` session calling `handler` (`zygote`: prefork mode).
fn session(s: &Scratch, module: &str, zygote: bool, handler: &str) -> Value {
    session_calls(s, module, zygote, handler, 1)
}

/// [`session`] with `calls` calls of `handler`.
fn session_calls(s: &Scratch, module: &str, zygote: bool, handler: &str, calls: u32) -> Value {
    let policy = s.path("policy.toml").display().to_string();
    let rw = s.path("rw").display().to_string();
    let worker = s.path("worker.py").display().to_string();
    let mode = if zygote { "zygote" } else { "exec" };
    let mut args = vec!["serve", "-q", "-p", &policy, "--rw", &rw];
    if zygote {
        args.extend(["--zygote", "--python", PY, "--preload", module]);
        args.extend(["--zygotes", "1"]);
    }
    let calls = calls.to_string();
    args.extend(["--", PY, &worker, mode, handler, &calls]);
    let out = wfjail_with(&args, |c| {
        c.current_dir(&s.0);
    });
    out.check(out.code == 0, &format!("wfjail serve ({mode}) exits 0"));
    serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "{mode}: the worker printed no report ({e})\nstdout: {}\nstderr: {}",
            out.stdout, out.stderr
        )
    })
}

/// Runs `handler` under `wfjail run` and in both kinds of `serve` session; each must report
/// status `limit` and `limit` = `want`, as `run` does.
fn same_limit_everywhere(tag: &str, limits: &str, handler: &str, want: &str) {
    let (s, module) = fixture(tag, limits);
    let r = run(&s, handler);
    r.check(
        r.report["limit"] == want,
        &format!("wfjail run: limit {want}"),
    );
    let from_run = (r.report["status"].clone(), r.report["limit"].clone());
    for zygote in [false, true] {
        let report = session(&s, &module, zygote, handler);
        assert_eq!(
            (report["status"].clone(), report["limit"].clone()),
            from_run,
            "serve (zygote: {zygote}) reports what run does: {report:#}"
        );
    }
}

#[test]
fn a_session_killed_for_cpu_reports_the_cpu_limit_as_run_does() {
    same_limit_everywhere("cpu", "[limits]\ncpu = \"1s\"\n", "spin", "cpu");
}

#[test]
fn a_session_that_fills_its_memory_reports_the_memory_limit_as_run_does() {
    same_limit_everywhere("mem", "[limits]\nmemory = \"256MiB\"\n", "fill", "memory");
}

#[test]
fn a_session_that_writes_past_the_file_size_reports_the_file_size_limit_as_run_does() {
    same_limit_everywhere(
        "fsz",
        "[limits]\nfile_size = \"1MiB\"\n",
        "write_big",
        "file_size",
    );
}

#[test]
fn a_session_that_floods_its_output_reports_the_output_limit_as_run_does() {
    same_limit_everywhere("out", "[limits]\noutput = \"64KiB\"\n", "flood", "output");
}

#[test]
fn limits_cpu_is_each_calls_budget_and_session_cpu_the_sessions() {
    // Three calls of 0.6 s of CPU each: within a 1 s budget per call, so the session of
    // 1.8 s ends ok...
    let (s, module) = fixture("cpu-per-call", "[limits]\ncpu = \"1s\"\n");
    for zygote in [false, true] {
        let report = session_calls(&s, &module, zygote, "burn", 3);
        assert_eq!(
            report["status"], "ok",
            "three calls under the per-call budget (zygote: {zygote}): {report:#}"
        );
        assert!(report["cpu_ms"].as_f64().unwrap() >= 1500.0, "{report:#}");
    }
    // ...but not within a 1 s budget for the session's whole life.
    let (s, module) = fixture(
        "cpu-per-session",
        "[limits]\ncpu = \"1s\"\nsession_cpu = \"1s\"\n",
    );
    for zygote in [false, true] {
        let report = session_calls(&s, &module, zygote, "burn", 3);
        assert_eq!(
            (report["status"].clone(), report["limit"].clone()),
            ("limit".into(), "cpu".into()),
            "the session's CPU over limits.session_cpu (zygote: {zygote}): {report:#}"
        );
    }
}
