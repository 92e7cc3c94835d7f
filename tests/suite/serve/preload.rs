//! What a zygote may preload: modules that do at import what the worker let them do
//! unconfined (start a thread, as grpc does; probe a temporary directory, as litellm does),
//! while every session child forked from it stays under the whole policy.

use crate::common::serve_scratch;

/// A module whose import starts a thread that lives on (it waits on an event) and asks
/// `tempfile` for a directory it can write (gettempdir() creates and removes a file there),
/// then writes a file of its own there; and a session's handlers.
const STARTS_A_THREAD_AND_PROBES_TEMP: &str = r#"
import os, tempfile, threading, time
_idle, _ticked, _outcome = threading.Event(), threading.Event(), []
def _background():
    # A client library's loop: it sleeps and reads the clock, then waits.
    try:
        start = time.monotonic()
        for _ in range(3):
            time.sleep(0.01)
        _outcome.append("slept %s" % (time.monotonic() - start >= 0.03))
    except BaseException as e:
        _outcome.append(repr(e))
    finally:
        _ticked.set()
    _idle.wait()
threading.Thread(target=_background, name="preloaded-bg", daemon=True).start()
_ticked.wait()
BACKGROUND = _outcome[0]
TMP = tempfile.gettempdir()
with open(os.path.join(TMP, "cache"), "w") as f:
    f.write("written at import")
def hello(req):
    return ("%s|%d|%s" % (TMP, threading.active_count(), BACKGROUND)).encode()
def thread(req):
    try:
        threading.Thread(target=print).start()
        return b"started"
    except RuntimeError as e:
        return str(e).encode()
def write_tmp(req):
    import errno
    try:
        with open(os.path.join(TMP, "from-session"), "w") as f:
            f.write("x")
        return b"written"
    except OSError as e:
        return errno.errorcode[e.errno].encode()
def gettempdir(req):
    tempfile.tempdir = None
    try:
        return tempfile.gettempdir().encode()
    except OSError as e:
        return type(e).__name__.encode()
"#;

#[test]
fn a_preloaded_module_starts_a_thread_and_probes_temp_and_sessions_stay_confined() {
    let worker = r#"
import os
c = Client()
out = {}
with c.session(handler=MOD + ":hello") as s:
    tmp, threads, out["background"] = s.call(b"").decode().split("|")
out["threads_in_session"] = int(threads)
out["scratch_is_gone"] = not os.path.lexists(tmp)
out["scratch_was_private"] = os.path.basename(tmp).startswith("wfjail-zygote")
for name in ["thread", "write_tmp", "gettempdir"]:
    with c.session(handler=MOD + ":" + name) as s:
        out[name] = s.call(b"").decode()
        v = s.violations[0]
        out[name] = [out[name], v["category"], v["syscall"], v["action"], v["rule"]]
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
    let out = super::sessions::serve(&s, &module, true, &["--zygotes", "1"]);
    out.check(out.code == 0, "wfjail serve exits 0 (the zygote got ready)");
    let r: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    // The zygote's thread is not in its children: only the thread that forked is.
    assert_eq!(r["threads_in_session"], 1, "{r}");
    // The zygote's own thread slept and read the real clock while the zygote preloaded.
    assert_eq!(r["background"], "slept True", "{r}");
    assert_eq!(r["scratch_is_gone"], true, "{r}");
    assert_eq!(r["scratch_was_private"], true, "{r}");
    // A session child starts no thread and writes nowhere, the zygote's scratch included:
    // each call fails as it would in any session, and its violation reaches the worker.
    assert_eq!(
        r["thread"],
        serde_json::json!([
            "can't start new thread",
            "thread",
            "clone",
            "denied",
            "process.threads = \"deny\""
        ])
    );
    let write_denied = |answer: &str, rule: &str| {
        serde_json::json!([answer, "filesystem", "openat", "denied", rule])
    };
    // The scratch directory is gone: no grant can be shown for a path in it.
    assert_eq!(
        r["write_tmp"],
        write_denied(
            "EACCES",
            "a write the supervisor cannot judge is refused (filesystem.write must be shown \
             to grant it)"
        )
    );
    // Without the zygote's TMPDIR a session probes /tmp first, as it did before.
    assert_eq!(
        r["gettempdir"],
        write_denied(
            "FileNotFoundError",
            "filesystem.write does not grant this path"
        )
    );
    assert!(
        !out.stderr.contains("zygote 0: violation"),
        "the zygote's preloading was no violation: {}",
        out.stderr
    );
}

#[test]
fn a_preloaded_module_that_keeps_a_temp_file_open_is_refused_with_the_reason() {
    // Every session child would inherit the descriptor and could write to it.
    let keeps_open = "import tempfile\n_cache = tempfile.TemporaryFile()\n";
    let (s, module) = serve_scratch("preload-open", "pre", keeps_open, "", &[], "");
    let out = super::sessions::serve(&s, &module, true, &["--zygotes", "1"]);
    out.check(out.code == 125, "wfjail refuses to serve");
    assert!(
        out.stderr.contains(
            "the zygote could not preload: a preloaded module keeps a file of its temporary \
             directory open"
        ),
        "{}",
        out.stderr
    );
}
