//! `wfjail serve`: a real worker (Python, using python/wfjail/client.py) drives real confined
//! sessions — forked from a zygote or exec'd — on this kernel.

use std::process::{Command, Stdio};

use crate::common::{Outcome, PY, REPO, Scratch, serve_scratch, wfjail_bin, wfjail_with};

/// Workflow modules the zygote preloads, named after the scratch dir so that a test can find
/// its own processes in /proc.
const WORKFLOWS: &str = r#"
import os, socket, threading, time
state = []
def mutate(req):
    state.append(req.decode())
    return ("%d:%s" % (len(state), ",".join(state))).encode()
def net(req):
    socket.create_connection(("127.0.0.1", 9))
def thread(req):
    threading.Thread(target=print).start()
def fork(req):
    os.fork()
def execv(req):
    os.execv("/bin/true", ["true"])
def crash(req):
    import ctypes
    ctypes.string_at(0)
def hang(req):
    while True:
        pass
def stdio(req):
    import stat
    return b"fifo" if all(stat.S_ISFIFO(os.fstat(fd).st_mode) for fd in (1, 2)) else b"inherited"
def whoami(req):
    # Its pid in the zygote's namespace (os.getpid() is pinned under temporal-python).
    return os.readlink("/proc/self").encode()
def signal_pid(req):
    import signal
    os.kill(int(req), signal.SIGKILL if int(req) != 1 else signal.SIGINT)
    return b"sent"
def signal_self(req):
    import signal
    signal.signal(signal.SIGUSR1, lambda *a: None)
    os.kill(os.getpid(), signal.SIGUSR1)
    return b"self ok"
def loop_forever(req):
    n = 0
    while True:
        n += 1
def ask(req):
    from wfjail import guest
    return b"|".join([guest.upcall(b"x" + req), guest.upcall(b"y" + req)])
def ask_unanswered(req):
    from wfjail import guest
    try:
        guest.upcall(b"?")
    except guest.UpcallError as e:
        return str(e).encode()
    return b"answered"
def swallow(req):
    try:
        socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        pass
    return b"swallowed"
def factory(init):
    prefix = init["prefix"]
    def handle(req):
        return (prefix + req.decode() + "|" + json_dumps(init)).encode()
    return handle
def json_dumps(v):
    import json
    from wfjail import guest
    assert guest.init_value() == v
    return json.dumps(v, sort_keys=True)
def linger(req):
    # A guest that does not exit once its input ends (as an atexit handler or a finalizer
    # that never returns would keep it): the guest's own exit spins.
    def never(status):
        while True:
            pass
    os._exit = never
    return b"lingering"
def slow(req):
    # Busy for a while without reading the clock: under the virtual clock every read is an
    # answer of the supervisor's, and a spin on it meets the notification budget.
    n = 0
    for i in range(3_000_000):
        n += i
    return b"slow done"
"#;

/// A scratch directory with the workflow module, a policy that lets the Debian interpreter
/// import the wfjail package, and the worker script.
fn fixture(tag: &str, worker: &str, policy_extra: &str) -> (Scratch, String) {
    serve_scratch(tag, "wf", WORKFLOWS, policy_extra, &[], worker)
}

/// The arguments of `wfjail serve` with the fixture's policy and worker; `zygote`: prefork
/// mode (2 zygotes unless `args` says how many).
fn serve_args(s: &Scratch, module: &str, zygote: bool, args: &[&str]) -> Vec<String> {
    let mut all = vec!["serve".to_string(), "-p".into()];
    all.push(s.path("policy.toml").display().to_string());
    all.extend(args.iter().map(|a| a.to_string()));
    if zygote {
        all.extend(["--zygote", "--python", PY, "--preload", module].map(String::from));
        if !args.contains(&"--zygotes") {
            all.extend(["--zygotes", "2"].map(String::from));
        }
    }
    all.extend([
        "--".into(),
        PY.into(),
        s.path("worker.py").display().to_string(),
    ]);
    all
}

/// Runs `wfjail serve` (see [`serve_args`]) in the fixture's directory until the worker ends.
pub(super) fn serve(s: &Scratch, module: &str, zygote: bool, args: &[&str]) -> Outcome {
    let all = serve_args(s, module, zygote, args);
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    wfjail_with(&all, |c| {
        c.current_dir(&s.0);
    })
}

/// Asserts that the server and its worker exited 0, and parses what the worker printed.
fn worker_json(out: &Outcome) -> serde_json::Value {
    out.check(out.code == 0, "wfjail serve exits 0");
    serde_json::from_str(out.stdout.trim()).unwrap()
}

/// Processes whose command line mentions `needle` (ours: the module names are unique).
fn processes_with(needle: &str) -> Vec<u32> {
    let mut found = vec![];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline"))
            && String::from_utf8_lossy(&cmd).contains(needle)
        {
            found.push(pid);
        }
    }
    found
}

