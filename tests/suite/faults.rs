//! Faults (issue 7, item 4): a guest that dies at every phase, hangs, floods or closes its
//! protocol pipes; a worker that leaves mid-session or mid-call; wfjail itself killed with
//! SIGTERM or SIGKILL mid-run. After each: no guest survives, nothing is left a zombie under a
//! server that goes on, a still-running server holds no more descriptors than before, and the
//! outcome is reported with its status and the reason.
//!
//! Guests are found by a marker unique to the test in their command line (`/proc/PID/cmdline`).

use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{Outcome, PY, REPO, Scratch, serve_scratch, wfjail, wfjail_bin};
use serde_json::Value;

/// A marker for this test's guests: unique per process and call.
fn marker(tag: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "faultmark_{tag}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// One line of `/proc/PID/stat`: (state, ppid).
fn stat(pid: u32) -> Option<(char, u32)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: parse after the last ')'.
    let rest = &s[s.rfind(')')? + 2..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

/// Live (not zombie) processes whose command line holds `needle`, except `except`.
fn alive_with(needle: &str, except: &[u32]) -> Vec<u32> {
    let mut found = vec![];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if except.contains(&pid) {
            continue;
        }
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        if String::from_utf8_lossy(&cmd).contains(needle)
            && stat(pid).is_some_and(|(state, _)| state != 'Z')
        {
            found.push(pid);
        }
    }
    found
}

/// Waits (up to 20 s, for a loaded machine) until `cond` holds; returns whether it did.
fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if cond() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Asserts that no guest carrying `marker` runs any more.
fn assert_no_survivor(marker: &str, what: &str) {
    assert!(
        eventually(|| alive_with(marker, &[std::process::id()]).is_empty()),
        "{what}: guests still running: {:?}",
        alive_with(marker, &[std::process::id()])
    );
}

/// A policy that lets Debian's interpreter import the wfjail package.
fn guest_policy(s: &Scratch) -> String {
    let p = s.write(
        "policy.toml",
        &format!(
            "extends = \"default\"\n[filesystem]\nread = [\"{REPO}/python\"]\n\
             [env]\nset = {{ PYTHONPATH = \"{REPO}/python\" }}\n"
        ),
    );
    p.display().to_string()
}

/// `wfjail run -p POLICY [extra] -- python3 -c CODE` (framed unless `extra` says `--raw`),
/// with `marker` in the code; asserts no guest survives it.
fn run_guest(tag: &str, extra: &[&str], code: &str) -> Outcome {
    let s = Scratch::new(tag);
    let policy = guest_policy(&s);
    let m = marker(tag);
    let code = format!("# {m}\n{code}");
    let mut args = vec!["run", "-p", &policy];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", PY, "-c", &code]);
    let out = wfjail(&args);
    assert_no_survivor(&m, tag);
    out
}

/// Python that writes raw guest-protocol frames on fd 4.
const FRAMES: &str = "import os, struct, ctypes\n\
def frame(kind, payload):\n    os.write(4, struct.pack('<IB', len(payload) + 1, kind) + payload)\n\
HELLO = b'wfjail\\x01\\x00'\n";

#[test]
fn a_guest_that_cannot_start_is_a_launch_error() {
    let s = Scratch::new("noexec");
    let out = wfjail(&["run", "--", "/nonexistent/wfjail-interpreter"]);
    out.check(
        out.code == 127 && out.status() == "launch_error",
        "a missing command: 127",
    );
    out.check(
        out.error_says("command not found: /nonexistent/wfjail-interpreter"),
        "the report names the command",
    );
    // A file that claims to be ELF and is not: the kernel refuses it at exec.
    let bad = s.write("bad-elf", "\x7fELF not really");
    std::fs::set_permissions(&bad, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let dir = s.0.display().to_string();
    let out = wfjail(&["run", "--ro", &dir, "--", bad.to_str().unwrap()]);
    out.check(
        out.code == 126 && out.status() == "launch_error",
        "a bad ELF: 126",
    );
    out.check(
        out.error_says("Exec format error"),
        "the report says why exec failed",
    );
}

#[test]
fn a_guest_that_dies_right_after_exec_or_before_hello_is_reported() {
    // Right after exec: a program that is no protocol guest exits at once.
    let out = wfjail(&["run", "--", "/bin/false"]);
    out.check(
        out.code == 1 && out.status() == "guest_error" && out.report["exit_code"] == 1,
        "exit 1 before any frame",
    );
    // Before HELLO, cleanly: the report says no answer came.
    let out = run_guest("prehello-exit", &[], "import os\nos._exit(0)\n");
    out.check(
        out.status() == "guest_error" && out.error_says("without a RESULT or ERROR frame"),
        "exit 0 without an answer is a guest error that says so",
    );
    // Before HELLO, by a signal.
    let out = run_guest("prehello-segv", &[], "import ctypes\nctypes.string_at(0)\n");
    out.check(
        out.code == 6 && out.status() == "crashed" && out.report["signal"] == "SIGSEGV",
        "a crash before HELLO: crashed, SIGSEGV",
    );
    // Inside a frame: HELLO cut short, then exit.
    let out = run_guest(
        "prehello-cut",
        &[],
        &format!("{FRAMES}os.write(4, struct.pack('<IB', 9, 1) + b'wfj')\nos._exit(0)\n"),
    );
    out.check(
        out.status() == "guest_error" && out.error_says("truncated frame"),
        "a frame cut by the guest's exit is a protocol error",
    );
}

#[test]
fn a_guest_that_dies_mid_call_or_after_its_result_is_reported() {
    let out = run_guest(
        "midcall",
        &[],
        "import wfjail.guest, ctypes\n\
         def handle(request):\n    ctypes.string_at(0)\n\
         wfjail.guest.run(handle)\n",
    );
    out.check(
        out.code == 6 && out.status() == "crashed" && out.report["signal"] == "SIGSEGV",
        "a crash mid-call: crashed, SIGSEGV",
    );
    out.check(out.stdout.is_empty(), "no result without an answer");
    // RESULT sent, then a crash: the answer is delivered and the crash still reported.
    let out = run_guest(
        "afterresult",
        &[],
        &format!("{FRAMES}frame(1, HELLO)\nframe(3, b'answer')\nctypes.string_at(0)\n"),
    );
    out.check(
        out.status() == "crashed" && out.report["signal"] == "SIGSEGV",
        "a crash after RESULT: crashed, SIGSEGV",
    );
    out.check(
        out.stdout.starts_with("answer"),
        "the result that came is passed on",
    );
}

#[test]
fn a_hanging_guest_is_killed_at_the_timeout() {
    let out = run_guest("hang", &["--timeout", "1s"], "while True:\n    pass\n");
    out.check(
        out.code == 4 && out.status() == "timeout" && out.report["signal"] == "SIGKILL",
        "timeout, SIGKILL",
    );
    out.check(
        out.error_says("killed after 1s"),
        "the report names the limit",
    );
}

#[test]
fn a_guest_that_closes_its_protocol_pipes_and_runs_on_is_ended() {
    // fd 3 (requests) and fd 4 (answers) closed, then the guest keeps running without a
    // word: the supervisor cannot hear it any more, so only the timeout ends it.
    let out = run_guest(
        "closefds",
        &["--timeout", "2s"],
        "import os, time\nos.close(3)\nos.close(4)\nwhile True:\n    time.sleep(0.05)\n",
    );
    out.check(
        out.code == 4 && out.status() == "timeout" && out.report["signal"] == "SIGKILL",
        "timeout, SIGKILL",
    );
    // Closed, then gone: no answer came.
    let out = run_guest(
        "closefds-exit",
        &[],
        "import os\nos.close(3)\nos.close(4)\nos._exit(0)\n",
    );
    out.check(
        out.status() == "guest_error" && out.error_says("without a RESULT or ERROR frame"),
        "closed pipes, then exit: a guest error that says no answer came",
    );
}

#[test]
fn a_flooding_guest_is_stopped_at_the_output_limit() {
    // stdout without a newline, as fast as it can, in framed and raw mode.
    for (tag, raw) in [("flood-framed", false), ("flood-raw", true)] {
        let extra: &[&str] = if raw {
            &["--timeout", "60s", "--raw"]
        } else {
            &["--timeout", "60s"]
        };
        let out = run_guest(
            tag,
            extra,
            "import os\nwhile True:\n    os.write(1, b'x' * 65536)\n",
        );
        out.check(
            out.code == 5 && out.status() == "limit" && out.report["signal"] == "SIGKILL",
            &format!("{tag}: limit, SIGKILL"),
        );
        out.check(
            out.report["limit"] == "output",
            &format!("{tag}: the report names the output limit"),
        );
    }
}

/// Starts `wfjail run --report FILE --timeout 60s -- python3 -c SPIN` with a marker, waits until
/// the guest runs, and returns (wfjail, marker, report path).
fn spinning_run(s: &Scratch, raw: bool) -> (Child, String) {
    let m = marker("signal");
    let code =
        format!("import time  # {m}\nprint('up', flush=True)\nwhile True:\n    time.sleep(0.05)\n");
    let report = s.path("report.json");
    let mut cmd = Command::new(wfjail_bin());
    cmd.args([
        "run",
        "--report",
        report.to_str().unwrap(),
        "--timeout",
        "60s",
    ]);
    if raw {
        cmd.arg("--raw");
    }
    let mut child = cmd
        .args(["--", PY, "-c", &code])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if raw {
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "up");
    } else {
        assert!(
            eventually(|| !alive_with(&m, &[child.id(), std::process::id()]).is_empty()),
            "the guest starts"
        );
    }
    (child, m)
}

#[test]
fn sigkill_to_wfjail_run_takes_the_guest_along() {
    for raw in [true, false] {
        let s = Scratch::new("sigkill-run");
        let (mut child, m) = spinning_run(&s, raw);
        let guests = alive_with(&m, &[child.id(), std::process::id()]);
        assert_eq!(guests.len(), 1, "one guest: {guests:?}");
        child.kill().unwrap();
        let status = child.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );
        assert_no_survivor(&m, "after SIGKILL to wfjail run");
    }
}

