//! A deterministic environment: under `[time] clock = "virtual"` the guest's wall clock reads
//! the workflow time (the vDSO patched at the exec stop, the syscalls answered by the
//! supervisor), under `[random] getrandom = "seeded"` its randomness comes from the seed —
//! the same values in two executions, other values with another seed — and under
//! `clock = "deny"` a wall-clock read is a reported violation. Monotonic clocks still run.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::common::{
    Outcome, PY, REPO, Scratch, serve_one_zygote, serve_scratch, wfjail, wfjail_with,
};

const VIRTUAL: &str = "extends = \"strict\"\n[time]\nclock = \"virtual\"\n[random]\ngetrandom = \"seeded\"\n\
                       [process]\naddress_randomization = \"deny\"\ncpu_count = 1\n";
const CLOCK: &str = "2026-12-01T09:30:00Z";
const SECS: &str = "1796117400";

/// Every way Python code reads the wall clock or draws randomness.
const PY_READS: &str = r#"
import time, datetime, logging, email.utils, os, random, uuid
print("time", time.time())
print("time_ns", time.time_ns())
print("now", datetime.datetime.now(datetime.timezone.utc).isoformat())
print("utcnow", datetime.datetime.now().isoformat())
print("gmtime", time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()))
print("strftime", time.strftime("%Y-%m-%d %H:%M:%S"))
print("formatdate", email.utils.formatdate())
print("logging", logging.LogRecord("x", 20, "f", 1, "m", None, None).created)
print("random", random.random(), random.Random().random())
print("uuid4", uuid.uuid4())
print("urandom", os.urandom(8).hex())
print("facts", os.getpid(), os.cpu_count(), id(object()))
a = time.monotonic()
sum(range(300000))
print("monotonic_advances", time.monotonic() > a)
"#;

fn run_virtual(s: &Scratch, clock: Option<&str>, seed: &str, argv: &[&str]) -> Outcome {
    let policy = s.write("virtual.toml", VIRTUAL);
    let mut args = vec!["run", "-p", policy.to_str().unwrap(), "--seed", seed];
    if let Some(c) = clock {
        args.extend(["--clock", c]);
    }
    args.extend(["--ro", s.0.to_str().unwrap(), "--raw", "--"]);
    args.extend(argv);
    wfjail(&args)
}

fn line<'a>(o: &'a Outcome, key: &str) -> &'a str {
    o.stdout
        .lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no {key} line in {:?}", o.stdout))
}

#[test]
fn python_reads_the_workflow_time_and_the_seeded_randomness_the_same_way_twice() {
    let s = Scratch::new("det-py");
    let a = run_virtual(&s, Some(CLOCK), "7", &[PY, "-c", PY_READS]);
    let b = run_virtual(&s, Some(CLOCK), "7", &[PY, "-c", PY_READS]);
    for o in [&a, &b] {
        o.check(o.status() == "ok", "status ok");
        o.check(
            o.report["violations"].as_array().unwrap().is_empty(),
            "virtual time and seeded randomness are not violations",
        );
    }
    a.check(
        a.stdout == b.stdout,
        "the same clock and seed: the same output",
    );
    a.check(line(&a, "time") == format!("{SECS}.0"), "time.time()");
    a.check(
        line(&a, "time_ns") == format!("{SECS}000000000"),
        "time.time_ns()",
    );
    a.check(
        line(&a, "now") == "2026-12-01T09:30:00+00:00",
        "datetime.now(timezone.utc)",
    );
    a.check(
        line(&a, "utcnow") == "2026-12-01T09:30:00",
        "datetime.now() (TZ=UTC)",
    );
    a.check(line(&a, "gmtime") == "2026-12-01T09:30:00", "time.gmtime()");
    a.check(
        line(&a, "strftime") == "2026-12-01 09:30:00",
        "time.strftime()",
    );
    a.check(
        line(&a, "formatdate") == "Tue, 01 Dec 2026 09:30:00 -0000",
        "email.utils.formatdate()",
    );
    a.check(
        line(&a, "logging") == format!("{SECS}.0"),
        "a logging record's time",
    );
    a.check(
        line(&a, "monotonic_advances") == "True",
        "time.monotonic() still runs",
    );
    a.check(
        line(&a, "facts").starts_with("1 1 "),
        "pid 1 (its own PID namespace), one CPU",
    );
    a.check(a.report["clock"] == CLOCK, "the report names the clock");
    a.check(a.report["seed"] == 7, "and the seed");

    // Another seed and another time: other randomness, the other time.
    let c = run_virtual(
        &s,
        Some("2030-01-02T03:04:05.5Z"),
        "8",
        &[PY, "-c", PY_READS],
    );
    c.check(c.status() == "ok", "status ok");
    c.check(line(&c, "time") == "1893553445.5", "the other time");
    for key in ["random", "uuid4", "urandom"] {
        c.check(line(&c, key) != line(&a, key), key);
    }
}

#[test]
fn without_clock_the_run_starts_at_the_host_time_and_names_it_for_a_repeat() {
    let s = Scratch::new("det-default");
    let code = "import time; print(time.time_ns())";
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i128;
    let a = run_virtual(&s, None, "0", &[PY, "-c", code]);
    a.check(a.status() == "ok", "status ok");
    let seen: i128 = a.stdout.trim().parse().unwrap();
    a.check(
        seen >= before && seen - before < 60_000_000_000,
        "the host's time when the run started",
    );
    let clock = a.report["clock"].as_str().unwrap().to_string();
    let b = run_virtual(&s, Some(&clock), "0", &[PY, "-c", code]);
    b.check(
        b.stdout == a.stdout,
        "--clock with the report's clock repeats the run's time to the nanosecond",
    );
}