#[test]
fn a_thousand_sessions_each_see_fresh_state() {
    let worker = r#"
from concurrent.futures import ThreadPoolExecutor
c = Client()
ppid = os.getppid()
def fds():
    # Session threads close their descriptors just after the worker got CLOSED: settle.
    import time
    counts = []
    for _ in range(20):
        counts.append(len(os.listdir("/proc/%d/fd" % ppid)))
        time.sleep(0.05)
    return min(counts)
def one(i):
    with c.session(handler=MOD + ":mutate") as s:
        a = s.call(b"a%d" % i)
        b = s.call(b"b%d" % i)
    assert a == b"1:a%d" % i, a
    assert b == b"2:a%d,b%d" % (i, i), b
    assert s.report["status"] == "ok", s.report
    return s.report["duration_ms"]
with ThreadPoolExecutor(8) as pool:
    list(pool.map(one, range(50)))       # warm up
    # Every zygote running (the others start once zygote 0 has settled): theirs are counted.
    while c.status()["zygotes_ready"] < c.status()["zygotes"]:
        time.sleep(0.05)
    before = fds()
    durations = list(pool.map(one, range(1000)))
    after = fds()
print(json.dumps({"sessions": len(durations), "fds_before": before, "fds_after": after}))
"#;
    let (s, module) = fixture("thousand", worker, "");
    let out = serve(&s, &module, true, &["-q"]);
    let r = worker_json(&out);
    assert_eq!(r["sessions"], 1000);
    assert_eq!(
        r["fds_before"], r["fds_after"],
        "wfjail's descriptors stay flat: {r}"
    );
    assert!(
        processes_with(&module).is_empty(),
        "no zygote or child outlives the worker"
    );
}

#[test]
fn denied_calls_raise_violations_and_siblings_keep_running() {
    let worker = r#"
import threading
c = Client()
results = {}
def long_one():
    with c.session(handler=MOD + ":slow") as s:
        results["slow"] = [s.call(b"1"), s.call(b"2")]
t = threading.Thread(target=long_one); t.start()
for name in ["net", "thread", "fork", "execv"]:
    try:
        with c.session(handler=MOD + ":" + name) as s:
            s.call(b"x")
            results[name] = "no error"
    except Violation as v:
        results[name] = [v.category, v.syscall, s.report["status"], s.report["violations"][0]["syscall"]]
t.join()
results["slow"] = [r.decode() for r in results["slow"]]
print(json.dumps(results))
"#;
    let (s, module) = fixture("violations", worker, "");
    let out = serve(&s, &module, true, &[]);
    let r = worker_json(&out);
    assert_eq!(
        r["net"],
        serde_json::json!(["network", "socket", "violation", "socket"])
    );
    assert_eq!(
        r["thread"],
        serde_json::json!(["thread", "clone", "violation", "clone"])
    );
    assert_eq!(
        r["fork"],
        serde_json::json!(["subprocess", "clone", "violation", "clone"])
    );
    assert_eq!(
        r["execv"],
        serde_json::json!(["exec", "execve", "violation", "execve"])
    );
    assert_eq!(
        r["slow"],
        serde_json::json!(["slow done", "slow done"]),
        "the sibling session was undisturbed"
    );
    assert!(
        out.stderr.contains("session") && out.stderr.contains("violation: network socket("),
        "{}",
        out.stderr
    );
}

#[test]
fn sessions_cannot_signal_each_other_or_the_zygote() {
    let worker = r#"
c = Client()
out = {}
with c.session(handler=MOD + ":whoami") as a:
    pid_a = a.call(b"")
    for target in [pid_a, b"1"]:
        try:
            with c.session(handler=MOD + ":signal_pid") as b:
                out[target.decode()] = b.call(target).decode()
        except Violation as v:
            out["victim" if target != b"1" else "zygote"] = [v.category, v.syscall, b.report["violations"][0]["action"]]
    out["a still answers"] = a.call(b"").decode() == pid_a.decode()
with c.session(handler=MOD + ":signal_self") as s:
    out["self"] = s.call(b"").decode()
with c.session(handler=MOD + ":mutate") as s:
    out["zygote alive"] = s.call(b"z").decode()
print(json.dumps(out, sort_keys=True))
"#;
    let (s, module) = fixture("signals", worker, "");
    // One zygote: every child in one PID namespace, where pids could reach each other.
    let out = serve(&s, &module, true, &["--zygotes", "1"]);
    let r = worker_json(&out);
    assert_eq!(
        r["victim"],
        serde_json::json!(["privilege", "kill", "denied"]),
        "{r}"
    );
    assert_eq!(
        r["zygote"],
        serde_json::json!(["privilege", "kill", "denied"]),
        "{r}"
    );
    assert_eq!(r["a still answers"], true);
    assert_eq!(r["self"], "self ok", "a child may signal itself");
    assert_eq!(r["zygote alive"], "1:z");
}

