//! Hostile worker connections racing `wfjail serve` (issue 27's red team): an OPEN sent again
//! on a connection whose session is being served, OPEN pipelined twice, two connections
//! racing for the last slot, OPEN sent again after BUSY, an OPEN naming a session, CLOSE
//! naming another connection's session. A connection is its session: no session is served
//! twice, none is touched from another connection, and every slot comes back (STATUS `open`
//! is 0 once each session's worker heard its last frame).

use crate::common::{PY, Scratch, serve_scratch, wfjail_with};

const HANDLERS: &str = r#"
state = []
def mutate(req):
    state.append(req.decode())
    return ("%d:%s" % (len(state), ",".join(state))).encode()
"#;

/// Raw frames on raw connections (the client would not send these), and the client for the
/// honest side. Each attack's outcome goes into `out`, printed as JSON.
const WORKER: &str = r#"
import socket, struct
from wfjail.wire_worker import OPEN, CALL, CLOSE, STATUS, OPENED, RESULT, FAILED, CLOSED, BUSY, SERVER
NAMES = {OPENED: "OPENED", RESULT: "RESULT", FAILED: "FAILED", CLOSED: "CLOSED", BUSY: "BUSY",
         SERVER: "SERVER"}
PATH = os.environ["WFJAIL_SOCKET"]

def frame(kind, payload=b""):
    return struct.pack("<IB", len(payload) + 1, kind) + payload

def connect():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    s.connect(PATH)
    return s

def frames(s):
    """Every frame until the server closes the connection: [(name, payload)]."""
    data = b""
    while True:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    out = []
    while data:
        n, kind = struct.unpack("<IB", data[:5])
        out.append((NAMES.get(kind, kind), data[5:4 + n]))
        data = data[4 + n:]
    s.close()
    return out

def one(s):
    """The next frame."""
    head = b""
    while len(head) < 5:
        head += s.recv(5 - len(head))
    n, kind = struct.unpack("<IB", head)
    body = b""
    while len(body) < n - 1:
        body += s.recv(n - 1 - len(body))
    return NAMES.get(kind, kind), body

def summary(fs):
    out = []
    for name, payload in fs:
        if name in ("FAILED", "CLOSED"):
            doc = json.loads(payload)
            out.append([name, doc.get("status"), doc.get("error")])
        elif name in ("BUSY", "SERVER"):
            out.append([name, json.loads(payload)["open"]])
        else:
            out.append([name, payload.decode(errors="replace")[:60]])
    return out

def opened_count():
    return Client().status()["open"]

OPEN_DOC = json.dumps({"handler": MOD + ":mutate"}).encode()
out = {}

# 1. OPEN sent again on a connection whose session is being served (after OPENED, and
#    pipelined before it): the session fails, no second one starts.
s = connect()
s.sendall(frame(OPEN, OPEN_DOC))
first = one(s)
s.sendall(frame(CALL, b"a") + frame(OPEN, OPEN_DOC) + frame(CALL, b"b"))
out["open_again"] = summary([first] + frames(s))
out["open_again_open"] = opened_count()
s = connect()
s.sendall(frame(OPEN, OPEN_DOC) + frame(OPEN, OPEN_DOC) + frame(CALL, b"c"))
out["open_twice"] = summary(frames(s))
out["open_twice_open"] = opened_count()

# 2. Two connections racing for the last slot (--max-executions 2, one held), 20 rounds: one
#    is served, the other is BUSY; each served one is its own session (its state is empty).
c = Client()
keep = c.session(handler=MOD + ":mutate").open()
rounds = []
for i in range(20):
    a, b = connect(), connect()
    barrier = threading.Barrier(2)
    answered = threading.Barrier(2)
    got = {}
    def race(name, s):
        barrier.wait()
        s.sendall(frame(OPEN, OPEN_DOC))
        got[name] = one(s)
        # Both answered before the winner closes: a CLOSE frees its slot at once, and an
        # OPEN read after it (a loaded machine) is rightly served.
        answered.wait()
        if got[name][0] == "OPENED":
            s.sendall(frame(CALL, name.encode() + b"%d" % i))
            got[name + "-call"] = one(s)
            s.sendall(frame(CLOSE))
        got[name + "-rest"] = [f[0] for f in frames(s)]
    ts = [threading.Thread(target=race, args=(n, s)) for n, s in (("x", a), ("y", b))]
    [t.start() for t in ts]
    [t.join() for t in ts]
    kinds = sorted(got[n][0] for n in "xy")
    winner = "x" if got["x"][0] == "OPENED" else "y"
    rounds.append([kinds, got[winner + "-call"][1].decode(), got[winner + "-rest"],
                   got["y" if winner == "x" else "x"][0]])
out["race_kinds"] = sorted(set(json.dumps(r[0]) for r in rounds))
out["race_calls"] = sorted(set(r[1][:2] for r in rounds))
out["race_rest"] = sorted(set(json.dumps(r[2]) for r in rounds))
out["race_open"] = opened_count()
keep.close()
out["race_end_open"] = opened_count()

# 3. OPEN sent again after BUSY, on the same connection and on a new one while the slot is
#    held; the client raises Busy once and does not send it again.
held = c.session(handler=MOD + ":mutate").open()
held2 = c.session(handler=MOD + ":mutate").open()
s = connect()
s.sendall(frame(OPEN, OPEN_DOC))
busy = one(s)
try:
    s.sendall(frame(OPEN, OPEN_DOC))
    again = summary(frames(s))
