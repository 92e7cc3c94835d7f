//! Sessions from many lanes at once (issue 28): every wait on a session's path ends on its
//! event, so none of the server's backstops fires (`waits_timed_out` in STATUS stays 0) and no
//! session fails, whether the worker's sessions come from threads of the sync client or from
//! tasks of the async one. A test of the mechanism, not of time: it counts, it does not time.

use crate::common::*;

/// Each call reads the wall and monotonic clocks and the pid (under `clock = "virtual"` these
/// reach the supervisor: a session's first calls race its FORKED to the router) and counts
/// the calls its process answered (1 in a fresh session).
const HANDLERS: &str = r#"
import os, time
CALLS = [0]
def echo(req):
    CALLS[0] += 1
    time.time(); time.monotonic(); os.getpid()
    return b"%d:" % CALLS[0] + req
"#;

const WORKER: &str = r#"
import asyncio
PER_LANE = 6
out = {"fails": [], "answers": {}}

def lane(tag):
    c = Client()
    for i in range(PER_LANE):
        try:
            with c.session(handler=MOD + ":echo") as s:
                answer = s.call(b"x").decode()
            out["answers"][answer] = out["answers"].get(answer, 0) + 1
        except Exception as e:
            out["fails"].append("%s: %s: %s" % (tag, type(e).__name__, e))

async def alane(tag):
    c = AsyncClient()
    for i in range(PER_LANE):
        try:
            async with c.session(handler=MOD + ":echo") as s:
                answer = (await s.call(b"x")).decode()
            out["answers"][answer] = out["answers"].get(answer, 0) + 1
        except Exception as e:
            out["fails"].append("%s: %s: %s" % (tag, type(e).__name__, e))

for lanes in (2, 8, 32):
    threads = [threading.Thread(target=lane, args=("sync %d" % lanes,)) for _ in range(lanes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    async def all_lanes():
        await asyncio.gather(*(alane("async %d" % lanes) for _ in range(lanes)))
    asyncio.run(all_lanes())
status = Client().status()
out["waits_timed_out"] = status["waits_timed_out"]
out["open"] = status["open"]
print(json.dumps(out))
"#;

#[test]
fn sessions_from_2_8_and_32_lanes_of_both_clients_end_every_wait_on_its_event() {
    let (s, module) = serve_scratch("lanes", "ln", HANDLERS, "", &[], WORKER);
    let policy = s.path("policy.toml").display().to_string();
    let worker = s.path("worker.py").display().to_string();
    let mut args = vec!["serve", "-p", &policy];
    let zygote = zygote_args(&module, "2");
    args.extend(zygote.iter().map(String::as_str));
    args.extend(["--", PY, &worker]);
    let out = wfjail_with(&args, |c| {
        c.current_dir(&s.0);
    });
    out.check(out.code == 0, "wfjail serve exits 0");
    let r: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(r["fails"], serde_json::json!([]), "{}", out.stderr);
    // Every session was fresh: its one call was its process's first.
    let sessions = (2 + 8 + 32) * 6 * 2;
    assert_eq!(r["answers"], serde_json::json!({"1:x": sessions}));
    // Every wait is listed, and none ended on its timeout.
    let waits = r["waits_timed_out"].as_object().unwrap();
    assert!(waits.contains_key("forked_before_call"), "{waits:?}");
    assert!(
        waits.values().all(|n| n == 0),
        "waits that ended on their backstop: {waits:?}\n{}",
        out.stderr
    );
    assert_eq!(r["open"], 0);
}