/// tests/determinism/clock.c, compiled statically once per test run (strict reads only the
/// command's own prefix).
fn clock_reader() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let src = format!("{REPO}/tests/determinism/clock.c");
        crate::common::cc_static("determinism-bin", "clock", Path::new(&src), &[])
    })
}

#[test]
fn c_reads_the_workflow_time_through_libc_and_through_the_vdso_called_directly() {
    let s = Scratch::new("det-c");
    let bin = clock_reader().to_str().unwrap();
    let o = run_virtual(&s, Some(CLOCK), "1", &[bin]);
    o.check(o.status() == "ok", "status ok");
    let want = format!("{SECS}.000000000");
    for key in [
        "time",
        "gettimeofday",
        "clock_gettime",
        "clock_gettime_coarse",
        "vdso_direct",
    ] {
        o.check(line(&o, key) == want, key);
    }
    o.check(
        line(&o, "monotonic_advances") == "1",
        "CLOCK_MONOTONIC still runs",
    );
    // The same program under a real clock reads the host's time through the vDSO: what the
    // patch takes away.
    let real = wfjail(&["run", "-p", "strict", "--raw", "--", bin]);
    real.check(real.status() == "ok", "status ok");
    real.check(
        line(&real, "vdso_direct") != want && line(&real, "time") != want,
        "real time without the virtual clock",
    );
}

#[test]
fn a_denied_clock_is_a_reported_violation_and_monotonic_time_still_runs() {
    let s = Scratch::new("det-deny");
    let policy = s.write(
        "deny.toml",
        "extends = \"strict\"\n[time]\nclock = \"deny\"\n",
    );
    let code = "import time\na = time.monotonic()\ntry:\n    time.time()\nexcept OSError as e:\n    print('errno=%d' % e.errno)\nprint('monotonic', time.monotonic() >= a)\n";
    let o = wfjail(&[
        "run",
        "-p",
        policy.to_str().unwrap(),
        "--raw",
        "--",
        PY,
        "-c",
        code,
    ]);
    o.check(o.stdout.contains("errno=1"), "time.time(): EPERM");
    o.check(o.stdout.contains("monotonic True"), "monotonic still runs");
    o.check(o.status() == "violation", "status violation");
    let v = o.assert_violation("clock_gettime", "clock");
    o.check(
        v["rule"] == "time.clock = \"deny\"",
        "the rule names the setting",
    );
    o.check(
        v["hint"].as_str().unwrap().contains("workflow.now()"),
        "the hint says what to use",
    );
    // A C program calling the vDSO directly is denied the same way.
    let bin = clock_reader().to_str().unwrap();
    let o = wfjail(&["run", "-p", policy.to_str().unwrap(), "--raw", "--", bin]);
    o.check(
        line(&o, "vdso_direct") == "error 1",
        "the vDSO called directly: EPERM",
    );
    o.check(line(&o, "time") != format!("{SECS}.000000000"), "sanity");
    o.assert_violation("time", "clock");
    o.assert_violation("gettimeofday", "clock");
}

#[test]
fn clock_and_seed_flags_say_what_they_need() {
    let o = wfjail(&[
        "run", "-p", "default", "--clock", CLOCK, "--raw", "--", PY, "-c", "pass",
    ]);
    o.check(
        o.code == 2 && o.stderr.contains("clock = \"virtual\""),
        "--clock under a real clock: exit 2 naming the setting",
    );
    for bad in ["yesterday", "2026-12-01T09:30:00", "2026-02-30T00:00:00Z"] {
        let o = wfjail(&[
            "run",
            "-p",
            "temporal-python",
            "--clock",
            bad,
            "--raw",
            "--",
            PY,
            "-c",
            "pass",
        ]);
        o.check(
            o.code == 2 && o.stderr.contains("RFC 3339"),
            "a bad --clock: exit 2, saying the format",
        );
    }
}

const WORKFLOWS: &str = r#"
import ctypes, json, os, random, time, uuid, datetime
def facts(req):
    # AT_RANDOM: the 16 bytes the kernel hands a process at exec (glibc's stack canary and
    # pointer guard), overwritten at the exec stop with bytes of the session's seed.
    libc = ctypes.CDLL(None)
    libc.getauxval.restype = ctypes.c_ulong
    at_random = ctypes.string_at(libc.getauxval(25), 16).hex()
    return json.dumps([time.time(), datetime.datetime.now().isoformat(), random.random(),
                       str(uuid.uuid4()), os.urandom(4).hex(), at_random]).encode()
"#;

const WORKER: &str = r#"
c = Client()
out = []
for seed in (5, 5, 6):
    with c.session(handler=MOD + ":facts", seed=seed, time_ns=1_000_000_000_000) as s:
        out.append([json.loads(s.call(b"a")), json.loads(s.call(b"b", time_ns=2_000_000_500_000)),
                    json.loads(s.call(b"c")), s.report])
    out[-1][-1] = s.report
print(json.dumps(out))
"#;