#[test]
fn crash_hang_and_kill_end_only_their_session() {
    let worker = r#"
c = Client()
out = {}
for name, timeout in [("crash", None), ("hang", "500ms"), ("net", None), ("mutate", None), ("stdio", None)]:
    try:
        with c.session(handler=MOD + ":" + name, timeout=timeout) as s:
            out[name] = s.call(b"x").decode()
    except SessionFailed as e:
        out[name] = [e.status, e.report.get("signal"), [v["action"] for v in e.report["violations"]]]
print(json.dumps(out))
"#;
    let (s, module) = fixture("failures", worker, "on_violation = \"kill\"");
    let out = serve(&s, &module, true, &[]);
    let r = worker_json(&out);
    assert_eq!(r["crash"], serde_json::json!(["crashed", "SIGSEGV", []]));
    assert_eq!(r["hang"], serde_json::json!(["timeout", "SIGKILL", []]));
    assert_eq!(
        r["net"],
        serde_json::json!(["violation", "SIGKILL", ["killed"]])
    );
    assert_eq!(r["mutate"], "1:x", "the server and the zygote go on");
    assert_eq!(
        r["stdio"], "fifo",
        "a guest's stdout and stderr are pipes, not wfjail's own stderr"
    );
}

#[test]
fn a_guest_that_does_not_exit_after_its_close_is_killed_and_its_report_says_why() {
    // Rule 3 of serve/phases.rs: the session is still closed (every call was answered), but
    // its report is a timeout that names the grace, not a crash without words.
    let worker = r#"
c = Client()
out = {}
for name in ("linger", "mutate"):
    with c.session(handler=MOD + ":" + name) as s:
        out[name] = s.call(b"x").decode()
    r = s.report
    out[name + "_report"] = [r["status"], r.get("signal"), r.get("error")]
print(json.dumps(out))
"#;
    let (s, module) = fixture("linger", worker, "");
    let out = serve(&s, &module, true, &["--zygotes", "1"]);
    let r = worker_json(&out);
    assert_eq!(r["linger"], "lingering");
    assert_eq!(r["linger_report"][0], "timeout", "{r}");
    assert_eq!(r["linger_report"][1], "SIGKILL", "{r}");
    let error = r["linger_report"][2].as_str().unwrap_or_default();
    assert!(
        error.contains("did not exit within 2 s") && error.contains("killed"),
        "{r}"
    );
    assert_eq!(
        r["mutate_report"],
        serde_json::json!(["ok", null, null]),
        "the next session is not touched: {r}"
    );
}

#[test]
fn a_guest_that_outlives_its_close_holds_no_slot_and_lingerers_are_bounded() {
    // Issue 27: one slot. A's guest never exits after its close; while it has its grace,
    // B opens (the slot is free: A lingers, counted apart). B's guest does not exit either:
    // as many guests as slots linger already, so A, the one that lingered longest, is
    // killed and B takes its place. C opens beside B; C's close (its guest exits at once)
    // displaces B in turn.
    let worker = r#"
import threading
c = Client()
out = {}
def lingering(n):
    while c.status()["lingering"] != n:
        time.sleep(0.01)
a = session("linger").open()
out["a"] = a.call(b"x").decode()
closing_a = threading.Thread(target=a.close)
closing_a.start()
lingering(1)
out["status"] = c.status()
b = session("linger").open()
out["b"] = b.call(b"x").decode()
closing_b = threading.Thread(target=b.close)
closing_b.start()
closing_a.join()
out["a_report"] = [a.report["status"], a.report.get("error")]
out["b_lingers"] = [b.report, c.status()["lingering"]]
with session("mutate") as s:
    out["c"] = s.call(b"c").decode()
closing_b.join()
out["b_report"] = [b.report["status"], b.report.get("error")]
out["after"] = c.status()
print(json.dumps(out))
"#;
    for zygote in [true, false] {
        let (r, _) = in_both_modes_with(
            "lingerslot",
            worker,
            "guest.run(getattr(m, sys.argv[1]))",
            zygote,
            &["--max-executions", "1", "--zygotes", "1"],
        );
        lingering_checks(&r);
    }
}

fn lingering_checks(r: &serde_json::Value) {
    assert_eq!(r["a"], "lingering");
    assert_eq!(
        (&r["status"]["open"], &r["status"]["lingering"]),
        (&0.into(), &1.into()),
        "{r}"
    );
    assert_eq!(r["b"], "lingering", "an OPEN beside a lingering guest: {r}");
    assert_eq!(r["a_report"][0], "timeout", "{r}");
    assert!(
        r["a_report"][1]
            .as_str()
            .unwrap_or_default()
            .contains("a newer closed guest needed its place (1 lingered"),
        "{r}"
    );
    // A ended (displaced) while B still lingered: B's report had not come yet.
    assert_eq!(r["b_lingers"], serde_json::json!([null, 1]), "{r}");
    assert_eq!(r["c"], "1:c", "{r}");
    assert_eq!(r["b_report"], r["a_report"], "{r}");
    assert_eq!(
        (&r["after"]["open"], &r["after"]["lingering"]),
        (&0.into(), &0.into()),
        "{r}"
    );
}

