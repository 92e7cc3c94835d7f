//! The worker wire of `wfjail serve` (docs/protocol.md, second part): a worker opens a
//! session over the server's Unix socket, makes calls, and closes it. Same frames as the guest
//! protocol, its own kinds.

use serde::{Deserialize, Serialize};

use super::frame::{Decoder, encode_raw};

/// Client → server: start a session. JSON [`OpenRequest`].
pub const OPEN: u8 = 0x11;
/// Client → server: one call; the payload is the request.
pub const CALL: u8 = 0x12;
/// Client → server: end the session (the server answers CLOSED with the report).
pub const CLOSE: u8 = 0x13;
/// Client → server, instead of OPEN: what is the server's capacity? Answered by SERVER.
pub const STATUS: u8 = 0x14;
/// Client → server during a call: the answer to the oldest unanswered UPCALL (a status
/// byte, 0 or 1 for "no answer, here is why", then bytes), relayed to the guest.
pub const REPLY: u8 = 0x15;
/// Client → server during a call: interrupt the guest (SIGUSR2: the Python guest library
/// raises `wfjail.Interrupted` in the code that runs, which answers the call with its stack);
/// ignored outside a call.
pub const INTERRUPT: u8 = 0x16;
/// Client → server: the workflow time of the next CALL, under `[time] clock = "virtual"`:
/// 8 bytes, nanoseconds since the Unix epoch, little-endian signed. The guest's wall clock
/// reads it during that call and after, until another TIME.
pub const TIME: u8 = 0x17;
/// Server → client: the session is ready. JSON [`Opened`].
pub const OPENED: u8 = 0x21;
/// Server → client: a call's result.
pub const RESULT: u8 = 0x22;
/// Server → client: a call failed in the guest. JSON: the guest error plus `violations`.
pub const ERROR: u8 = 0x23;
/// Server → client: the session is over without a CLOSE (open failed, the guest was killed,
/// crashed, timed out or broke the protocol). JSON report; the server closes the connection.
pub const FAILED: u8 = 0x24;
/// Server → client: answer to CLOSE. JSON report; the server closes the connection.
pub const CLOSED: u8 = 0x25;
/// Server → client: answer to OPEN when every session slot is taken. JSON [`Capacity`]; the
/// server closes the connection. Nothing was started.
pub const BUSY: u8 = 0x26;
/// Server → client: answer to STATUS. JSON [`Capacity`]; the server closes the connection.
pub const SERVER: u8 = 0x27;
/// Server → client, before a call's RESULT: the violations recorded during that call (JSON
/// list of report violation entries), sent only when there are some.
pub const VIOLATIONS: u8 = 0x28;
/// Server → client: a log record of the guest (its LOG frame), for sessions opened with
/// `"logs": true`. JSON `{"level": n, "text": "..."}`; any number, before the call's answer.
pub const LOG: u8 = 0x29;
/// Server → client during a call: the guest's question (its UPCALL frame's bytes); the
/// client answers each with a REPLY, in order, before the call's answer comes.
pub const UPCALL: u8 = 0x2a;

/// Whether `k` is a kind of this wire.
pub fn known(k: u8) -> bool {
    matches!(
        k,
        OPEN | CALL
            | CLOSE
            | STATUS
            | REPLY
            | INTERRUPT
            | TIME
            | OPENED
            | RESULT
            | ERROR
            | FAILED
            | CLOSED
            | BUSY
            | SERVER
            | VIOLATIONS
            | LOG
            | UPCALL
    )
}

/// The name of a kind, for messages.
pub fn name(k: u8) -> &'static str {
    match k {
        OPEN => "OPEN",
        CALL => "CALL",
        CLOSE => "CLOSE",
        OPENED => "OPENED",
        RESULT => "RESULT",
        ERROR => "ERROR",
        FAILED => "FAILED",
        CLOSED => "CLOSED",
        STATUS => "STATUS",
        BUSY => "BUSY",
        SERVER => "SERVER",
        VIOLATIONS => "VIOLATIONS",
        LOG => "LOG",
        REPLY => "REPLY",
        INTERRUPT => "INTERRUPT",
        TIME => "TIME",
        UPCALL => "UPCALL",
        _ => "unknown",
    }
}

/// A decoder for this wire.
pub fn decoder(cap: usize) -> Decoder {
    Decoder::for_kinds(cap, known)
}