#[test]
fn serve_sessions_get_their_seed_and_each_calls_time() {
    for zygote in [true, false] {
        let (s, module) = serve_scratch("det-serve", "det", WORKFLOWS, "", &[], WORKER);
        let policy = s.path("policy.toml").display().to_string();
        let worker = s.path("worker.py").display().to_string();
        let zygote_args = crate::common::zygote_args(&module, "1");
        let mut args = vec!["serve", "-p", &policy];
        if zygote {
            args.extend(zygote_args.iter().map(String::as_str));
        }
        args.extend(["--", PY, &worker]);
        if !zygote {
            // Exec-mode sessions run the handler through the guest library's runner.
            let exec_worker = WORKER.replace(
                "handler=MOD + \":facts\"",
                "argv=[sys.executable, \"-c\", \"import importlib; from wfjail import guest; guest.run(importlib.import_module(%r).facts)\" % MOD]",
            );
            s.write(
                "worker.py",
                &std::fs::read_to_string(s.path("worker.py"))
                    .unwrap()
                    .replace(WORKER, &exec_worker),
            );
        }
        let out = wfjail_with(&args, |c| {
            c.current_dir(&s.0);
        });
        let mode = if zygote { "zygote" } else { "exec" };
        out.check(out.code == 0, &format!("{mode}: wfjail serve exits 0"));
        let r: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
        let (a, b, c) = (&r[0], &r[1], &r[2]);
        out.check(a[0][0] == 1000.0, &format!("{mode}: OPEN's time"));
        out.check(
            a[1][0] == 2000.0005,
            &format!("{mode}: the call's TIME ({})", a[1][0]),
        );
        out.check(
            a[2][0] == 2000.0005,
            &format!("{mode}: a TIME holds for later calls"),
        );
        out.check(
            a[0][1] == "1970-01-01T00:16:40",
            &format!("{mode}: datetime.now()"),
        );
        for i in 0..3 {
            for j in 2..5 {
                out.check(
                    a[i][j] == b[i][j],
                    &format!("{mode}: seed 5 twice: call {i} value {j} the same"),
                );
                out.check(
                    a[i][j] != c[i][j],
                    &format!("{mode}: seed 6: call {i} value {j} differs"),
                );
            }
        }
        if !zygote {
            // An exec'd session's AT_RANDOM comes from OPEN's seed (a zygote's sessions are
            // forks of it: theirs is the zygote's, the same in every session).
            out.check(
                a[0][5] == b[0][5] && a[0][5] != c[0][5],
                &format!(
                    "exec: AT_RANDOM follows the seed ({} {} {})",
                    a[0][5], b[0][5], c[0][5]
                ),
            );
        }
        out.check(
            a[3]["seed"] == 5,
            &format!("{mode}: the report names the seed"),
        );
        out.check(
            a[3]["clock"] == "1970-01-01T00:33:20.000500Z",
            &format!("{mode}: and the last workflow time ({})", a[3]["clock"]),
        );
        out.check(
            a[3]["violations"].as_array().unwrap().is_empty(),
            &format!("{mode}: no violations"),
        );
    }
}

#[test]
fn waits_with_a_timeout_are_sleeps_under_sleep_deny_and_waits_without_one_run() {
    let code = r#"
import os, select, threading, time
r, w = os.pipe()
def t(name, f):
    a = time.monotonic()
    try:
        out = "ran %r" % (f(),)
    except OSError as e:
        out = "errno=%d" % e.errno
    print(name, out, "blocked" if time.monotonic() - a > 0.1 else "quick")
t("select_zero", lambda: len(select.select([r], [], [], 0)[0]))
t("select", lambda: select.select([], [], [], 0.2))
t("poll", lambda: select.poll().poll(200))
t("event", lambda: threading.Event().wait(0.2))
held = threading.Lock()
held.acquire()
t("lock", lambda: held.acquire(timeout=0.2))
os.write(w, b"x")
t("select_ready", lambda: len(select.select([r], [], [])[0]))
"#;
    let o = crate::common::py("temporal-python", &[], code);
    o.check(o.status() == "violation", "status violation");
    for (name, want) in [
        ("select_zero", "ran 0 quick"),
        ("select", "errno=1 quick"),
        ("poll", "errno=1 quick"),
        ("event", "ran False quick"),
        ("lock", "ran False quick"),
        ("select_ready", "ran 1 quick"),
    ] {
        o.check(line(&o, name) == want, &format!("{name}: {want}"));
    }
    for syscall in ["pselect6", "poll", "futex"] {
        let v = o.assert_violation(syscall, "sleep");
        o.check(
            v["rule"]
                .as_str()
                .unwrap()
                .starts_with("time.sleep = \"deny\""),
            "the rule names the setting",
        );
    }
    // Under `default` (sleep allowed) they wait.
    let o = crate::common::py("default", &[], code);
    o.check(o.status() == "ok", "status ok under default");
    o.check(line(&o, "event") == "ran False blocked", "Event.wait waits");
}

#[test]
fn a_pinned_address_layout_gives_the_same_ids_in_every_run() {
    let code = "print(id(object()), repr(object()), id([]))";
    let a = crate::common::py("temporal-python", &[], code);
    let b = crate::common::py("temporal-python", &[], code);
    a.check(a.status() == "ok" && b.status() == "ok", "status ok");
    a.check(
        a.stdout == b.stdout,
        "address_randomization = \"deny\": the same id() twice",
    );
    let c = crate::common::py("default", &[], code);
    let d = crate::common::py("default", &[], code);
    c.check(
        c.stdout != d.stdout,
        "randomised layouts under default differ",
    );
}