#[test]
fn sigterm_to_wfjail_run_ends_the_guest() {
    for raw in [true, false] {
        let s = Scratch::new("sigterm-run");
        let (mut child, m) = spinning_run(&s, raw);
        Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        child.wait().unwrap();
        assert_no_survivor(&m, "after SIGTERM to wfjail run");
    }
}

#[test]
fn sigterm_to_wfjail_run_is_reported() {
    let s = Scratch::new("sigterm-report");
    let (child, _m) = spinning_run(&s, false);
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let out = Outcome::collect(child.wait_with_output().unwrap(), &s.path("report.json"));
    out.check(
        out.status() == "interrupted"
            && out.code == 128 + libc::SIGTERM
            && out.report["signal"] == "SIGKILL"
            && out.error_says("SIGTERM"),
        "status interrupted, exit 143, the guest killed, and a report that says wfjail was stopped by SIGTERM",
    );
}

// ---- serve ----

/// Workflow functions for the zygote (module named after the scratch dir: a unique marker).
const WORKFLOWS: &str = r#"
import os, time
def echo(req):
    return req
def hang(req):
    while True:
        pass
def crash(req):
    import ctypes
    ctypes.string_at(0)
def flood(req):
    while True:
        os.write(1, b"x" * 65536)
"#;

/// Worker-side helpers: descriptor count of wfjail (the worker's parent), zombies under
/// wfjail and the zygotes, and our guests (by module name in the command line).
const WORKER_HELPERS: &str = r#"
import socket, time, signal
from wfjail import client as wc
SERVER = os.getppid()
def fds():
    counts = []
    for _ in range(10):
        counts.append(len(os.listdir("/proc/%d/fd" % SERVER)))
        time.sleep(0.05)
    return min(counts)
