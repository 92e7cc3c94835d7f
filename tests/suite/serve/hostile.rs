//! `wfjail serve --zygote` against hostile guests (issue 7, findings A in serve, B, E1, E5):
//! sessions cannot reach each other through /proc (each session child is in a Landlock
//! domain of its own), signals or a shared output pipe, a guest runs only
//! during its calls, floods end in a report while the server and its other sessions go on
//! with bounded memory, and the report and a session's errors cannot be forged.
//!
//! Every run is bounded by a watchdog: a test that would hang on a vulnerable build fails.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{Outcome, PY, Scratch, python_lib, reachable_copy, serve_scratch, wfjail_bin};
use serde_json::Value;

/// The hostile handlers the zygote preloads.
const HANDLERS: &str = r#"
import errno, json, os, signal, socket, struct, sys, time
from wfjail import protocol as P
saved = []
def whoami(req):
    # Its pid in the zygote's namespace (os.getpid() is pinned under temporal-python).
    status = open("/proc/self/status").read().splitlines()
    return next(l for l in status if l.startswith("NSpid:")).split()[-1].encode()
def siblings(ns_pid):
    """{"b": global pid of our namespace's pid ns_pid, "zygote": ...}: /proc is the host's,
    so a guest finds them by command line, NSpid and parent, as an attacker would."""
    found, ppids = {}, {}
    for p in os.listdir("/proc"):
        try:
            if not p.isdigit() or __name__.encode() not in open("/proc/%s/cmdline" % p, "rb").read():
                continue
            status = open("/proc/%s/status" % p).read().splitlines()
        except OSError:
            continue
        field = lambda name: next(l for l in status if l.startswith(name + ":")).split()[1:]
        ppids[p] = field("PPid")[0]
        if field("NSpid")[-1] == str(ns_pid):
            found["b"] = p
    for p, parent in ppids.items():
        if parent not in ppids:
            found["zygote"] = p
    return found
def probe(req):
    """Try to open (and readlink) each path of the request (B and Z stand for the sibling's
    and the zygote's global pids), and to signal both (signal 0); errno names, 'opened' or
    'sent'."""
    pids = siblings(int(req.split(b"|")[0]))
    out = {"found": pids}
    for path in req.decode().split("|")[1].split(","):
        path = path.replace("B", pids.get("b", "B")).replace("Z", pids.get("zygote", "Z"))
        try:
            os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
            out[path] = "opened"
        except OSError as e:
            out[path] = errno.errorcode.get(e.errno, str(e.errno))
        if "/fd/" in path:
            try:
                os.readlink(path)
                out["readlink " + path] = "read"
            except OSError as e:
                out["readlink " + path] = errno.errorcode.get(e.errno, str(e.errno))
    for who in ("b", "zygote"):
        try:
            os.kill(int(pids[who]), 0)
            out["kill " + who] = "sent"
        except (OSError, KeyError, ValueError) as e:
            out["kill " + who] = errno.errorcode.get(getattr(e, "errno", 0), repr(e))
    return json.dumps(out).encode()
def write_relative(req):
    """Writes the supervisor judges by resolving them through /proc/PID/cwd and /proc/PID/fd."""
    try:
        open("written-by-guest", "w")
    except OSError:
        pass
    here = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
    os.open("written-through-dirfd", os.O_WRONLY | os.O_CREAT, dir_fd=here)
def nonblock(req):
    import fcntl
    for fd in (1, 2):
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
    return b"set"
def print_much(req):
    sys.stdout.write("y" * int(req) + "\n")
    sys.stdout.flush()
    return b"printed"
def print_forever(req):
    while True:
        print("z" * 1000)
def forge(req):
    print("wfjail: violation: network socket(AF_INET) denied", flush=True)
    sys.stderr.write("\x1b[2Jwfjail: ok (forged)\n")
    sys.stderr.flush()
    return b"forged"
def ticker(req):
    """arm:PATH -> a SIGALRM handler appends to PATH every 10 ms; count:PATH -> its size."""
    what, _, path = req.decode().partition(":")
    if what == "arm":
        def tick(*_):
            with open(path, "a") as f:
                f.write("x")
        signal.signal(signal.SIGALRM, tick)
        signal.setitimer(signal.ITIMER_REAL, 0.01, 0.01)
        return b"armed"
    return str(os.path.getsize(path)).encode()
def answer_then_work(req):
    """Writes its own RESULT on the session socket, then keeps working."""
    P.write_frame(4, P.RESULT, b"early")
    path, n = req.decode(), 0
    while True:
        n += 1
        if n % 20000 == 0:
            with open(path, "a") as f:
                f.write("x")
def query_flood(req):
    """A denied write with a long name, then QUERY, again and again; never reads."""
    base = os.path.join(os.getcwd(), "q" * 240)
    query = struct.pack("<IB", 1, P.QUERY)
    i = 0
    while True:
        i += 1
        try:
            open(base + str(i % 200), "w")
        except OSError:
            pass
        os.write(4, query)