#[test]
fn check_determinism_names_the_perturbation_that_changed_the_result() {
    let s = Scratch::new("det-check");
    let lib = crate::common::python_lib(&s);
    s.write(
        "guest.py",
        &format!(
            "import sys, json, random, time\nsys.path.insert(0, {lib:?})\nfrom wfjail import guest\n\
             def handle(req):\n    leak = json.loads(req)['leak']\n    out = {{'ok': 1}}\n\
             \x20   if leak == 'hash': out['order'] = list({{'b', 'a', 'c', 'd', 'e', 'f'}})\n\
             \x20   if leak == 'random': out['pick'] = random.random()\n\
             \x20   if leak == 'time': out['t'] = time.time()\n    return json.dumps(out)\n\
             guest.run(handle)\n"
        ),
    );
    let guest = s.path("guest.py").display().to_string();
    let dir = s.0.display().to_string();
    for (leak, code, under) in [
        ("none", 0, None),
        ("hash", 7, Some("PYTHONHASHSEED=1001")),
        ("random", 7, Some("--seed 4")),
        ("time", 7, Some("workflow time +18000 s")),
    ] {
        let req = s.write(
            &format!("{leak}.json"),
            &format!("{{\"leak\": \"{leak}\"}}"),
        );
        let report = s.path(&format!("{leak}-report.json"));
        let out = Command::new(crate::common::wfjail_bin())
            .args([
                "run",
                "-p",
                "temporal-python",
                "--ro",
                &dir,
                "--check-determinism",
                "5",
            ])
            .arg("--input")
            .arg(&req)
            .arg("--report")
            .arg(&report)
            .args(["--", PY, &guest])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{leak}: {err}");
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
        assert_eq!(r["runs"].as_array().unwrap().len(), 5, "{leak}");
        match under {
            None => {
                assert_eq!(r["deterministic"], true, "{leak}: {err}");
                assert!(err.contains("deterministic: every run gave the same result"));
            }
            Some(p) => {
                assert_eq!(r["differs_under"], serde_json::json!([p]), "{leak}: {err}");
                assert!(
                    err.contains(&format!("the result changed under {p}")),
                    "{err}"
                );
            }
        }
    }
}

#[test]
fn a_pinned_cpu_count_is_what_the_guest_sees_on_any_host() {
    let code = "import os; print(os.cpu_count(), sorted(os.sched_getaffinity(0))[-1])";
    let o = crate::common::py("temporal-python", &[], code);
    o.check(
        o.status() == "ok" && o.stdout.trim() == "1 0",
        "temporal-python: one CPU",
    );
    let o = crate::common::py_policy(
        "extends = \"temporal-python\"\n[process]\ncpu_count = 130\n",
        code,
    );
    o.check(
        o.status() == "ok" && o.stdout.trim() == "130 129",
        "130 CPUs: three words of mask",
    );
    let o = crate::common::py_policy(
        "extends = \"temporal-python\"\n[process]\ncpu_count = 0\n",
        code,
    );
    o.check(
        o.code == 2 && o.stderr.contains("policy.toml:3:13") && o.stderr.contains("use 1 to 1024"),
        "0 CPUs: refused at its line",
    );
}

/// A virtualenv of `python` (without pip) in `s`, returning its `bin/python`.
fn venv(s: &Scratch, python: &str) -> String {
    let dir = s.path("venv");
    let out = Command::new(python)
        .args(["-m", "venv", "--without-pip"])
        .arg(&dir)
        .output()
        .expect("python -m venv");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir.join("bin/python").display().to_string()
}

#[test]
fn a_virtualenv_interpreter_runs_under_every_built_in_that_grants_the_interpreter() {
    // The venv's bin/.. and its base interpreter's prefix (pyvenv.cfg's `home`) are both
    // what ${exe_dir}/.. grants; pyvenv.cfg itself is readable wherever the command is.
    let s = Scratch::new("det-venv");
    let py = venv(&s, PY);
    let code = "import sys, json; print(sys.prefix == sys.base_prefix, sys.base_prefix)";
    for policy in ["strict", "temporal-python", "default"] {
        let o = wfjail(&["run", "-p", policy, "--raw", "--", &py, "-c", code]);
        o.check(
            o.status() == "ok" && o.stdout.trim() == "False /usr",
            &format!("{policy}: a venv of Debian's python starts"),
        );
    }
}

#[test]
fn with_threads_allowed_contending_threads_are_not_sleeps() {
    // CPython's GIL waits on a futex with a 5 ms timeout whenever two threads contend: with
    // threads allowed, timed futex waits are threads waiting for each other, not sleeps.
    // select/poll with a timeout still are.
    let code = r#"
import select, threading
def spin():
    x = 0
    for i in range(2000000):
        x += i
ts = [threading.Thread(target=spin) for _ in range(3)]
[t.start() for t in ts]
[t.join() for t in ts]
print("joined")
try:
    select.select([], [], [], 0.05)
except OSError as e:
    print("select errno=%d" % e.errno)
"#;
    let o = crate::common::py_policy(
        "extends = \"strict\"\n[process]\nthreads = \"allow\"\n[limits]\nprocesses = 16\n",
        code,
    );
    o.check(o.stdout.contains("joined"), "the threads ran");
    o.check(
        o.stdout.contains("select errno=1"),
        "select with a timeout is denied",
    );
    let futex = o.report["violations"]
        .as_array()
        .unwrap()
        .iter()
        .any(|v| v["syscall"] == "futex");
    o.check(!futex, "no futex sleep violation");
    o.assert_violation("pselect6", "sleep");
}