def procs():
    out = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            st = open("/proc/%s/stat" % p).read()
            cmd = open("/proc/%s/cmdline" % p, "rb").read()
        except OSError:
            continue
        rest = st[st.rfind(")") + 2:].split()
        out[int(p)] = (rest[0], int(rest[1]), MOD.encode() in cmd)
    return out
def ours():
    return sorted(p for p, (state, _, mine) in procs().items() if mine and state != "Z")
def zombies():
    ps = procs()
    parents = {SERVER} | {p for p, (s, _, mine) in ps.items() if mine}
    return sorted(p for p, (state, ppid, _) in ps.items() if state == "Z" and ppid in parents)
def settle(base, fd0):
    # Sessions end asynchronously (a grace period, the zygote's EXITED, the session thread
    # closing its descriptors): wait (bounded) until all is back to the baseline.
    deadline = time.time() + 20
    while time.time() < deadline and (len(ours()) > base or zombies() or fds() > fd0):
        time.sleep(0.05)
def baseline():
    # Stable for a second: the zygote's spare forked, the warm-up session's thread gone.
    last = None
    while True:
        now = (len(ours()), fds())
        if now == last:
            return now
        last = now
        time.sleep(1)
def raw_session(handler, timeout="60s"):
    conn = socket.socket(socket.AF_UNIX)
    conn.connect(os.environ["WFJAIL_SOCKET"])
    conn.sendall(wc._frame(wc.OPEN, json.dumps({"handler": MOD + ":" + handler, "timeout": timeout})))
    return conn
