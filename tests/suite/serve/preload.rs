//! What a zygote may preload: modules that do at import what the worker let them do
//! unconfined (start a thread, as grpc does; probe a temporary directory, as litellm does),
//! while every session child forked from it stays under the whole policy.

use crate::common::{PY, serve_scratch, wfjail_with};

/// A module whose import starts a thread that lives on (it waits on an event) and asks
/// `tempfile` for a directory it can write (gettempdir() creates and removes a file there),
/// then writes a file of its own there; and a session's handlers.
const STARTS_A_THREAD_AND_PROBES_TEMP: &str = r#"
import os, tempfile, threading
_event = threading.Event()
threading.Thread(target=_event.wait, name="preloaded-bg", daemon=True).start()
TMP = tempfile.gettempdir()
with open(os.path.join(TMP, "cache"), "w") as f:
    f.write("written at import")
def hello(req):
    return ("%s|%d" % (TMP, threading.active_count())).encode()
def thread(req):
    threading.Thread(target=print).start()
    return b"started"
def write_tmp(req):
    with open(os.path.join(TMP, "from-session"), "w") as f:
        f.write("x")
    return b"written"
def gettempdir(req):
    tempfile.tempdir = None
    return tempfile.gettempdir().encode()
"#;

#[test]
fn a_preloaded_module_starts_a_thread_and_probes_temp_and_sessions_stay_confined() {
    let worker = r#"
import os
c = Client()
out = {}
with c.session(handler=MOD + ":hello") as s:
    tmp, threads = s.call(b"").decode().split("|")
out["threads_in_session"] = int(threads)
out["scratch_is_gone"] = not os.path.lexists(tmp)
out["scratch_was_private"] = os.path.basename(tmp).startswith("wfjail-zygote")
for name in ["thread", "write_tmp", "gettempdir"]:
    try:
        with c.session(handler=MOD + ":" + name) as s:
            out[name] = s.call(b"").decode()
    except (Violation, GuestError):  # the call's denial, or what the code raised after it
        v = s.report["violations"][0]
        out[name] = [v["category"], v["syscall"], s.report["status"]]
print(json.dumps(out))
"#;
    let (s, module) = serve_scratch(
        "preload-thread",
        "pre",
        STARTS_A_THREAD_AND_PROBES_TEMP,
        "",
        &[],
        worker,
    );
    let args = [
        "serve",
        "-p",
        &s.path("policy.toml").display().to_string(),
        "--zygote",
        "--zygotes",
        "1",
        "--python",
        PY,
        "--preload",
        &module,
        "--",
        PY,
        &s.path("worker.py").display().to_string(),
    ]
    .map(String::from);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = wfjail_with(&args, |c| {
        c.current_dir(&s.0);
    });
    out.check(out.code == 0, "wfjail serve exits 0 (the zygote got ready)");
    let r: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    // The zygote's thread is not in its children: only the thread that forked is.
    assert_eq!(r["threads_in_session"], 1, "{r}");
    assert_eq!(r["scratch_is_gone"], true, "{r}");
    assert_eq!(r["scratch_was_private"], true, "{r}");
    // A session child starts no thread and writes nowhere, the zygote's scratch included.
    assert_eq!(
        r["thread"],
        serde_json::json!(["thread", "clone", "violation"])
    );
    assert_eq!(
        r["write_tmp"],
        serde_json::json!(["filesystem", "openat", "violation"])
    );
    assert_eq!(
        r["gettempdir"],
        serde_json::json!(["filesystem", "openat", "violation"])
    );
    assert!(
        !out.stderr.contains("zygote 0: violation"),
        "the zygote's preloading was no violation: {}",
        out.stderr
    );
}