#[test]
fn a_worker_that_leaves_mid_call_takes_its_guest_along() {
    let worker = r#"
import socket, time
from wfjail import client as wc
def ours():
    n = 0
    for p in os.listdir("/proc"):
        try:
            if p.isdigit() and MOD.encode() in open("/proc/%s/cmdline" % p, "rb").read():
                n += 1
        except OSError:
            pass
    return n
with Client().session(handler=MOD + ":mutate") as s:   # warm: zygotes and spares exist
    s.call(b"x")
# Every zygote running and settled (the others start once zygote 0 has settled, and each
# replaces its spare at SETTLED): the processes counted as the base are all there.
while Client().status().get("zygotes_settled", 0) < Client().status()["zygotes"]:
    time.sleep(0.05)
time.sleep(0.3)
base = ours()
conn = socket.socket(socket.AF_UNIX); conn.connect(os.environ["WFJAIL_SOCKET"])
conn.sendall(wc._frame(wc.OPEN, json.dumps({"handler": MOD + ":hang", "timeout": "60s"})))
conn.sendall(wc._frame(wc.CALL, b"spin"))
time.sleep(0.5)
during = ours()
conn.close()                                              # the worker goes away mid-call
t = time.time()
while ours() > base and time.time() - t < 10:
    time.sleep(0.1)
print(json.dumps({"during": during - base, "after": ours() - base, "seconds": round(time.time() - t)}))
"#;
    let (s, module) = fixture("abandon", worker, "");
    let out = serve(&s, &module, true, &["-q"]);
    let r = worker_json(&out);
    assert!(
        r["during"].as_i64().unwrap() >= 1,
        "the spinning guest ran: {r}"
    );
    assert_eq!(r["after"], 0, "it was killed after the worker left: {r}");
    // The call was running (a pipelined CALL is not lost), so only the grace period ends it:
    // not at once, and not after the 60s call timeout.
    let secs = r["seconds"].as_i64().unwrap();
    assert!(
        (1..=4).contains(&secs),
        "killed after the grace period: {r}"
    );
}

#[test]
fn a_worker_that_floods_calls_without_reading_answers_gets_its_session_failed() {
    // 200 CALLs to a guest that never answers, no answer read: at most 64 wait behind the
    // call in progress (serve/phases.rs), so the session ends with FAILED and says why, and
    // the server goes on serving.
    let worker = r#"
import socket, struct
from wfjail import client as wc
def read_exactly(conn, n):
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise EOFError("the server closed the connection")
        data += chunk
    return data
def read_frame(conn):
    length, kind = struct.unpack("<IB", read_exactly(conn, 5))
    return kind, read_exactly(conn, length - 1)
conn = socket.socket(socket.AF_UNIX); conn.connect(os.environ["WFJAIL_SOCKET"])
conn.sendall(wc._frame(wc.OPEN, json.dumps({"handler": MOD + ":hang", "timeout": "60s"})))
assert read_frame(conn)[0] == wc.OPENED
conn.sendall(wc._frame(wc.CALL, b"spin") * 200)
kind, body = read_frame(conn)
report = json.loads(body)
out = {"kind": wc._NAMES.get(kind), "status": report["status"], "signal": report.get("signal"),
       "error": report.get("error"), "then": conn.recv(1)}
with Client().session(handler=MOD + ":mutate") as s:
    out["still serves"] = s.call(b"x").decode()
out["then"] = out["then"].decode()
print(json.dumps(out))
"#;
    let (s, module) = fixture("callflood", worker, "");
    let out = serve(&s, &module, true, &["-q"]);
    let r = worker_json(&out);
    assert_eq!(
        r,
        serde_json::json!({
            "kind": "FAILED",
            "status": "crashed",
            "signal": "SIGKILL",
            "error": format!(
                "the worker queued more than 64 calls or {} bytes of requests without waiting \
                 for their answers",
                32 << 20
            ),
            "then": "",
            "still serves": "1:x",
        }),
        "the session ended with FAILED (its guest killed), the connection closed after it"
    );
}