/// Unmaps `[vvar]` and `[vdso]` and asks the kernel for a fresh vDSO, whose clock functions
/// would read the real time without a syscall (the exec stop patched only the first one).
const MAP_FRESH_VDSO: &str = r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
spans = []
for l in open('/proc/self/maps'):
    if l.rstrip().endswith(('[vdso]', '[vvar]', '[vvar_vclock]')):
        a, b = (int(x, 16) for x in l.split()[0].split('-'))
        spans.append((a, b))
for a, b in spans:
    libc.munmap(a, b - a)
r = libc.syscall(158, 0x2003, ctypes.c_ulong(spans[0][0]))
e = ctypes.get_errno()
os.write(1, b"map_vdso %d %d\n" % (r, e))
os._exit(0)
"#;

#[test]
fn a_fresh_vdso_is_refused_and_reported() {
    let s = Scratch::new("det-map-vdso");
    let policy = s.write("virtual.toml", VIRTUAL);
    let o = wfjail(&[
        "run",
        "-p",
        policy.to_str().unwrap(),
        "--ro",
        "/proc",
        "--raw",
        "--",
        PY,
        "-c",
        MAP_FRESH_VDSO,
    ]);
    o.check(
        line(&o, "map_vdso") == format!("-1 {}", libc::EPERM),
        "arch_prctl(ARCH_MAP_VDSO_64): EPERM",
    );
    let v = o.assert_violation("arch_prctl", "clock");
    o.check(
        v["args"].as_str().unwrap().contains("ARCH_MAP_VDSO_64"),
        "the code is named",
    );
    o.check(
        v["hint"].as_str().unwrap().contains("real clock"),
        "the hint says why",
    );
    // The thread pointer is still set and read (every C library does at start-up).
    let o = run_virtual(
        &s,
        Some(CLOCK),
        "1",
        &[
            PY,
            "-c",
            "import ctypes; l = ctypes.CDLL(None, use_errno=True); v = ctypes.c_ulong(); print('get_fs', l.syscall(158, 0x1003, ctypes.byref(v)), v.value != 0)",
        ],
    );
    o.check(line(&o, "get_fs") == "0 True", "ARCH_GET_FS still answers");
    o.check(o.status() == "ok", "status ok");
}

#[test]
fn monotonic_clocks_read_the_same_virtual_time_in_every_run_and_still_move() {
    let s = Scratch::new("det-monotonic");
    let code = "import time, asyncio\n\
                print('mono', time.monotonic_ns(), time.perf_counter_ns(), time.clock_gettime_ns(time.CLOCK_BOOTTIME), time.clock_gettime_ns(time.CLOCK_MONOTONIC_RAW))\n\
                async def f():\n    await asyncio.sleep(0)\n    return asyncio.get_running_loop().time()\n\
                print('loop', asyncio.run(f()))\n";
    let a = run_virtual(&s, Some(CLOCK), "3", &[PY, "-c", code]);
    let b = run_virtual(&s, Some(CLOCK), "3", &[PY, "-c", code]);
    for o in [&a, &b] {
        o.check(o.status() == "ok", "status ok");
        o.check(
            o.report["violations"].as_array().unwrap().is_empty(),
            "a monotonic read is not a violation",
        );
    }
    a.check(
        line(&a, "mono") == line(&b, "mono"),
        "time.monotonic_ns(), perf_counter_ns(), CLOCK_BOOTTIME, CLOCK_MONOTONIC_RAW: the same in both runs",
    );
    a.check(
        line(&a, "loop") == line(&b, "loop"),
        "asyncio's loop.time(): the same in both runs",
    );
    let reads: Vec<i64> = line(&a, "mono")
        .split(' ')
        .map(|v| v.parse().unwrap())
        .collect();
    a.check(
        reads.windows(2).all(|w| w[1] > w[0]),
        "each read is later than the one before",
    );
}

const PROCESS_FACTS: &str = r#"
import json, os, time, resource, signal, threading
IMPORTED = time.time()
IMPORTED_MONO = time.monotonic_ns()
got = []
def facts(req):
    signal.signal(signal.SIGUSR1, lambda *a: got.append(1))
    os.kill(os.getpid(), signal.SIGUSR1)
    signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return json.dumps([IMPORTED, IMPORTED_MONO, os.getpid(), len(got), ru.ru_utime + ru.ru_stime,
                       ru.ru_maxrss, ru.ru_minflt, time.monotonic_ns(), 0,
                       os.times().elapsed, threading.get_native_id()]).encode()
"#;

const PROCESS_WORKER: &str = r#"
c = Client()
out = []
for _ in range(2):
    with c.session(handler=MOD + ":facts", seed=1, time_ns=1_000_000_000_000) as s:
        out.append(json.loads(s.call(b"a")))
print(json.dumps(out))
"#;