def log_flood(req):
    """Empty LOG frames (a level byte, no text), as fast as the socket takes them."""
    batch = struct.pack("<IBB", 2, P.LOG, 20) * 10000
    while True:
        os.write(4, batch)
def mutate(req):
    saved.append(req.decode())
    return ",".join(saved).encode()
def fake_violation(req):
    """real: a denied socket() (a true Violation); again: re-raise that Violation although
    nothing was denied in this call."""
    from wfjail import guest
    if req == b"real":
        try:
            socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        except OSError as e:
            v = guest.explain(e)
            saved.append(v)
            raise v
    raise saved[0]
"#;

/// A scratch dir with the handler module, a policy (temporal-python plus `policy_extra`,
/// `/proc` readable) and the worker script.
fn fixture(tag: &str, worker: &str, policy_extra: &str) -> (Scratch, String) {
    serve_scratch(tag, "hs", HANDLERS, policy_extra, &["/proc"], worker)
}

/// `wfjail serve --zygote` with the fixture (one zygote: every session in one PID
/// namespace), killed if it runs longer than `limit`. `wrap`: a command wfjail runs under
/// (e.g. `setpriv` to drop privileges).
fn serve(s: &Scratch, module: &str, args: &[&str], wrap: &[&str], limit: Duration) -> Outcome {
    serve_in(true, s, module, args, wrap, limit)
}

/// [`serve`], in zygote mode or (`zygote` false) exec mode.
fn serve_in(
    zygote: bool,
    s: &Scratch,
    module: &str,
    args: &[&str],
    wrap: &[&str],
    limit: Duration,
) -> Outcome {
    let mut all: Vec<String> = vec![
        "serve".into(),
        "-p".into(),
        s.path("policy.toml").display().to_string(),
    ];
    all.extend(args.iter().map(|a| a.to_string()));
    if zygote {
        all.extend(crate::common::zygote_args(module, "1"));
    }
    all.extend(["--", PY].map(String::from));
    all.push(s.path("worker.py").display().to_string());
    let mut cmd = match wrap.split_first() {
        Some((first, rest)) => {
            // Wrapped (e.g. as nobody): a copy of the binary that the wrapped user can run.
            let mut c = Command::new(first);
            c.args(rest).arg(reachable_copy(s, &wfjail_bin()));
            c
        }
        None => Command::new(wfjail_bin()),
    };
    let mut child = cmd
        .args(&all)
        .current_dir(&s.0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn wfjail serve");
    let out_t = read_all(child.stdout.take().unwrap());
    let err_t = read_all(child.stderr.take().unwrap());
    let started = Instant::now();
    let mut timed_out = false;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if started.elapsed() > limit {
            timed_out = true;
            let _ = child.kill(); // by its pid; the zygote dies with it, the worker too
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let outcome = Outcome {
        code: status.code().unwrap_or(-1),
        stdout: out_t.join().unwrap(),
        stderr: err_t.join().unwrap(),
        report: Value::Null,
    };
    outcome.check(
        !timed_out,
        &format!("wfjail serve still ran after {limit:?} (killed by the test's watchdog)"),
    );
    outcome
}

/// Reads `r` to its end on a thread, keeping the first 8 MiB (a flooding guest on a
/// vulnerable build must not exhaust the test's memory).
fn read_all(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match r.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let room = (8usize << 20).saturating_sub(kept.len());
                    kept.extend_from_slice(&buf[..n.min(room)]);
                }
            }
        }
        String::from_utf8_lossy(&kept).into_owned()
    })
}

/// Asserts that the server and its worker exited 0, and parses what the worker printed.
fn worker_json(out: &Outcome) -> Value {
    out.check(out.code == 0, "wfjail serve exits 0");
    match serde_json::from_str(out.stdout.trim()) {
        Ok(v) => v,
        Err(e) => {
            out.check(false, &format!("the worker prints JSON: {e}"));
            unreachable!()
        }
    }
}

/// Worker code: A reads B's and the zygote's descriptors, memory and environment through
/// /proc and signals them; B and a third session's violations (resolved through
/// /proc/PID/cwd and /proc/PID/fd) still work.
const PROC_WORKER: &str = r#"
c = Client()
out = {}
with c.session(handler=MOD + ":whoami") as b:
    pid_b = b.call(b"").decode()
    with c.session(handler=MOD + ":probe") as a:
        targets = ["/proc/B/fd/1", "/proc/B/mem", "/proc/B/environ",
                   "/proc/Z/fd/1", "/proc/Z/mem", "/proc/Z/environ", "/proc/self/fd/1"]
        out["probe"] = json.loads(a.call((pid_b + "|" + ",".join(targets)).encode()))
    out["kills"] = [[v["category"], v["syscall"], v["args"]] for v in a.report["violations"]
                    if v["syscall"] == "kill"]
    out["b still answers"] = b.call(b"").decode() == pid_b
out["pid_b"] = pid_b
out["uid"] = os.getuid()
try:
    with c.session(handler=MOD + ":write_relative") as w:
        w.call(b"")
except Violation as v:
    out["write"] = [v.category, v.syscall, v.args]
