//! Issue 28: a zygote session's pinned pid answered in the guest. Under `clock = "virtual"`
//! the router answers an armed session's `getpid`/`gettid` with the pinned pid; when it
//! answers the first, it rewrites the session's C library so that the later ones return the
//! same value without a notification (src/answers/guest_pid.rs). The filter stays: a raw
//! `syscall(SYS_getpid)` still reaches the router and reads the same value. Counted, not
//! timed: STATUS's `pid_answers` says how many the router answered.

use crate::common::*;

const PROBE: &str = r#"
import ctypes, json, os, threading
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def probe(req):
    if req == b"first":
        return json.dumps([os.getpid()]).encode()
    if req == b"many":
        pids = {os.getpid() for _ in range(1000)}
        pids |= {libc.getpid() for _ in range(100)}
        pids |= {libc.gettid() for _ in range(100)}
        return json.dumps(sorted(pids)).encode()
    # The filter's path: the system calls themselves, past the C library's functions
    # (CPython's threading.get_native_id() is syscall(SYS_gettid) on Linux).
    return json.dumps([libc.syscall(39), libc.syscall(186), threading.get_native_id(),
                       os.getpid()]).encode()
"#;

const WORKER: &str = r#"
c = Client()
def notified():
    return c.status()["pid_answers"]["notified"]
out = {}
for round in range(2):
    with c.session(handler=MOD + ":probe", seed=1, time_ns=1_000_000_000_000) as s:
        before = notified()
        first = json.loads(s.call(b"first"))
        after_first = notified()
        many = json.loads(s.call(b"many"))
        after_many = notified()
        raw = json.loads(s.call(b"raw"))
        after_raw = notified()
    out[round] = {"first": first, "many": many, "raw": raw,
                  "first_notified": after_first - before, "many_notified": after_many - after_first,
                  "raw_notified": after_raw - after_many}
out["status"] = c.status()["pid_answers"]
print(json.dumps(out))
"#;

#[test]
fn a_sessions_pinned_pid_is_answered_in_its_c_library_after_the_first() {
    let out = serve_one_zygote("pid-in-guest", "pidg", PROBE, "", WORKER);
    out.check(out.code == 0, "wfjail serve exits 0");
    let r: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    let pinned = 4_194_303;
    for round in ["0", "1"] {
        let s = &r[round];
        out.check(
            s["first"] == serde_json::json!([pinned]),
            &format!("round {round}: the first os.getpid() is the pinned pid ({s})"),
        );
        out.check(
            s["many"] == serde_json::json!([pinned]),
            &format!(
                "round {round}: os.getpid(), C getpid() and C gettid() read the pinned pid \
                 ({s})"
            ),
        );
        out.check(
            s["raw"] == serde_json::json!([pinned, pinned, pinned, pinned]),
            &format!(
                "round {round}: syscall(SYS_getpid), syscall(SYS_gettid) and \
                 threading.get_native_id() too ({s})"
            ),
        );
        // The session's first getpid reached the router; once it had, none of the 1,200 calls
        // of `many` did.
        out.check(
            s["many_notified"] == 0,
            &format!("round {round}: no getpid/gettid notified after the first ({s})"),
        );
        out.check(
            s["first_notified"] == 1,
            &format!("round {round}: the first reached the router ({s})"),
        );
        out.check(
            s["raw_notified"] == 3,
            &format!("round {round}: the three raw system calls reached the router ({s})"),
        );
    }
    let status = &r["status"];
    out.check(
        status["in_guest"] == 2,
        &format!("both sessions answer it in the guest ({status})"),
    );
    for (k, v) in status.as_object().unwrap() {
        if k.starts_with("skipped_") {
            out.check(v == 0, &format!("{k} is 0 ({status})"));
        }
    }
}

// A session with two threads alive at its first getpid is left to the router (another
// thread could run the entry while it is rewritten): every read is still the pinned pid.
const THREADED: &str = r#"
import ctypes, json, os, threading
libc = ctypes.CDLL(None)
# A sem_t of value 0: sem_wait on it blocks in a futex wait until the process ends. (Not
# pause(): the policy refuses it as a sleep, and the thread then ended at once, sometimes
# before the first pinned read, which found the process alone.)
sem = ctypes.create_string_buffer(32)
def probe(req):
    # A thread the C library starts (CPython's own thread start reads the native id of the
    # starting thread first, while it is alone): it waits in sem_wait until the process
    # ends. The session's first pinned read is then made with two threads.
    tid = ctypes.c_ulong()
    assert libc.pthread_create(ctypes.byref(tid), None, libc.sem_wait, sem) == 0
    got = {os.getpid() for _ in range(50)} | {threading.get_native_id()}
    got |= {libc.getpid() for _ in range(50)}
    return json.dumps(sorted(got)).encode()
"#;

#[test]
fn a_session_with_threads_is_left_to_the_router_and_reads_the_same_pid() {
    let worker = "c = Client()\nwith c.session(handler=MOD + \":probe\", seed=1, time_ns=1_000_000_000_000) as s:\n    print(s.call(b\"a\").decode())\nprint(json.dumps(c.status()[\"pid_answers\"]))\n";
    let threads = "[process]\nthreads = \"allow\"\n[limits]\nprocesses = 16\n";
    let out = serve_one_zygote("pid-threads", "pidt", THREADED, threads, worker);
    out.check(out.code == 0, "wfjail serve exits 0");
    let lines: Vec<serde_json::Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    out.check(
        lines[0] == serde_json::json!([4_194_303]),
        &format!("every read is the pinned pid ({})", lines[0]),
    );
    let status = &lines[1];
    out.check(
        status["in_guest"] == 0 && status["skipped_not_alone"] == 1,
        &format!("left to the router: not alone ({status})"),
    );
    out.check(
        status["notified"].as_u64().unwrap() >= 101,
        &format!("the router answered each ({status})"),
    );
}