def read_frame(conn):
    head = b""
    while len(head) < 5:
        chunk = conn.recv(5 - len(head))
        if not chunk:
            return None, b""
        head += chunk
    n = int.from_bytes(head[:4], "little") - 1
    body = b""
    while len(body) < n:
        body += conn.recv(n - len(body))
    return head[4], body
c = Client()
with c.session(handler=MOD + ":echo") as s:   # warm: zygotes and spares exist
    s.call(b"x")
time.sleep(0.3)
"#;

fn serve_fixture(tag: &str, worker: &str) -> (Scratch, String, Vec<String>) {
    let (s, module) = serve_scratch(
        tag,
        "wf",
        WORKFLOWS,
        "",
        &[],
        &format!("{WORKER_HELPERS}\n{worker}"),
    );
    let args = [
        "serve",
        "-q",
        "-p",
        s.path("policy.toml").to_str().unwrap(),
        "--zygote",
        "--python",
        PY,
        "--preload",
        &module,
        "--zygotes",
        "1",
        "--",
        PY,
        s.path("worker.py").to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec();
    (s, module, args)
}

/// Runs the serve fixture until the worker ends; returns what the worker printed last (JSON).
/// wfjail's stderr (guests' output: GBs from a flood while serve has no output limit) is
/// discarded, not collected in this process's memory.
fn serve_json(tag: &str, worker: &str) -> (Value, String) {
    let (s, module, args) = serve_fixture(tag, worker);
    let out = Command::new(wfjail_bin())
        .current_dir(&s.0)
        .args(&args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "wfjail serve exits 0: {stdout}");
    let r: Value = serde_json::from_str(stdout.trim().lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("worker output {stdout:?}: {e}"));
    assert_no_survivor(&module, tag);
    (r, module)
}

/// A worker that connects, goes as far as `phase`, and closes its connection: what is left
/// once things settle (guests and wfjail descriptors over the baseline, zombies), per attempt.
fn worker_leaves(tag: &str, phase: &str, attempts: usize) -> Value {
    let worker = format!(
        r#"
base, fd0 = baseline()
out = []
for _ in range({attempts}):
    phase = {phase:?}
    conn = raw_session("hang" if phase == "mid-call" else "echo")
    if phase != "after OPEN":
        kind, _ = read_frame(conn)
        assert kind == wc.OPENED, kind
        if phase == "mid-session":
            conn.sendall(wc._frame(wc.CALL, b"one"))
            kind, body = read_frame(conn)
            assert (kind, body) == (wc.RESULT, b"one"), (kind, body)
        else:
            conn.sendall(wc._frame(wc.CALL, b"spin"))
            time.sleep(0.3)
    conn.close()
    settle(base, fd0)
    out.append({{"guests": len(ours()) - base, "zombies": zombies(), "fds": fds() - fd0}})
# The server still serves.
with c.session(handler=MOD + ":echo") as s:
    assert s.call(b"ok") == b"ok"
print(json.dumps(out))
"#
    );
    serve_json(tag, &worker).0
}

#[test]
fn a_worker_that_leaves_mid_session_or_mid_call_leaks_nothing() {
    for phase in ["mid-session", "mid-call"] {
        let r = worker_leaves("leave", phase, 1);
        assert_eq!(
            r,
            serde_json::json!([{"guests": 0, "zombies": [], "fds": 0}]),
            "{phase}"
        );
    }
}

/// Found by this file: OPEN and the end of the connection read together (the worker sent
/// OPEN and closed at once, or died) leave the guest idle for as long as the server runs,
/// with its descriptors: `session::run` sees `client.gone` from `read_open`, but only
/// `on_client` turns `gone` into `close_requested`, and a gone client is no longer polled.
/// Timing decides which read sees the end, so the test tries three times.
#[test]
fn a_worker_that_leaves_right_after_open_leaks_nothing() {
    let r = worker_leaves("leave-open", "after OPEN", 3);
    let clean = serde_json::json!({"guests": 0, "zombies": [], "fds": 0});
    assert_eq!(r, serde_json::json!([clean, clean, clean]));
}

#[test]
fn sessions_whose_guest_crashes_hangs_or_floods_leak_nothing() {
    let worker = r#"
base, fd0 = baseline()
out = {}
for name, timeout in [("crash", None), ("hang", "500ms"), ("flood", "3s")]:
    try:
        with c.session(handler=MOD + ":" + name, timeout=timeout) as s:
            s.call(b"x")
            result = ["no failure"]
    except SessionFailed as e:
        result = [e.status, e.report.get("signal"), bool(e.report.get("error"))]
    settle(base, fd0)
    out[name] = {"result": result, "guests": len(ours()) - base, "zombies": zombies(), "fds": fds() - fd0}
with c.session(handler=MOD + ":echo") as s:
    out["still serves"] = s.call(b"ok").decode()
print(json.dumps(out))
"#;
    let (r, _) = serve_json("guestfaults", worker);
    let clean = |name: &str, result: Value| {
        assert_eq!(
            r[name],
            serde_json::json!({"result": result, "guests": 0, "zombies": [], "fds": 0}),
            "{name}: {r}"
        );
    };
    clean("crash", serde_json::json!(["crashed", "SIGSEGV", false]));
    clean("hang", serde_json::json!(["timeout", "SIGKILL", true]));
    // Until serve applies limits.output (issue 7, B), the per-call timeout ends a flood.
    let flood = r["flood"]["result"][0].as_str().unwrap().to_string();
    assert!(["limit", "timeout"].contains(&flood.as_str()), "{r}");
    clean("flood", serde_json::json!([flood, "SIGKILL", true]));
    assert_eq!(r["still serves"], "ok");
}

#[test]
fn a_flooding_session_is_stopped_at_the_output_limit() {
    let worker = r#"
try:
    with c.session(handler=MOD + ":flood", timeout="10s") as s:
        s.call(b"x")
    out = ["no failure"]
except SessionFailed as e:
    out = [e.status, e.report.get("limit"), e.report.get("signal")]
print(json.dumps(out))
"#;
    let (r, _) = serve_json("floodlimit", worker);
    assert_eq!(r, serde_json::json!(["limit", "output", "SIGKILL"]));
}

/// Starts the serve fixture with a worker that opens a session spinning in `hang` and says
/// `up`; returns the server and the module (the guests' marker).
fn serve_mid_call(tag: &str) -> (Scratch, Child, String) {
    let worker = r#"
signal.signal(signal.SIGTERM, lambda *a: sys.exit(3))
conn = raw_session("hang")
assert read_frame(conn)[0] == wc.OPENED
conn.sendall(wc._frame(wc.CALL, b"spin"))
time.sleep(0.3)
print("up", len(ours()), flush=True)
time.sleep(600)
"#;
    let (s, module, args) = serve_fixture(tag, worker);
    let mut child = Command::new(wfjail_bin())
        .current_dir(&s.0)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("up "), "{line:?}");
    // The zygote, its spare and the spinning session at least.
    assert!(
        alive_with(&module, &[child.id(), std::process::id()]).len() >= 2,
        "guests run"
    );
    (s, child, module)
}