out["writes"] = [v["args"] for v in w.report["violations"]]
print(json.dumps(out))
"#;

/// Checks what [`PROC_WORKER`] printed: the kernel refused A everything of B's and the
/// zygote's (EACCES), the supervisor refused A's signals (EPERM, reported), and the
/// supervisor — root or not, with or without a user namespace — still resolved a session's
/// relative writes through its /proc/PID/cwd and /proc/PID/fd (no "cannot judge").
fn check_proc_isolation(out: &Outcome, dir: &str) {
    let r = worker_json(out);
    let probe = &r["probe"];
    let b = probe["found"]["b"].as_str().expect("A finds B in /proc");
    let z = probe["found"]["zygote"]
        .as_str()
        .expect("A finds the zygote in /proc");
    for path in [
        format!("/proc/{b}/fd/1"),
        format!("readlink /proc/{b}/fd/1"),
        format!("/proc/{b}/mem"),
        format!("/proc/{b}/environ"),
        format!("/proc/{z}/fd/1"),
        format!("readlink /proc/{z}/fd/1"),
        format!("/proc/{z}/mem"),
        format!("/proc/{z}/environ"),
    ] {
        assert_eq!(
            probe[&path], "EACCES",
            "{path}: a sibling's and the zygote's /proc entries are refused: {r}"
        );
    }
    assert_eq!(
        probe["/proc/self/fd/1"], "opened",
        "a guest still reaches its own descriptors: {r}"
    );
    // Signals: refused (EPERM) and reported as privilege violations, one per target.
    assert_eq!(
        probe["kill b"], "EPERM",
        "a session cannot signal a sibling: {r}"
    );
    assert_eq!(
        probe["kill zygote"], "EPERM",
        "a session cannot signal the zygote: {r}"
    );
    let kills = r["kills"].as_array().expect("the kill violations");
    assert_eq!(kills.len(), 2, "both kills are in A's report: {r}");
    for k in kills {
        assert_eq!(k[0], "privilege", "{r}");
    }
    assert_eq!(r["b still answers"], true, "{r}");
    // The supervisor still reads the guest's memory and /proc/PID/cwd|fd to judge writes.
    let write = &r["write"];
    assert_eq!(write[0], "filesystem", "{r}");
    assert!(
        write[2]
            .as_str()
            .unwrap_or("")
            .contains(&format!("{dir}/written-through-dirfd")),
        "the path was resolved through the guest's /proc/PID/fd: {r}"
    );
    let writes = r["writes"].to_string();
    assert!(
        writes.contains(&format!("{dir}/written-by-guest")),
        "the relative path was resolved through the guest's cwd: {r}"
    );
    assert!(
        !writes.contains("cannot judge"),
        "every write was judged: {r}"
    );
}

#[test]
fn sessions_cannot_reach_each_other_or_the_zygote_through_proc() {
    let (s, module) = fixture("proc", PROC_WORKER, "");
    let out = serve(&s, &module, &["-q"], &[], Duration::from_secs(60));
    check_proc_isolation(&out, &s.0.display().to_string());
}

/// `setpriv` to nobody, then `then`.
fn as_nobody<'a>(then: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--",
    ];
    v.extend_from_slice(then);
    v
}

#[test]
fn an_unprivileged_supervisor_judges_cwd_and_dirfd_relative_writes_of_session_guests() {
    // The zygote stays dumpable (isolation comes from the nested Landlock domains), so an
    // unprivileged wfjail reads its guests' /proc/PID/fd: a write through a dirfd is judged.
    let (s, module) = fixture("proc-nobody", PROC_WORKER, "");
    let root = nix::unistd::geteuid().is_root();
    // nobody can read the fixture (a root-owned 0755 scratch dir) and reach /tmp.
    let wrap = if root { as_nobody(&[]) } else { Vec::new() };
    let out = serve(&s, &module, &["-q"], &wrap, Duration::from_secs(60));
    check_proc_isolation(&out, &s.0.display().to_string());
    if root {
        assert_eq!(worker_json(&out)["uid"], 65534, "wfjail ran as nobody");
    }
}