#[test]
fn a_dead_zygote_is_reported_and_restarted() {
    let worker = r#"
import signal, time
c = Client()
with c.session(handler=MOD + ":mutate") as s:
    first = s.call(b"x").decode()
# Kill every zygote from outside (the test's own processes), then ask again.
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    try:
        cmd = open("/proc/%s/cmdline" % pid, "rb").read()
    except OSError:
        continue
    if b"wfjail.zygote" in cmd and MOD.encode() in cmd:
        os.kill(int(pid), signal.SIGKILL)
deadline = time.time() + 30
while True:
    try:
        with c.session(handler=MOD + ":mutate") as s:
            again = s.call(b"y").decode()
        break
    except SessionFailed:
        if time.time() > deadline:
            raise
        time.sleep(0.1)
print(json.dumps([first, again]))
"#;
    let (s, module) = fixture("restart", worker, "");
    let out = serve(&s, &module, true, &[]);
    out.check(out.code == 0, "wfjail serve exits 0");
    assert_eq!(out.stdout.trim(), r#"["1:x", "1:y"]"#);
    assert!(
        out.stderr.contains("died") && out.stderr.contains("restarted"),
        "{}",
        out.stderr
    );
}

#[test]
fn exec_mode_runs_a_fresh_guest_per_session() {
    let worker = format!(
        r#"
c = Client()
argv = [{py:?}, {ex:?}]
out = []
for i in range(2):
    with c.session(argv=argv) as s:
        out.append(json.loads(s.call(open({req:?}, "rb").read()))["total"])
    out.append(s.report["status"])
print(json.dumps(out))
"#,
        py = PY,
        ex = format!("{REPO}/examples/workflow_guest.py"),
        req = format!("{REPO}/examples/request.json"),
    );
    let (s, module) = fixture("exec", &worker, "");
    let out = serve(&s, &module, false, &["--ro", REPO]);
    out.check(out.code == 0, "wfjail serve exits 0");
    assert_eq!(out.stdout.trim(), r#"["20.03", "ok", "20.03", "ok"]"#);
}

#[test]
fn the_worker_status_is_wfjails_and_sigterm_ends_everything() {
    let (s, module) = fixture("status", "c = Client()\nsys.exit(7)\n", "");
    let out = serve(&s, &module, true, &["-q"]);
    assert_eq!(out.code, 7, "the worker's exit status: {}", out.stderr);

    // A worker that waits forever; SIGTERM to wfjail reaches it, and everything ends.
    let (s, module) = fixture(
        "sigterm",
        "import signal, time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(3))\nprint('up', flush=True)\ntime.sleep(600)\n",
        "",
    );
    let mut child = Command::new(wfjail_bin())
        .current_dir(&s.0)
        .args(serve_args(&s, &module, true, &["-q", "--zygotes", "1"]))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "up");
    assert!(!processes_with(&module).is_empty(), "the zygote runs");
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(3), "exits with the worker's status");
    assert!(
        processes_with(&module).is_empty(),
        "no zygote or child survives"
    );
}

#[test]
fn upcalls_a_guest_asks_the_worker_during_a_call_in_both_modes() {
    let worker = r#"
c = Client()
asked = []
def on_upcall(question):
    asked.append(question.decode())
    if question.startswith(b"y"):
        return question.upper()
    return question[::-1]
out = {}
with session("ask", on_upcall=on_upcall) as s:
    out["first"] = s.call(b"ab").decode()
    out["second"] = s.call(b"cd").decode()
with session("ask_unanswered") as s:
    out["no_handler"] = s.call(b"").decode()
def boom(question):
    raise ValueError("not today")
with session("ask_unanswered", on_upcall=boom) as s:
    out["handler_failed"] = s.call(b"").decode()
out["asked"] = asked
print(json.dumps(out))
"#;
    for zygote in [true, false] {
        let (r, out) = in_both_modes(
            "upcall",
            worker,
            "guest.run(getattr(m, sys.argv[1]))",
            zygote,
        );
        assert_eq!(r["first"], "bax|YAB", "zygote={zygote}: {}", out.stderr);
        assert_eq!(r["second"], "dcx|YCD");
        assert_eq!(
            r["asked"],
            serde_json::json!(["xab", "yab", "xcd", "ycd"]),
            "each question once, in order"
        );
        assert!(
            r["no_handler"]
                .as_str()
                .unwrap()
                .contains("this session has no upcall handler"),
            "{}",
            r["no_handler"]
        );
        assert_eq!(r["handler_failed"], "ValueError: not today");
    }
    // `wfjail run` has no worker: the guest hears so (framed, one call).
    let s = Scratch::new("upcall-run");
    let lib = crate::common::python_lib(&s);
    let guest = s.write(
        "guest.py",
        &format!(
            "import sys\nsys.path.insert(0, {lib:?})\nfrom wfjail import guest\n\
             def h(req):\n    try:\n        guest.upcall(b'?')\n    except guest.UpcallError as e:\n        return str(e)\n    return 'answered'\n\
             guest.run(h)\n"
        ),
    );
    let input = s.write("request", "");
    let o = crate::common::wfjail(&[
        "run",
        "-p",
        "temporal-python",
        "--ro",
        &lib,
        "--ro",
        &s.0.display().to_string(),
        "--input",
        &input.display().to_string(),
        "--",
        PY,
        &guest.display().to_string(),
    ]);
    o.check(o.status() == "ok", "run: ok");
    o.check(
        o.stdout
            .contains("no worker to ask: UPCALL needs a wfjail serve session"),
        "run answers an UPCALL with why there is no answer",
    );
}

#[test]
fn a_worker_interrupts_a_call_that_runs_too_long_and_the_session_goes_on() {
    let worker = r#"
c = Client()
out = {}
with session("loop_forever") as s:
    threading.Timer(0.3, s.interrupt).start()
    try:
        s.call(b"x")
        out["first"] = "returned"
    except GuestError as e:
        out["first"] = [e.type, "loop_forever" in e.traceback]
    s.interrupt()  # outside a call: nothing happens
    threading.Timer(0.3, s.interrupt).start()
    try:
        s.call(b"y")
    except GuestError as e:
        out["second"] = e.type
out["report"] = s.report["status"]
print(json.dumps(out))
"#;
    for zygote in [true, false] {
        let (r, out) = in_both_modes(
            "interrupt",
            worker,
            "guest.run(getattr(m, sys.argv[1]))",
            zygote,
        );
        assert_eq!(
            r["first"],
            serde_json::json!(["wfjail.Interrupted", true]),
            "zygote={zygote}: the call answers where it was: {}",
            out.stderr
        );
        assert_eq!(
            r["second"], "wfjail.Interrupted",
            "the same session, a second call"
        );
        assert_eq!(r["report"], "ok", "nothing was killed");
    }
}