except (BrokenPipeError, ConnectionResetError) as e:
    again = type(e).__name__
out["busy_then_open"] = [summary([busy]), again]
import logging
retried = []
class Keep(logging.Handler):
    def emit(self, record):
        retried.append(record.getMessage())
logging.getLogger("wfjail.client").addHandler(Keep())
try:
    c.session(handler=MOD + ":mutate").open()
    out["client_busy"] = "opened"
except Busy as e:
    out["client_busy"] = ["Busy", e.open]
out["client_retried"] = retried
out["held_still"] = [held.call(b"h").decode(), held2.call(b"i").decode()]
held.close()
held2.close()
out["busy_open"] = opened_count()

# 4. An OPEN naming a session (another's number, as OPENED gave it): refused, no slot.
other = c.session(handler=MOD + ":mutate").open()
s = connect()
s.sendall(frame(OPEN, json.dumps({"handler": MOD + ":mutate", "session": other.id}).encode()))
out["named_open"] = summary(frames(s))
# 5. CLOSE naming it, and CALLs, from another connection: that connection's own session
#    closes; the other session goes on with its own state.
s = connect()
s.sendall(frame(OPEN, OPEN_DOC))
mine = one(s)
s.sendall(frame(CALL, b"mine") + frame(CLOSE, json.dumps({"session": other.id}).encode()))
out["foreign_close"] = summary([mine] + frames(s))
out["other_goes_on"] = other.call(b"o").decode()
other.close()
out["end_open"] = opened_count()
print(json.dumps(out))
"#;

#[test]
fn open_resends_busy_races_and_foreign_closes_serve_no_session_twice_and_leak_no_slot() {
    let (s, module) = serve_scratch("races", "rc", HANDLERS, "", &[], WORKER);
    let out = run(&s, &module);
    out.check(out.code == 0, "wfjail serve exits 0");
    let r: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    use serde_json::json;
    // 1. A second OPEN fails the session (its guest killed before the call queued ahead of
    //    it could answer); nothing else was opened.
    let failed = json!(["FAILED", "crashed", "unexpected OPEN frame from the worker"]);
    assert_eq!(
        r["open_again"],
        json!([["OPENED", r["open_again"][0][1]], failed]),
        "{}",
        out.stderr
    );
    assert_eq!(r["open_again_open"], 0);
    // Pipelined, the second OPEN is usually read with the first (the session fails before
    // its guest said HELLO), or else after OPENED.
    let twice = r["open_twice"].as_array().unwrap();
    assert_eq!(twice.last(), Some(&failed), "{}", r["open_twice"]);
    assert!(
        twice.len() == 1 || (twice.len() == 2 && twice[0][0] == "OPENED"),
        "{}",
        r["open_twice"]
    );
    assert_eq!(r["open_twice_open"], 0);
    // 2. Every round: one OPENED and one BUSY; the winner's session was fresh (its first
    //    call saw only itself) and CLOSED; no slot held after.
    assert_eq!(r["race_kinds"], json!(["[\"BUSY\", \"OPENED\"]"]));
    assert_eq!(r["race_calls"], json!(["1:"]));
    assert_eq!(r["race_rest"], json!(["[\"CLOSED\"]"]));
    assert_eq!(r["race_open"], 1, "the held session's");
    assert_eq!(r["race_end_open"], 0);
    // 3. BUSY ends the connection: an OPEN sent on it again opens nothing; the client
    //    raises Busy without sending it again; the held session was not disturbed.
    assert_eq!(r["busy_then_open"][0], json!([["BUSY", 2]]));
    assert!(
        r["busy_then_open"][1] == json!([])
            || r["busy_then_open"][1] == "BrokenPipeError"
            || r["busy_then_open"][1] == "ConnectionResetError",
        "{}",
        r["busy_then_open"]
    );
    assert_eq!(r["client_busy"], json!(["Busy", 2]));
    assert_eq!(r["client_retried"], json!([]));
    assert_eq!(r["held_still"], json!(["1:h", "1:i"]));
    assert_eq!(r["busy_open"], 0);
    // 4. An OPEN naming a session is not a session request.
    let named = &r["named_open"];
    assert_eq!(named[0][0], "FAILED", "{named}");
    assert!(
        named[0][2]
            .as_str()
            .unwrap()
            .starts_with("OPEN is not a valid session request: unknown field `session`"),
        "{named}"
    );
    assert_eq!(named.as_array().unwrap().len(), 1);
    // 5. A CLOSE naming another session closes the sender's own; the other goes on.
    assert_eq!(r["foreign_close"][0][0], "OPENED");
    assert_eq!(r["foreign_close"][1], json!(["RESULT", "1:mine"]));
    assert_eq!(r["foreign_close"][2][0], "CLOSED", "{}", r["foreign_close"]);
    assert_eq!(r["foreign_close"].as_array().unwrap().len(), 3);
    assert_eq!(r["other_goes_on"], "1:o");
    assert_eq!(r["end_open"], 0);
}

fn run(s: &Scratch, module: &str) -> crate::common::Outcome {
    let policy = s.path("policy.toml").display().to_string();
    let worker = s.path("worker.py").display().to_string();
    let mut args = vec!["serve", "-p", &policy, "--max-executions", "2"];
    let zygote = crate::common::zygote_args(module, "1");
    args.extend(zygote.iter().map(String::as_str));
    args.extend(["--", PY, &worker]);
    wfjail_with(&args, |c| {
        c.current_dir(&s.0);
    })
}