#[test]
fn a_guest_cannot_block_flood_or_forge_through_its_output() {
    let worker = r#"
c = Client()
out = {}
with c.session(handler=MOD + ":nonblock") as a:
    out["a"] = a.call(b"").decode()
    with c.session(handler=MOD + ":print_much") as b:
        try:
            out["b"] = b.call(b"262144").decode()
        except GuestError as e:
            out["b"] = e.type
with c.session(handler=MOD + ":forge") as f:
    out["forge"] = f.call(b"").decode()
    out["forge_id"] = f.id
try:
    with c.session(handler=MOD + ":print_forever", timeout="20s") as p:
        p.call(b"")
except SessionFailed as e:
    out["flood"] = [e.report["status"], e.report.get("limit"), e.report.get("error")]
with c.session(handler=MOD + ":mutate") as m:
    out["after"] = m.call(b"still here").decode()
print(json.dumps(out))
"#;
    let (s, module) = fixture("output", worker, "[limits]\noutput = \"1MiB\"\n");
    let out = serve(&s, &module, &["-q"], &[], Duration::from_secs(90));
    let r = worker_json(&out);
    assert_eq!(r["a"], "set");
    assert_eq!(
        r["b"], "printed",
        "another session's O_NONBLOCK does not reach this one's output: {r}"
    );
    assert_eq!(
        r["flood"][0], "limit",
        "an endless printer hits limits.output: {r}"
    );
    assert_eq!(r["flood"][1], "output", "{r}");
    assert_eq!(r["after"], "still here", "the server goes on: {r}");
    let id = r["forge_id"].as_u64().unwrap();
    let lines: Vec<&str> = out.stderr.lines().collect();
    out.check(
        !lines
            .iter()
            .any(|l| l.starts_with("wfjail: violation: network socket(AF_INET)")),
        "a guest cannot print a line of wfjail's own",
    );
    out.check(
        lines.contains(
            &format!("[session {id}] wfjail: violation: network socket(AF_INET) denied").as_str(),
        ),
        "the guest's line is echoed behind its session's prefix",
    );
    out.check(
        !out.stderr.contains('\x1b')
            && lines.contains(&format!("[session {id}] \\x1b[2Jwfjail: ok (forged)").as_str()),
        "control characters are escaped",
    );
}

#[test]
fn a_guest_makes_no_progress_between_calls() {
    let worker = r#"
c = Client()
out = {}
def size(p):
    return os.path.getsize(p) if os.path.exists(p) else 0
tick = os.path.join(DIR, "rw", "tick")
with c.session(handler=MOD + ":ticker") as s:
    out["arm"] = s.call(b"arm:" + tick.encode()).decode()
    first = size(tick)
    # Past the server's STOP_WAIT (2 s): its one look at the stopped guest passes.
    time.sleep(2.5)
    out["idle ticks"] = size(tick) - first
    out["count"] = int(s.call(b"count:" + tick.encode()))
out["ticker status"] = s.report["status"]
work = os.path.join(DIR, "rw", "work")
def cpu_state(pid):
    v = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return v[0], int(v[11]) + int(v[12])
s = c.session(handler=MOD + ":answer_then_work").open()
out["early"] = s.call(work.encode()).decode()
first = size(work)
time.sleep(0.2)
state, cpu = cpu_state(s.pid)
time.sleep(1.0)
out["idle work"] = size(work) - first
later, cpu_later = cpu_state(s.pid)
out["states"] = state + later
out["idle cpu ticks"] = cpu_later - cpu
s.close()
print(json.dumps(out))
"#;
    // Timers are allowed here: the guest arms one to run a handler between calls.
    let (s, module) = fixture("idle", worker, "[time]\nsleep = \"allow\"\n");
    std::fs::create_dir(s.path("rw")).unwrap();
    let rw = s.path("rw").display().to_string();
    let out = serve(
        &s,
        &module,
        &["-q", "--rw", &rw],
        &[],
        Duration::from_secs(60),
    );
    let r = worker_json(&out);
    assert_eq!(r["arm"], "armed");
    assert_eq!(
        r["idle ticks"], 0,
        "a signal handler does not run between calls: {r}"
    );
    assert!(
        r["count"].as_i64().unwrap() >= 0,
        "the session still answers: {r}"
    );
    assert_eq!(r["ticker status"], "ok", "{r}");
    assert_eq!(r["early"], "early");
    assert_eq!(
        r["idle work"], 0,
        "code after a self-made reply does not run between calls: {r}"
    );
    // The spinning guest is stopped (seen from the host, 0.2 s and 1.2 s after its answer;
    // the server looks at it itself only at its STOP_WAIT) and its CPU time does not move.
    assert_eq!(
        r["states"], "TT",
        "the spinning guest is stopped between calls: {r}"
    );
    assert_eq!(
        r["idle cpu ticks"], 0,
        "it spends no CPU between calls: {r}"
    );
}