/// Encodes one frame of this wire.
pub fn encode(kind: u8, payload: &[u8]) -> Vec<u8> {
    debug_assert!(known(kind));
    encode_raw(kind, payload)
}

/// What a session runs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenRequest {
    /// Zygote mode: `module:function` in the preloaded guest (bytes -> bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handler: Option<String>,
    /// Exec mode: the guest command, speaking the guest protocol.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<String>>,
    /// Wall-clock limit for each call (`"500ms"`, `"30s"`); default: the policy's timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// The session's arguments, any JSON value of at most [`MAX_INIT`] bytes encoded: the
    /// zygote calls the handler once with it and uses what it returns as the session's
    /// handler; an exec'd guest reads it from `WFJAIL_INIT` (`wfjail.guest.init_value()`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init: Option<serde_json::Value>,
    /// Relay the guest's log records (LOG frames) to the worker instead of wfjail's stderr.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub logs: bool,
    /// The seed of the session's randomness under `[random] getrandom = "seeded"` (default
    /// 0): its `getrandom` calls get the same bytes as another session's with this seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// The workflow time under `[time] clock = "virtual"`, nanoseconds since the epoch, until
    /// a TIME frame changes it (default: the host's time when the session opens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_ns: Option<i64>,
}

/// The largest `init` of an OPEN, encoded as JSON: it travels in one zygote control packet
/// (and in an environment variable in exec mode).
pub const MAX_INIT: usize = 32 * 1024;

/// How many sessions the server runs at once and how many are open (BUSY, SERVER).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capacity {
    /// `--max-executions`.
    pub capacity: usize,
    /// Sessions holding a slot now.
    pub open: usize,
    /// Closed guests not exited yet: they hold no slot (at most `capacity` of them).
    #[serde(default)]
    pub lingering: usize,
    /// `zygote` or `exec`.
    pub mode: String,
    /// The policy's name.
    pub policy: String,
    /// Zygotes that died and were replaced since the server started (a worker relays it to
    /// its metrics: only the server sees a zygote die).
    #[serde(default)]
    pub zygote_restarts: u64,
    /// The waits on a session's path that ended on their timeout (a backstop) instead of
    /// their event, since the server started, by wait (each wait listed, zeros too): 0 in a
    /// server that works; a count is a stall some session saw.
    #[serde(default)]
    pub waits_timed_out: std::collections::BTreeMap<String, u64>,
    /// A zygote session's pinned pid, since the server started: `notified` (answered by the
    /// router), `in_guest` (sessions whose C library answers it), `skipped_*` (sessions left
    /// to the router, by reason).
    #[serde(default)]
    pub pid_answers: std::collections::BTreeMap<String, u64>,
    /// Zygotes of a zygote server (`--zygotes`), those running (ready: the server serves
    /// once the first is, and starts the others after), and those whose work after READY
    /// is done (SETTLED: their heap marked immortal and in huge pages).
    #[serde(default)]
    pub zygotes: usize,
    #[serde(default)]
    pub zygotes_ready: usize,
    #[serde(default)]
    pub zygotes_settled: usize,
}

/// The server's answer to OPEN.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Opened {
    pub session: u64,
    /// `zygote` or `exec`.
    pub mode: String,
    /// The guest's pid as the server sees it (for an operator to find the process).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<i32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_round_trip() {
        let mut d = decoder(1024);
        let mut bytes = encode(OPEN, br#"{"handler":"m:f"}"#);
        bytes.extend(encode(CALL, b"x"));
        d.feed(&bytes);
        assert_eq!(
            d.next_raw().unwrap(),
            Some((OPEN, br#"{"handler":"m:f"}"#.to_vec()))
        );
        assert_eq!(d.next_raw().unwrap(), Some((CALL, b"x".to_vec())));
        let mut bad = decoder(1024);
        bad.feed(&encode_raw(0x02, b""));
        assert_eq!(bad.next_raw().unwrap_err().code(), "unknown-kind");
        let o: OpenRequest = serde_json::from_str(r#"{"argv":["/bin/x"],"timeout":"1s"}"#).unwrap();
        assert_eq!(o.argv.unwrap(), vec!["/bin/x"]);
        assert!(serde_json::from_str::<OpenRequest>(r#"{"hander":"x"}"#).is_err());
    }
}