#[test]
fn sigterm_to_wfjail_serve_mid_call_ends_every_guest() {
    let (_s, mut child, module) = serve_mid_call("sigterm-serve");
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(3), "the worker's status");
    assert_no_survivor(&module, "after SIGTERM to wfjail serve");
}

#[test]
fn sigkill_to_wfjail_serve_mid_call_takes_every_guest_along() {
    let (_s, mut child, module) = serve_mid_call("sigkill-serve");
    let server = child.id();
    // The worker is not a guest: it is the caller's own program. Find it to end it ourselves.
    let worker: Vec<u32> = alive_with("worker.py", &[server, std::process::id()])
        .into_iter()
        .filter(|&p| stat(p).is_some_and(|(_, ppid)| ppid == server))
        .collect();
    child.kill().unwrap();
    child.wait().unwrap();
    // A killed server cannot remove its socket (the next one at that path replaces it).
    let _ = std::fs::remove_file(std::env::temp_dir().join(format!("wfjail-{server}.sock")));
    // Everything with the module in its command line except the worker is a guest.
    let guests_left = || {
        alive_with(&module, &[std::process::id()])
            .into_iter()
            .filter(|p| !worker.contains(p))
            .collect::<Vec<_>>()
    };
    let gone = eventually(|| guests_left().is_empty());
    for w in &worker {
        let _ = Command::new("kill")
            .args(["-KILL", &w.to_string()])
            .status();
    }
    assert!(
        gone,
        "guests after SIGKILL to wfjail serve: {:?}",
        guests_left()
    );
}