#[test]
fn floods_end_in_a_report_while_the_server_and_its_sessions_go_on() {
    let worker = r#"
c = Client()
out = {"sibling": []}
stop = threading.Event()
def sibling():
    with c.session(handler=MOD + ":mutate") as s:
        while not stop.is_set():
            out["sibling"].append(s.call(b"s")[-1:].decode())
            time.sleep(0.05)
t = threading.Thread(target=sibling); t.start()
for name in ["query_flood", "log_flood"]:
    try:
        with c.session(handler=MOD + ":" + name, timeout="3s") as f:
            f.call(b"")
            out[name] = "returned"
    except SessionFailed as e:
        out[name] = [e.report["status"], e.report.get("limit"), e.report.get("error")]
stop.set(); t.join()
with c.session(handler=MOD + ":mutate") as m:
    out["after"] = m.call(b"fresh").decode()
status = open("/proc/%d/status" % os.getppid()).read()
out["hwm_kb"] = int(next(l for l in status.splitlines() if l.startswith("VmHWM:")).split()[1])
out["sibling"] = len(out["sibling"])
print(json.dumps(out))
"#;
    let (s, module) = fixture("flood", worker, "[limits]\noutput = \"1MiB\"\n");
    let out = serve(&s, &module, &["-q"], &[], Duration::from_secs(90));
    let r = worker_json(&out);
    // The QUERY flood: its denied writes make it a violation; it is ended by its deadline.
    assert_eq!(r["query_flood"][0], "violation", "{r}");
    assert_eq!(
        r["query_flood"][2], "the call took longer than 3s",
        "the deadline fired: {r}"
    );
    // Empty LOG frames are charged against limits.output.
    assert_eq!(r["log_flood"][0], "limit", "{r}");
    assert_eq!(r["log_flood"][1], "output", "{r}");
    assert!(
        r["sibling"].as_i64().unwrap() >= 10,
        "a sibling session kept answering: {r}"
    );
    assert_eq!(r["after"], "fresh", "{r}");
    let hwm = r["hwm_kb"].as_i64().unwrap();
    assert!(
        hwm < 96 * 1024,
        "wfjail serve's peak RSS stays bounded: {hwm} kB"
    );
}

#[test]
fn an_error_typed_violation_is_not_a_violation_of_that_call() {
    let worker = r#"
c = Client()
out = {}
with c.session(handler=MOD + ":fake_violation") as s:
    try:
        s.call(b"real")
    except Violation as v:
        out["real"] = [v.category, v.syscall]
    try:
        s.call(b"again")
        out["again"] = "returned"
    except Violation as v:
        out["again"] = ["Violation", v.category, v.syscall]
    except GuestError as e:
        out["again"] = ["GuestError", e.type, e.violations]
out["report"] = [(v["syscall"], v["count"]) for v in s.report["violations"]]
print(json.dumps(out))
"#;
    let (s, module) = fixture("e5", worker, "");
    let out = serve(&s, &module, &["-q"], &[], Duration::from_secs(60));
    let r = worker_json(&out);
    assert_eq!(r["real"], serde_json::json!(["network", "socket"]), "{r}");
    assert_eq!(
        r["again"],
        serde_json::json!(["GuestError", "wfjail.Violation", []]),
        "the ERROR carries no violation of its call, so it is the guest's own error: {r}"
    );
    assert_eq!(
        r["report"],
        serde_json::json!([["socket", 1]]),
        "the report holds the one real violation: {r}"
    );
}

#[test]
fn a_zygote_that_cannot_nest_session_domains_is_refused() {
    // A stand-in zygote whose READY says it cannot give its sessions a Landlock domain of
    // their own: wfjail refuses to serve instead of running sessions that can read each other.
    let (s, module) = fixture("no-nest", "print('the worker ran')\n", "");
    stand_in_zygote(
        &s,
        r#""session_domain": "landlock_create_ruleset: not here", "control": 2"#,
    );
    let out = serve(&s, &module, &[], &[], Duration::from_secs(60));
    refused_before_the_worker(
        &out,
        &[
            "cannot give each session a Landlock domain of its own",
            "not here",
            "Nesting needs Landlock in the kernel",
        ],
        "and says why, and what would enable it",
    );
}