#[test]
fn a_full_server_answers_busy_at_once_and_says_its_capacity() {
    let worker = r#"
c = Client()
out = {"status0": c.status()}
s1 = c.session(handler=MOD + ":mutate").open()
out["status1"] = c.status()
t = time.monotonic()
try:
    c.session(handler=MOD + ":mutate").open()
    out["busy"] = "opened"
except Busy as b:
    out["busy"] = [b.capacity, b.open, str(b)]
out["busy_fast"] = time.monotonic() - t < 1.0
out["first"] = s1.call(b"a").decode()
s1.close()
with c.session(handler=MOD + ":mutate") as s2:
    out["after"] = s2.call(b"b").decode()
print(json.dumps(out))
"#;
    let (s, module) = fixture("busy", worker, "");
    let out = serve(
        &s,
        &module,
        true,
        &["--max-executions", "1", "--zygotes", "1"],
    );
    let r = worker_json(&out);
    let status = |k: &str| {
        (
            r[k]["capacity"].clone(),
            r[k]["open"].clone(),
            r[k]["mode"].clone(),
        )
    };
    assert_eq!(status("status0"), (1.into(), 0.into(), "zygote".into()));
    assert_eq!(status("status1"), (1.into(), 1.into(), "zygote".into()));
    assert_eq!(r["busy"][0], 1);
    assert_eq!(r["busy"][1], 1);
    assert!(
        r["busy"][2]
            .as_str()
            .unwrap()
            .contains("raise --max-executions"),
        "{}",
        r["busy"]
    );
    assert_eq!(r["busy_fast"], true, "BUSY without waiting for a slot");
    assert_eq!(r["first"], "1:a", "the open session was not disturbed");
    assert_eq!(
        r["after"], "1:b",
        "a slot freed by CLOSE serves the next session"
    );
}

/// Runs `worker` under `wfjail serve` in zygote mode, or (`zygote` false) in exec mode with
/// `EXEC_MODE=1` in the worker's environment and a `guest.py` that imports the fixture's
/// module as `m` and then runs `guest_line`; the worker gets `session(name, **kw)`, which
/// opens handler `name` in either mode. The worker's JSON, and the outcome.
fn in_both_modes(
    tag: &str,
    worker: &str,
    guest_line: &str,
    zygote: bool,
) -> (serde_json::Value, Outcome) {
    in_both_modes_with(tag, worker, guest_line, zygote, &[])
}

/// [`in_both_modes`], with more arguments for `wfjail serve`.
fn in_both_modes_with(
    tag: &str,
    worker: &str,
    guest_line: &str,
    zygote: bool,
    args: &[&str],
) -> (serde_json::Value, Outcome) {
    // `session(name, **kw)` opens a session of handler `name` in either mode.
    let worker = format!(
        "def session(name, **kw):\n    if os.environ.get(\"EXEC_MODE\"):\n        return Client().session(argv=[\"/usr/bin/python3\", DIR + \"/guest.py\", name], **kw)\n    return Client().session(handler=MOD + \":\" + name, **kw)\n{worker}"
    );
    let (s, module) = fixture(tag, &worker, "");
    s.write(
        "guest.py",
        &format!(
            "import sys\nsys.path.insert(0, {dir:?})\nimport {module} as m\nfrom wfjail import guest\n{guest_line}\n",
            dir = s.0.display().to_string()
        ),
    );
    let all = serve_args(&s, &module, zygote, args);
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    let out = wfjail_with(&all, |c| {
        c.current_dir(&s.0);
        if !zygote {
            c.env("EXEC_MODE", "1");
        }
    });
    (worker_json(&out), out)
}

#[test]
fn a_denial_the_workflow_swallowed_still_reaches_the_worker_with_the_result() {
    // The same worker in both modes: OPEN names the handler (zygote) or a guest command that
    // runs it (exec).
    let worker = r#"
c = Client()
out = {}
with session("swallow") as s:
    out["reply"] = s.call(b"x").decode()
    out["violations"] = [[v["category"], v["syscall"], v["args"]] for v in s.violations]
    out["again"] = s.call(b"y").decode()
    out["second"] = [v["syscall"] for v in s.violations]
with session("mutate") as s:
    s.call(b"z")
    out["clean"] = s.violations
print(json.dumps(out))
"#;
    for zygote in [true, false] {
        let (r, out) = in_both_modes(
            "swallow",
            worker,
            "guest.run(getattr(m, sys.argv[1]))",
            zygote,
        );
        assert_eq!(r["reply"], "swallowed", "zygote={zygote}: {}", out.stderr);
        assert_eq!(
            r["violations"],
            serde_json::json!([["network", "socket", "AF_INET SOCK_STREAM|SOCK_CLOEXEC"]]),
            "the call's violation comes with its result (zygote={zygote})"
        );
        assert_eq!(r["again"], "swallowed");
        assert_eq!(
            r["second"],
            serde_json::json!(["socket"]),
            "counted again in the second call"
        );
        assert_eq!(r["clean"], serde_json::json!([]), "a clean call has none");
    }
}