#[test]
fn sessions_read_the_same_pid_usage_and_import_time_in_every_run() {
    for zygote in [true, false] {
        let (s, module) =
            serve_scratch("det-facts", "facts", PROCESS_FACTS, "", &[], PROCESS_WORKER);
        let policy = s.path("policy.toml").display().to_string();
        let worker = s.path("worker.py").display().to_string();
        let zygote_args = crate::common::zygote_args(&module, "1");
        let mut args = vec!["serve", "-p", &policy];
        if zygote {
            args.extend(zygote_args.iter().map(String::as_str));
        } else {
            let exec_worker = PROCESS_WORKER.replace(
                "handler=MOD + \":facts\"",
                "argv=[sys.executable, \"-c\", \"import importlib; from wfjail import guest; guest.run(importlib.import_module(%r).facts)\" % MOD]",
            );
            s.write(
                "worker.py",
                &std::fs::read_to_string(s.path("worker.py"))
                    .unwrap()
                    .replace(PROCESS_WORKER, &exec_worker),
            );
        }
        args.extend(["--", PY, &worker]);
        let out = wfjail_with(&args, |c| {
            c.current_dir(&s.0);
        });
        let mode = if zygote { "zygote" } else { "exec" };
        out.check(out.code == 0, &format!("{mode}: wfjail serve exits 0"));
        let r: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
        let (a, b) = (&r[0], &r[1]);
        out.check(a == b, &format!("{mode}: two sessions, the same facts"));
        // Imported in the zygote before any session: its fixed instant; in an exec-mode
        // session, the session's workflow time.
        let imported = if zygote { 946_684_800.0 } else { 1000.0 };
        out.check(
            a[0] == imported,
            &format!("{mode}: time.time() at import ({})", a[0]),
        );
        // The pid no process of a zygote's namespace has, or pid 1 of the session's own.
        let pid = if zygote { 4_194_303 } else { 1 };
        out.check(
            a[2] == pid,
            &format!("{mode}: os.getpid() is {pid} ({})", a[2]),
        );
        out.check(
            a[3] == 2,
            &format!("{mode}: a signal to os.getpid() and one to its thread reach the session"),
        );
        out.check(
            a[10] == pid,
            &format!("{mode}: threading.get_native_id() is the pid too"),
        );
        out.check(
            a[4] == 0.0 && a[5] == 0 && a[6] == 0,
            &format!("{mode}: getrusage: no CPU time, no pages ({a})"),
        );
    }
}

#[test]
fn resource_usage_times_and_uptime_are_pinned_under_the_virtual_clock() {
    let s = Scratch::new("det-usage");
    let code = "import os, time, resource, ctypes\n\
                ru = resource.getrusage(resource.RUSAGE_SELF)\n\
                t = os.times()\n\
                class SI(ctypes.Structure):\n    _fields_ = [('uptime', ctypes.c_long), ('loads', ctypes.c_ulong * 3), ('totalram', ctypes.c_ulong), ('freeram', ctypes.c_ulong)]\n\
                si = SI(); ctypes.CDLL(None).sysinfo(ctypes.byref(si))\n\
                print('usage', ru.ru_utime, ru.ru_stime, ru.ru_maxrss, ru.ru_minflt, ru.ru_nvcsw, t.user, t.system, t.elapsed, si.uptime, list(si.loads), si.freeram == si.totalram)\n";
    let a = run_virtual(&s, Some(CLOCK), "1", &[PY, "-c", code]);
    let b = run_virtual(&s, Some(CLOCK), "1", &[PY, "-c", code]);
    for o in [&a, &b] {
        o.check(o.status() == "ok", "status ok");
        o.check(
            o.report["violations"].as_array().unwrap().is_empty(),
            "not violations",
        );
    }
    a.check(
        line(&a, "usage") == line(&b, "usage"),
        "the same resource usage, times() and uptime in both runs",
    );
    a.check(
        line(&a, "usage").starts_with("0.0 0.0 0 0 0 0.0 0.0 "),
        "getrusage and times(): no CPU time, no pages, no switches",
    );
    a.check(
        line(&a, "usage").ends_with(" 1000 [0, 0, 0] True"),
        "sysinfo: a virtual uptime, no load, all memory free",
    );
}

#[test]
fn a_descriptors_times_are_the_workflow_time_for_pipes_devices_and_proc() {
    let s = Scratch::new("det-fstat");
    let policy = s.write("virtual.toml", VIRTUAL);
    let code = "import os\n\
                r, w = os.pipe(); os.write(w, b'x')\n\
                f = open('/proc/self/stat', 'rb')\n\
                n = os.open('/dev/null', os.O_RDONLY)\n\
                print('pipe', os.fstat(w).st_mtime_ns, os.fstat(r).st_atime_ns, os.fstat(w).st_ctime_ns)\n\
                print('stdout', os.fstat(1).st_mtime_ns)\n\
                print('proc', os.fstat(f.fileno()).st_mtime_ns)\n\
                print('devnull', os.stat(n, follow_symlinks=True).st_atime_ns)\n\
                print('python', os.fstat(os.open('/usr/bin/python3', os.O_RDONLY)).st_mtime_ns == os.stat('/usr/bin/python3').st_mtime_ns)\n";
    let o = wfjail(&[
        "run",
        "-p",
        policy.to_str().unwrap(),
        "--clock",
        CLOCK,
        "--ro",
        "/proc",
        "--ro",
        "/dev/null",
        "--raw",
        "--",
        PY,
        "-c",
        code,
    ]);
    o.check(o.status() == "ok", "status ok");
    let t = format!("{SECS}000000000");
    o.check(
        line(&o, "pipe") == format!("{t} {t} {t}"),
        "a pipe the guest wrote to: the workflow time",
    );
    o.check(line(&o, "stdout") == t, "its stdout: the workflow time");
    o.check(
        line(&o, "proc") == t,
        "a /proc file it opened: the workflow time",
    );
    o.check(line(&o, "devnull") == t, "a device: the workflow time");
    o.check(
        line(&o, "python") == "True",
        "a regular file keeps its own times",
    );
}

// Issue 16 red team (time): a session reading another process's CPU-time clock
// (`clock_gettime` of a pid-encoded clockid, `clock_getcpuclockid(pid)`): the zygote's
// (pid 1 of the namespace the sessions share) grows with every session it forked, and a
// sibling's tells what the sibling does. Under `clock = "virtual"` only the caller's own
// CPU clocks run; any other process's is EINVAL, as for a pid that does not exist.
const FOREIGN_CPU_CLOCK: &str = r#"
import json, os, time
def own_ns_pid():
    return int(os.readlink("/proc/self"))  # its pid in the namespace it shares