#[test]
fn a_zygote_package_from_another_wfjail_is_refused_with_what_to_install() {
    // A package installed from an older wfjail (its READY has no control version) would take
    // one descriptor per FORK where this wfjail sends two: refused at once, with the fix.
    let (s, module) = fixture("old-package", "print('the worker ran')\n", "");
    stand_in_zygote(&s, r#""session_domain": 7"#);
    let out = serve(&s, &module, &[], &[], Duration::from_secs(60));
    refused_before_the_worker(
        &out,
        &["speaks control version 1, this wfjail 2", "pip install"],
        "and says which package to install",
    );
}

/// `wfjail serve` refused to start (exit 125), said `says` on stderr (`what`), and never
/// started the worker (whose script prints "the worker ran").
fn refused_before_the_worker(out: &Outcome, says: &[&str], what: &str) {
    out.check(out.code == 125, "wfjail refuses to start (exit 125)");
    out.check(says.iter().all(|t| out.stderr.contains(t)), what);
    out.check(
        !out.stdout.contains("the worker ran"),
        "the worker never started",
    );
}

/// Puts a stand-in `wfjail.zygote` first on the fixture's PYTHONPATH: it sends READY with
/// `fields` (JSON members after pid, preloaded and python) and waits.
fn stand_in_zygote(s: &Scratch, fields: &str) {
    std::fs::create_dir(s.path("fake")).unwrap();
    std::fs::create_dir(s.path("fake/wfjail")).unwrap();
    s.write("fake/wfjail/__init__.py", "");
    s.write(
        "fake/wfjail/zygote.py",
        &format!(
            r#"import json, os, socket, struct
doc = ('{{"pid": %d, "preloaded": [], "python": "3", {fields}}}' % os.getpid()).encode()
ctl = socket.socket(fileno=int(os.environ["WFJAIL_ZYGOTE_FD"]))
ctl.sendall(struct.pack("<IB", len(doc) + 1, 0x32) + doc)
ctl.recv(1)
"#
        ),
    );
    let policy = std::fs::read_to_string(s.path("policy.toml")).unwrap();
    let fake = s.path("fake").display().to_string();
    s.write(
        "policy.toml",
        &policy.replace("PYTHONPATH = \"", &format!("PYTHONPATH = \"{fake}:")),
    );
}

/// Python that fills the Landlock layers this process may still stack (16 in all) but one,
/// with layers which restrict nothing (each handles device-node creation and reparenting and
/// grants them beneath "/"), then execs its arguments.
const LAYERS: &str = r#"
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
abi = libc.syscall(444, None, 0, 1)
handled = (1 << 6) | (1 << 11) | ((1 << 13) if abi >= 2 else 0)
attr = ctypes.c_uint64(handled)
class Rule(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("access", ctypes.c_uint64), ("fd", ctypes.c_int32)]
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
def layer():
    fd = libc.syscall(444, ctypes.byref(attr), 8, 0)
    root = os.open("/", os.O_PATH)
    assert fd >= 0 and libc.syscall(445, fd, 1, ctypes.byref(Rule(handled, root)), 0) == 0
    ok = libc.syscall(446, fd, 0) == 0
    err = ctypes.get_errno()
    os.close(fd); os.close(root)
    assert ok or err == errno.E2BIG, os.strerror(err)
    return ok
pid = os.fork()
if pid == 0:  # how many more layers fit?
    n = 0
    while layer():
        n += 1
    os._exit(n)
room = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
assert room >= 2, "only %d Landlock layers left" % room
for _ in range(room - 1):
    assert layer()
os.execv(sys.argv[1], sys.argv[1:])
"#;

#[test]
fn a_session_child_that_cannot_enter_its_own_domain_does_not_run_its_session() {
    // Landlock stacks at most 16 layers. wfjail starts with room for one more (the layers
    // above it restrict nothing), which the zygote's own domain takes: the zygote prepares its
    // sessions' ruleset, but every child's landlock_restrict_self fails (E2BIG). The child answers ERROR instead of HELLO:
    // the session fails with that reason and no handler code runs.
    let worker = r#"
out = {}
c = Client()
try:
    with c.session(handler=MOD + ":whoami") as s:
        out["call"] = s.call(b"").decode()
except SessionFailed as e:
    out["failed"] = [e.report.get("status"), e.report.get("error")]
print(json.dumps(out))
"#;
    let (s, module) = fixture("e2big", worker, "");
    s.write("layers.py", LAYERS);
    let layers = s.path("layers.py").display().to_string();
    let out = serve(
        &s,
        &module,
        &["-q"],
        &[PY, &layers],
        Duration::from_secs(60),
    );
    let r = worker_json(&out);
    assert!(r.get("call").is_none(), "the handler never ran: {r}");
    let error = r["failed"][1].as_str().unwrap_or("");
    assert!(
        error.contains("could not enter a Landlock domain of its own")
            && error.contains("landlock_restrict_self: Argument list too long"),
        "the session failed and says why: {r}"
    );
}

#[test]
fn the_kernel_keeps_nested_session_domains_apart() {
    // The zygote's own nesting code, outside wfjail (no supervisor), as nobody (no
    // CAP_PERFMON, which would let root read another process's environ and maps): two
    // sibling children in domains of their own, and a control child left in the parent's
    // (no) domain. The kernel refuses the nested child every ptrace-guarded /proc entry of
    // its sibling and parent and, at Landlock ABI >= 6, every signal to them; the control
    // child gets them. Reparenting (a rename across directories) still works when nested.
    let s = Scratch::new("kernel-nest");
    s.write(
        "nest.py",
        r#"
import ctypes, errno, json, os, sys, time
sys.path.insert(0, sys.argv[1])
from wfjail import zygote as z
assert ctypes.CDLL(None).prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS, as wfjail sets it
scratch = sys.argv[2]
out = {"abi": z._prepare_session_domain()}
def try_(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
def spawn(nest, body):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        doc = {"nested": z._enter_session_domain() if nest else "not asked"}
        doc.update(body())
        os.write(w, json.dumps(doc).encode())
        os._exit(0)
    os.close(w)
    return pid, r
def idle():
    time.sleep(30)
    return {}
sibling, _ = spawn(True, idle)
time.sleep(0.2)  # the sibling has entered its domain
parent = os.getpid()
def probe():
    doc = {}
    for name, pid in (("sibling", sibling), ("parent", parent)):
        for entry in ("fd/0", "environ", "maps", "mem"):
            doc["%s %s" % (name, entry)] = try_(lambda: os.close(os.open("/proc/%d/%s" % (pid, entry), os.O_RDONLY)))
        doc["%s kill" % name] = try_(lambda: os.kill(pid, 0))
    os.mkdir(os.path.join(scratch, "d%d" % os.getpid()))
    src = os.path.join(scratch, "f%d" % os.getpid())
    open(src, "w").close()
    doc["rename"] = try_(lambda: os.rename(src, os.path.join(scratch, "d%d" % os.getpid(), "f")))
    return doc
for label, nest in (("nested", True), ("control", False)):
    pid, r = spawn(nest, probe)
    os.waitpid(pid, 0)
    out[label] = json.loads(os.read(r, 65536))
os.kill(sibling, 9)
os.waitpid(sibling, 0)
print(json.dumps(out))
"#,
    );
    std::fs::create_dir(s.path("rw")).unwrap();
    let rw = s.path("rw");
    let mut cmd = if nix::unistd::geteuid().is_root() {
        nix::unistd::chown(&rw, Some(65534.into()), Some(65534.into())).unwrap();
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            "--",
            PY,
        ]);
        c
    } else {
        Command::new(PY)
    };
    let out = cmd
        .arg(s.path("nest.py"))
        .arg(python_lib(&s))
        .arg(&rw)
        .output()
        .expect("run nest.py");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "nest.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_str(text.trim()).expect("nest.py prints JSON");
    let abi = r["abi"].as_u64().expect("the ABI, not an error");
    assert_eq!(r["nested"]["nested"], Value::Null, "the child nested: {r}");
    for who in ["sibling", "parent"] {
        for entry in ["fd/0", "environ", "maps", "mem"] {
            let key = format!("{who} {entry}");
            assert_eq!(
                r["nested"][&key], "EACCES",
                "{key} refused when nested: {r}"
            );
            assert_eq!(
                r["control"][&key], "ok",
                "{key} reached without nesting: {r}"
            );
        }
        let key = format!("{who} kill");
        assert_eq!(r["control"][&key], "ok", "{key} sent without nesting: {r}");
        if abi >= 6 {
            assert_eq!(
                r["nested"][&key], "EPERM",
                "the kernel refuses {key} from a nested domain (scoped signals): {r}"
            );
        }
    }
    assert_eq!(
        r["nested"]["rename"], "ok",
        "the nested domain takes no file access away: {r}"
    );
}