#[test]
fn open_carries_the_sessions_arguments_in_both_modes() {
    let worker = r#"
c = Client()
init = {"prefix": "wf-", "args": [1, "two", None], "nested": {"k": True}}
out = {}
if os.environ.get("EXEC_MODE"):
    s = c.session(argv=["/usr/bin/python3", DIR + "/guest.py"], init=init)
else:
    s = c.session(handler=MOD + ":factory", init=init)
with s:
    out["reply"] = s.call(b"a").decode()
try:
    with c.session(handler=MOD + ":factory", argv=None, init={"big": "x" * 40000}) as s:
        s.call(b"a")
    out["big"] = "opened"
except SessionFailed as e:
    out["big"] = e.report["error"]
print(json.dumps(out))
"#;
    for zygote in [true, false] {
        // Exec mode: a guest that builds its handler the same way, from WFJAIL_INIT.
        let (r, out) = in_both_modes(
            "init",
            worker,
            "guest.run(m.factory(guest.init_value()))",
            zygote,
        );
        assert_eq!(
            r["reply"],
            r#"wf-a|{"args": [1, "two", null], "nested": {"k": true}, "prefix": "wf-"}"#,
            "zygote={zygote}: {}",
            out.stderr
        );
        assert!(
            r["big"]
                .as_str()
                .unwrap()
                .contains("at most 32768 are accepted"),
            "an init over the bound is refused before anything starts: {}",
            r["big"]
        );
    }
}

/// Runs the Python script `path` in `dir` and parses the JSON it printed (its stderr in the
/// panic when it printed none).
fn run_json(path: &std::path::Path, dir: &std::path::Path) -> serde_json::Value {
    let out = Command::new(PY)
        .arg(path)
        .current_dir(dir)
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stderr));
    })
}

/// Whether process `pid` ended (gone, or a zombie) within 30 s: a backstop, not a timing.
fn ended_within_30s(pid: u64) -> bool {
    (0..600).any(|_| {
        let alive = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|st| !st.contains(") Z "));
        if alive {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        !alive
    })
}

/// `wfjail serve` without a worker command, serving `sock` in zygote mode.
fn socket_server_args(s: &Scratch, module: &str, sock: &str, extra: &[&str]) -> Vec<String> {
    let mut all: Vec<String> = ["serve", "-q", "-p"].map(String::from).to_vec();
    all.push(s.path("policy.toml").display().to_string());
    all.extend(["--socket".to_string(), sock.to_string()]);
    all.extend(crate::common::zygote_args(module, "1"));
    all.extend(extra.iter().map(|a| a.to_string()));
    all
}

#[test]
fn without_a_worker_command_wfjail_serves_its_socket_until_sigterm_or_its_parent_ends() {
    // A worker started on its own: it waits for the server (STATUS), opens a session, calls.
    let worker = r#"
for _ in range(600):
    try:
        status = Client().status()
        break
    except OSError:
        time.sleep(0.05)
with Client().session(handler=MOD + ":mutate") as s:
    reply = s.call(b"a").decode()
print(json.dumps({"status": status, "reply": reply, "report": s.report["status"]}))
"#;
    let (s, module) = fixture("socket-only", worker, "");
    let sock = s.path("serve.sock").display().to_string();
    let mut server = Command::new(wfjail_bin())
        .current_dir(&s.0)
        .args(socket_server_args(&s, &module, &sock, &[]))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = Command::new(PY)
        .arg(s.path("worker.py"))
        .env("WFJAIL_SOCKET", &sock)
        .output()
        .unwrap();
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stderr));
    });
    assert_eq!(r["status"]["mode"], "zygote");
    assert_eq!(
        (r["reply"].clone(), r["report"].clone()),
        ("1:a".into(), "ok".into())
    );
    Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status()
        .unwrap();
    let status = server.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(0),
        "SIGTERM ends a server without a worker with 0"
    );
    assert!(
        !std::path::Path::new(&sock).exists(),
        "the socket is removed"
    );
    assert!(processes_with(&module).is_empty(), "no zygote survives");

    // A worker that starts the server itself with --exit-with-parent takes it along.
    let runner = format!(
        r#"
import subprocess
server = subprocess.Popen({args:?}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
os.environ["WFJAIL_SOCKET"] = {sock:?}
for _ in range(600):
    try:
        Client().status()
        break
    except OSError:
        time.sleep(0.05)
with Client().session(handler=MOD + ":mutate") as s:
    reply = s.call(b"b").decode()
print(json.dumps({{"server": server.pid, "reply": reply}}))
"#,
        args = std::iter::once(wfjail_bin().display().to_string())
            .chain(socket_server_args(
                &s,
                &module,
                &sock,
                &["--exit-with-parent"]
            ))
            .collect::<Vec<_>>(),
    );
    let path = s.path("runner.py");
    let prelude = std::fs::read_to_string(s.path("worker.py")).unwrap();
    let prelude = &prelude[..prelude.find("for _ in range").unwrap()];
    std::fs::write(&path, format!("{prelude}{runner}")).unwrap();
    let r = run_json(&path, &s.0);
    assert_eq!(r["reply"], "1:b");
    let pid = r["server"].as_u64().unwrap();
    // The runner has exited: the server follows.
    let gone = ended_within_30s(pid);
    assert!(gone, "the server ended with the process that started it");
    assert!(processes_with(&module).is_empty(), "no zygote survives");
}