def clock_of(pid):
    return ((~pid) << 3) | 2  # MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)
def read(clockid):
    try:
        return time.clock_gettime_ns(clockid) > 0
    except OSError as e:
        return e.errno
def foreign(req):
    return json.dumps([read(clock_of(1)), read(clock_of(own_ns_pid())),
                       read(time.CLOCK_PROCESS_CPUTIME_ID), read(time.CLOCK_THREAD_CPUTIME_ID),
                       read(clock_of(0))]).encode()
"#;

const FOREIGN_WORKER: &str = r#"
c = Client()
with c.session(handler=MOD + ":foreign", seed=1, time_ns=1_000_000_000_000) as s:
    print(s.call(b"a").decode())
"#;

#[test]
fn a_session_reads_no_other_processes_cpu_clock() {
    let out = serve_one_zygote(
        "det-cpuclock",
        "foreign",
        FOREIGN_CPU_CLOCK,
        "",
        FOREIGN_WORKER,
    );
    out.check(out.code == 0, "wfjail serve exits 0");
    let r: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    out.check(
        r[0] == libc::EINVAL,
        &format!("the zygote's CPU clock (pid 1) is EINVAL ({r})"),
    );
    out.check(
        r[1] == true && r[2] == true && r[3] == true && r[4] == true,
        &format!("its own CPU clocks still run ({r})"),
    );
}

const PID_PROBE: &str = r#"
import ctypes, json, os, struct
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sc(nr, *a):
    a = [ctypes.c_long(x) for x in a]
    r = libc.syscall(ctypes.c_long(nr), *a)
    return r if r >= 0 else -ctypes.get_errno()
buf = ctypes.create_string_buffer(256)
addr = ctypes.addressof(buf)
def probe(req):
    me = int(os.readlink("/proc/self"))
    P = 4194303
    out = {}
    for name, nr, args in [
        ("kill_pinned", 62, (P, 0)), ("kill_neg_pinned", 62, (-P, 0)), ("kill_0", 62, (0, 0)),
        ("kill_m1", 62, (-1, 0)), ("kill_1", 62, (1, 0)), ("kill_me", 62, (me, 0)),
        ("kill_other", 62, (me + 1, 0)), ("tgkill_pinned", 234, (P, P, 0)), ("tkill_pinned", 200, (P, 0)),
        ("tgkill_1", 234, (1, 1, 0)), ("tkill_1", 200, (1, 0)),
        ("rt_sigqueueinfo_1", 129, (1, 0, addr)), ("rt_tgsigqueueinfo_1", 297, (1, 1, 0, addr)),
        ("rt_sigqueueinfo_pinned", 129, (P, 0, addr)),
        ("pidfd_open_1", 434, (1, 0)), ("pidfd_open_pinned", 434, (P, 0)),
        ("process_vm_readv_1", 310, (1, addr, 1, addr, 1, 0)),
        ("kcmp_1", 312, (1, me, 0, 0, 0)), ("setpriority_1", 141, (0, 1, 0)),
        ("setpriority_pinned", 141, (0, P, 0)), ("getpriority_1", 140, (0, 1)),
        ("sched_setaffinity_1", 203, (1, 8, addr)), ("sched_getaffinity_1", 204, (1, 8, addr)),
        ("sched_getparam_1", 143, (1, addr)), ("sched_rr_get_interval_1", 148, (1, addr)),
        ("prlimit64_1", 302, (1, 7, 0, addr)), ("prlimit64_pinned", 302, (P, 7, 0, addr)),
        ("waitid_1", 247, (1, 1, addr, 4, 0)), ("ptrace_1", 101, (16, 1, 0, 0)),
        ("getpgid_1", 121, (1,)), ("getsid_1", 124, (1,)), ("ioprio_get_1", 252, (1, 1)),
        ("clock_getres_cpu_1", 229, (((~1) << 3) | 2, addr)),
        ("clock_nanosleep_cpu_1", 230, (((~1) << 3) | 2, 1, addr, 0)),
        ("timer_create_cpu_1", 222, (((~1) << 3) | 2, 0, addr)),
    ]:
        out[name] = sc(nr, *args)
    return json.dumps(out).encode()
"#;

// Issue 16 red team (pids): a zygote session reaches only itself, by the pinned pid or its
// real one; every other way to a pid (the zygote's 1, a sibling's, a process group, -1) is
// refused by the filter or the router.
#[test]
fn a_session_reaches_only_itself_by_any_pid() {
    let worker = "c = Client()\nwith c.session(handler=MOD + \":probe\", seed=1, time_ns=1_000_000_000_000) as s:\n    print(s.call(b\"a\").decode())\n";
    let out = serve_one_zygote("det-pids", "probe", PID_PROBE, "", worker);
    out.check(out.code == 0, "wfjail serve exits 0");
    let r: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    for own in ["kill_pinned", "kill_me", "tgkill_pinned", "tkill_pinned"] {
        out.check(r[own] == 0, &format!("{own}: itself ({r})"));
    }
    for other in [
        "kill_neg_pinned",
        "kill_0",
        "kill_m1",
        "kill_1",
        "kill_other",
        "tgkill_1",
        "tkill_1",
        "rt_sigqueueinfo_1",
        "rt_tgsigqueueinfo_1",
        "rt_sigqueueinfo_pinned",
        "pidfd_open_1",
        "pidfd_open_pinned",
        "process_vm_readv_1",
        "kcmp_1",
        "setpriority_1",
        "setpriority_pinned",
        "sched_setaffinity_1",
        "prlimit64_1",
        "prlimit64_pinned",
        "ptrace_1",
        "clock_nanosleep_cpu_1",
        "timer_create_cpu_1",
    ] {
        out.check(r[other] == -libc::EPERM, &format!("{other}: refused ({r})"));
    }
}