#[test]
fn exec_mode_guests_are_stopped_between_calls_and_their_output_is_theirs() {
    // Exec mode: the guest is PID 1 of its own namespace; SIGSTOP from wfjail (an ancestor
    // namespace) still stops it.
    let worker = r#"
c = Client()
out = {}
argv = [sys.executable, os.path.join(DIR, "guest.py")]
def size(p):
    return os.path.getsize(p) if os.path.exists(p) else 0
tick = os.path.join(DIR, "rw", "tick")
with c.session(argv=argv + ["ticker"]) as s:
    out["arm"] = s.call(b"arm:" + tick.encode()).decode()
    first = size(tick)
    # Past the server's STOP_WAIT (2 s): its one look at the stopped guest passes.
    time.sleep(2.5)
    out["idle ticks"] = size(tick) - first
    out["count"] = int(s.call(b"count:" + tick.encode()))
out["ticker status"] = s.report["status"]
with c.session(argv=argv + ["forge"]) as f:
    out["forge"] = f.call(b"").decode()
    out["forge_id"] = f.id
try:
    with c.session(argv=argv + ["print_forever"], timeout="20s") as p:
        p.call(b"")
except SessionFailed as e:
    out["flood"] = [e.report["status"], e.report.get("limit")]
print(json.dumps(out))
"#;
    let (s, module) = fixture(
        "exec",
        worker,
        "[time]\nsleep = \"allow\"\n[limits]\noutput = \"1MiB\"\n",
    );
    s.write(
        "guest.py",
        &format!(
            "import sys, {module} as m\nfrom wfjail import guest\nguest.run(getattr(m, sys.argv[1]))\n"
        ),
    );
    std::fs::create_dir(s.path("rw")).unwrap();
    let rw = s.path("rw").display().to_string();
    let out = serve_in(
        false,
        &s,
        &module,
        &["-q", "--rw", &rw],
        &[],
        Duration::from_secs(60),
    );
    let r = worker_json(&out);
    assert_eq!(r["arm"], "armed");
    assert_eq!(r["idle ticks"], 0, "no progress between calls: {r}");
    assert!(r["count"].as_i64().unwrap() >= 0, "{r}");
    assert_eq!(r["ticker status"], "ok", "{r}");
    assert_eq!(r["flood"], serde_json::json!(["limit", "output"]), "{r}");
    let id = r["forge_id"].as_u64().unwrap();
    out.check(
        out.stderr.lines().any(|l| {
            l == format!("[session {id}] wfjail: violation: network socket(AF_INET) denied")
        }) && !out.stderr.contains('\x1b'),
        "an exec-mode guest's lines are its session's, escaped",
    );
}

/// `container_sim` (examples/container_sim.rs), copied where nobody can run it.
fn container_sim(s: &Scratch) -> String {
    reachable_copy(s, &crate::common::container_sim())
        .display()
        .to_string()
}