#[test]
fn guests_stopped_between_calls_survive_their_workers_process_group_becoming_orphaned() {
    // The kernel sends SIGHUP (then SIGCONT) to every process of a process group that becomes
    // orphaned while one of its members is stopped. serve's guests sit stopped between calls:
    // in the worker's group, a worker started from a shell that then exits lost every cached
    // run at once ("killed by SIGHUP"), and serve itself took the SIGHUP as a request to stop.
    // Here `sh` leads a process group of its own (its parent, this runner, is in another
    // group of the same session) and starts serve in it; a session's guest answers a call
    // and is stopped; `sh` is killed: the group is orphaned.
    let runner = r#"
import signal, subprocess
def stat(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return fields[0], int(fields[2]), int(fields[3])  # state, pgrp, session
# serve's output to a file: on the runner's, it would hold the test's pipes open.
holder = subprocess.Popen(["sh", "-c", '"$@" >/dev/null 2>serve.log & echo $!; read x', "sh"] + ARGS,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, process_group=0)
server = int(holder.stdout.readline())
try:
    exec(BODY)
except BaseException as e:  # the test ends the server either way: say which, and why
    print(json.dumps({"server": server, "error": repr(e)}))
"#;
    let body = r#"
for _ in range(600):
    try:
        Client().status()
        break
    except OSError:
        time.sleep(0.05)
ours = lambda: [p for p in map(int, filter(str.isdigit, os.listdir("/proc")))
                if p != server and MOD.encode() in open("/proc/%d/cmdline" % p, "rb").read()]
with Client().session(handler=MOD + ":mutate") as s:
    first = s.call(b"a").decode()
    stopped = []
    for _ in range(600):  # serve stops the guest after its answer (a backstop, not a timing)
        stopped = [p for p in ours() if stat(p)[0] == "T"]
        if stopped:
            break
        time.sleep(0.05)
    holder.kill()
    holder.wait()
    second = s.call(b"b").decode()
groups = {p: stat(p)[1:] for p in ours()}
print(json.dumps({"server": server, "server_ids": stat(server)[1:], "holder": holder.pid,
                  "stopped": len(stopped), "first": first, "second": second,
                  "report": s.report["status"], "guests": groups}))
"#;
    let (s, module) = fixture("orphaned-group", "", "");
    let sock = s.path("serve.sock").display().to_string();
    let args: Vec<String> = std::iter::once(wfjail_bin().display().to_string())
        .chain(socket_server_args(&s, &module, &sock, &[]))
        .collect();
    let prelude = std::fs::read_to_string(s.path("worker.py")).unwrap();
    let path = s.path("runner.py");
    std::fs::write(
        &path,
        format!(
            "{prelude}\nos.environ['WFJAIL_SOCKET'] = {sock:?}\nARGS = {args:?}\nBODY = {body:?}\n{runner}"
        ),
    )
    .unwrap();
    let r = run_json(&path, &s.0);
    let server = r["server"].as_u64().unwrap();
    let end_server = || {
        Command::new("kill")
            .args(["-TERM", &server.to_string()])
            .status()
            .unwrap();
        ended_within_30s(server)
    };
    let result = (
        r["stopped"].as_u64(),
        r["first"].clone(),
        r["second"].clone(),
        r["report"].clone(),
    );
    let ended = end_server();
    assert_eq!(
        result,
        (Some(1), "1:a".into(), "2:a,b".into(), "ok".into()),
        "the guest was stopped when the group was orphaned, and went on: {r}"
    );
    // The guests (zygote, spare, session child) are in a session of their own, not serve's.
    let server_session = r["server_ids"][1].as_u64().unwrap();
    let guests = r["guests"].as_object().unwrap();
    assert!(guests.len() >= 2, "the zygote and its children: {r}");
    for (pid, ids) in guests {
        let session = ids[1].as_u64().unwrap();
        assert_ne!(
            session, server_session,
            "guest {pid} in serve's session: {r}"
        );
        assert_ne!(
            ids[0], r["server_ids"][0],
            "guest {pid} in serve's group: {r}"
        );
    }
    assert!(ended, "serve ends on SIGTERM");
    assert!(processes_with(&module).is_empty(), "no zygote survives");
}