// Issue 16 red team (router): a signal a session sends to its own real pid is let through by
// the router without a look at the session's notification budget; a loop of them must be
// stopped like any other flood (`limit`, `notifications`), not take the router's time from
// its siblings.
const KILL_FLOOD: &str = r#"
import os
def flood(req):
    me = int(os.readlink("/proc/self"))
    for _ in range(400_000):
        os.kill(me, 0)
    return b"returned"
"#;

#[test]
fn a_session_signalling_itself_in_a_loop_is_stopped_by_its_budget() {
    let worker = "c = Client()\ntry:\n    with c.session(handler=MOD + \":flood\", seed=1, time_ns=1_000_000_000_000, timeout=\"200s\") as s:\n        print(s.call(b\"a\").decode())\nexcept SessionFailed as e:\n    print(e.report[\"status\"], e.report.get(\"limit\"))\n";
    let out = serve_one_zygote("det-killflood", "flood", KILL_FLOOD, "", worker);
    out.check(
        out.stdout.trim() == "limit notifications",
        "the flood ends limit, notifications",
    );
}

const THREAD_PROBE: &str = r#"
import json, os, threading, time
def probe(req):
    got = {}
    def t():
        got["time"] = time.time()
        got["mono"] = time.monotonic()
        got["pid"] = os.getpid()
        got["rand"] = os.urandom(4).hex()
    th = threading.Thread(target=t); th.start(); th.join()
    got["main_time"] = time.time()
    return json.dumps(got).encode()
"#;

// Issue 16 red team (router): a zygote session's thread is the session's. The router found a
// session by the caller's pid in the namespace, which for a thread is its own id: a thread of
// a session (a policy allowing threads) was taken for a spare and read the host's real clock,
// its real monotonic clock and pid, and seed 0's randomness.
#[test]
fn a_sessions_thread_reads_the_sessions_time_pid_and_seed() {
    let worker = "c = Client()\nwith c.session(handler=MOD + \":probe\", seed=1, time_ns=1_000_000_000_000) as s:\n    print(s.call(b\"a\").decode())\nwith c.session(handler=MOD + \":probe\", seed=1, time_ns=1_000_000_000_000) as s:\n    print(s.call(b\"a\").decode())\n";
    let threads = "[process]\nthreads = \"allow\"\n[limits]\nprocesses = 16\n";
    let out = serve_one_zygote("det-thread", "probe", THREAD_PROBE, threads, worker);
    out.check(out.code == 0, "wfjail serve exits 0");
    let lines: Vec<serde_json::Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    out.check(lines.len() == 2, "two sessions answered");
    let r = &lines[0];
    out.check(
        r["time"] == 1000.0,
        &format!("the thread's time.time() is the workflow time ({r})"),
    );
    out.check(
        r["mono"].as_f64().unwrap() < 1001.0,
        &format!("its monotonic clock is the session's virtual one ({r})"),
    );
    out.check(
        r["pid"] == 4_194_303,
        &format!("its pid is the pinned one ({r})"),
    );
    // (How many monotonic reads come before the thread's depends on how the threads were
    // scheduled: its value may differ by a few ticks.)
    for key in ["time", "pid", "rand", "main_time"] {
        out.check(
            lines[0][key] == lines[1][key],
            &format!("{key}: the same in two sessions of the same seed"),
        );
    }
}

const FORK_PROBE: &str = r#"
import json, os, time
def probe(req):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(w, json.dumps([time.time(), time.monotonic(), os.getpid(), os.urandom(4).hex()]).encode())
        os._exit(0)
    os.close(w)
    got = os.read(r, 1000)
    os.waitpid(pid, 0)
    return got
"#;

// Issue 16 red team (router): a process a zygote session forked (a policy allowing
// subprocesses) is the session's. The router knew only the session's own process: the child
// was taken for a spare and read the host's real clock, real monotonic clock and pid, and
// seed 0's randomness.
#[test]
fn a_sessions_child_reads_the_sessions_time_and_seed() {
    let worker = "c = Client()\nfor _ in range(2):\n    with c.session(handler=MOD + \":probe\", seed=1, time_ns=1_000_000_000_000) as s:\n        print(s.call(b\"a\").decode())\n";
    let extra = "[process]\nsubprocess = \"allow\"\n[limits]\nprocesses = 16\n";
    let out = serve_one_zygote("det-child", "probe", FORK_PROBE, extra, worker);
    out.check(out.code == 0, "wfjail serve exits 0");
    let lines: Vec<serde_json::Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    out.check(lines.len() == 2, "two sessions answered");
    let r = &lines[0];
    out.check(
        r[0] == 1000.0,
        &format!("the child's time.time() is the workflow time ({r})"),
    );
    out.check(
        r[1].as_f64().unwrap() < 1001.0,
        &format!("its monotonic clock is the session's virtual one ({r})"),
    );
    out.check(
        r[3] == lines[1][3],
        &format!("its randomness is the session's seed's ({r} {})", lines[1]),
    );
}