#[test]
fn without_a_user_namespace_serve_zygote_isolates_sessions_and_judges_their_writes() {
    // Docker's default profile (no namespaces: no user or PID namespace, the host's /proc),
    // as nobody and as root: the zygote stays dumpable and the session children's domains
    // keep them apart, so wfjail serves, sessions cannot reach each other, and writes
    // relative to a session's cwd or a dirfd are judged.
    if !nix::unistd::geteuid().is_root() {
        return; // needs to switch to nobody
    }
    let (s, module) = fixture("proc-sim", PROC_WORKER, "");
    let sim = container_sim(&s);
    let out = serve(
        &s,
        &module,
        &["-q"],
        &as_nobody(&[&sim, "--deny-namespaces", "--"]),
        Duration::from_secs(60),
    );
    check_proc_isolation(&out, &s.0.display().to_string());
    assert_eq!(worker_json(&out)["uid"], 65534, "wfjail ran as nobody");
    let (s, module) = fixture("proc-sim-root", PROC_WORKER, "");
    let out = serve(
        &s,
        &module,
        &["-q"],
        &[&sim, "--deny-namespaces", "--"],
        Duration::from_secs(60),
    );
    check_proc_isolation(&out, &s.0.display().to_string());
}

#[test]
fn without_landlock_serve_zygote_refuses_even_under_a_best_effort_policy() {
    // A runtime whose profile predates Landlock (the landlock_* calls fail with ENOSYS) and a
    // policy that accepts running without Landlock: exec mode would run, but the zygote
    // cannot give its sessions domains of their own, so serve --zygote refuses, saying why.
    if !nix::unistd::geteuid().is_root() {
        return; // container_sim's filter is installed as root in the other tests too
    }
    let (s, module) = fixture(
        "no-landlock",
        "print('the worker ran')\n",
        "require = [\"seccomp\"]\n",
    );
    let sim = container_sim(&s);
    let out = serve(
        &s,
        &module,
        &[],
        &[&sim, "--deny-landlock", "--"],
        Duration::from_secs(60),
    );
    refused_before_the_worker(
        &out,
        &[
            "cannot give each session a Landlock domain of its own",
            "Function not implemented",
        ],
        "and says why",
    );
}

// ---- the supervisor's work per session is bounded (issue 16, part B, fairness) ---------------

/// Handlers that flood the supervisor with notifications, and a quiet one.
const FLOODERS: &str = r#"
import os, time
def clock_flood(req):
    while True:
        time.time()
def random_flood(req):
    while True:
        os.urandom(8)
def quiet(req):
    return req
"#;

/// Worker: a quiet sibling session calls on while a clock flood and a getrandom flood each
/// run in a session of their own; what each ended with. `EXEC`: sessions run `guest.py NAME`
/// (exec mode) instead of a preloaded handler.
const FLOOD_WORKER: &str = r#"
c = Client()
out = {"sibling": 0}
stop = threading.Event()
def open_session(name, **kw):
    if EXEC:
        return c.session(argv=[sys.executable, os.path.join(DIR, "guest.py"), name], **kw)
    return c.session(handler=MOD + ":" + name, **kw)
def sibling():
    with open_session("quiet") as s:
        while not stop.is_set():
            if s.call(b"q") == b"q":
                out["sibling"] += 1
            time.sleep(0.05)
t = threading.Thread(target=sibling); t.start()
for name in ["clock_flood", "random_flood"]:
    try:
        with open_session(name, timeout="100s") as f:
            f.call(b"")
            out[name] = "returned"
    except SessionFailed as e:
        out[name] = [e.report["status"], e.report.get("limit"), e.report.get("error")]
stop.set(); t.join()
print(json.dumps(out))
"#;

/// Asserts both floods ended `limit`, limit `notifications`, and the sibling answered.
fn check_floods_stopped(out: &Outcome) {
    let r = worker_json(out);
    for name in ["clock_flood", "random_flood"] {
        assert_eq!(r[name][0], "limit", "{name}: {r}");
        assert_eq!(r[name][1], "notifications", "{name}: {r}");
    }
    assert!(
        r["sibling"].as_i64().unwrap() >= 1,
        "the quiet sibling answered: {r}"
    );
}

#[test]
fn a_session_flooding_the_router_with_notifications_is_stopped() {
    let worker = format!("EXEC = False\n{FLOOD_WORKER}");
    let (s, module) = serve_scratch("notif-flood", "nf", FLOODERS, "", &[], &worker);
    let out = serve(&s, &module, &["-q"], &[], Duration::from_secs(240));
    check_floods_stopped(&out);
}

#[test]
fn an_exec_mode_session_flooding_its_supervisor_with_notifications_is_stopped() {
    let worker = format!("EXEC = True\n{FLOOD_WORKER}");
    let (s, module) = serve_scratch("notif-flood-exec", "nf", FLOODERS, "", &[], &worker);
    s.write(
        "guest.py",
        &format!(
            "import sys, {module} as m\nfrom wfjail import guest\nguest.run(getattr(m, sys.argv[1]))\n"
        ),
    );
    let out = serve_in(false, &s, &module, &["-q"], &[], Duration::from_secs(240));
    check_floods_stopped(&out);
}
