//! The supervisor's side of the guest conversation (docs/protocol.md): what may come from the
//! guest and when. Pure logic, fed with bytes; the supervisor does the I/O.

use super::frame::{Decoder, FrameError, Kind, encode};
use crate::report::{GuestError, Violation};

/// The protocol version this supervisor speaks.
pub const VERSION: u16 = 1;
/// The magic that starts a HELLO payload.
pub const MAGIC: &[u8; 6] = b"wfjail";

/// The HELLO payload for `version`.
pub fn hello(version: u16) -> Vec<u8> {
    let mut p = MAGIC.to_vec();
    p.extend_from_slice(&version.to_le_bytes());
    p
}

/// What the supervisor first writes to a guest: HELLO and the request.
pub fn opening(request: &[u8]) -> Vec<u8> {
    let mut out = encode(Kind::Hello, &hello(VERSION));
    out.extend(encode(Kind::Request, request));
    out
}

/// How many bytes of answers the supervisor holds for a guest beyond its opening (HELLO and
/// the request): a guest that sends QUERY frames and never reads fd 3 hits this bound instead
/// of growing the supervisor's memory, and is stopped.
pub const OUTBOX_SLACK: usize = 4 << 20;

/// The largest VIOLATIONS answer (JSON payload); entries that do not fit are left out of
/// that answer (they stay in the report).
pub const MAX_ANSWER: usize = 1 << 20;

/// Bytes the supervisor has queued for a guest and the guest has not read yet, with a bound.
/// Writing moves an offset; the written prefix is dropped once it is half the buffer, so the
/// cost stays linear in what is sent.
#[derive(Debug)]
pub struct Outbox {
    buf: Vec<u8>,
    pos: usize,
    limit: usize,
}

/// The guest did not read what it asked for (docs/protocol.md: the execution ends as
/// `guest_error`, the same as any other breach of the conversation).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the guest left more than {limit} bytes of answers unread on fd 3 \
     (QUERY frames sent without reading the VIOLATIONS answers)"
)]
pub struct OutboxFull {
    pub limit: usize,
}

impl From<OutboxFull> for ProtocolError {
    fn from(e: OutboxFull) -> Self {
        ProtocolError(e.to_string())
    }
}

impl Outbox {
    /// An outbox holding at most `limit` unread bytes.
    pub fn new(limit: usize) -> Self {
        Outbox {
            buf: Vec::new(),
            pos: 0,
            limit,
        }
    }

    /// An outbox that starts with `opening` (HELLO and the request) and holds at most
    /// [`OUTBOX_SLACK`] more.
    pub fn with_opening(opening: Vec<u8>) -> Self {
        Outbox {
            limit: opening.len() + OUTBOX_SLACK,
            buf: opening,
            pos: 0,
        }
    }

    /// Queues `frame`, or refuses it when the unread bytes would exceed the bound (then
    /// nothing is queued).
    pub fn push(&mut self, frame: &[u8]) -> Result<(), OutboxFull> {
        if self.len().saturating_add(frame.len()) > self.limit {
            return Err(OutboxFull { limit: self.limit });
        }
        if self.pos > 0 && self.pos >= self.buf.len() / 2 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        self.buf.extend_from_slice(frame);
        Ok(())
    }

    /// The bytes still to be written.
    pub fn pending(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    /// `n` bytes of [`Outbox::pending`] were written.
    pub fn advance(&mut self, n: usize) {
        self.pos = (self.pos + n).min(self.buf.len());
        if self.pos == self.buf.len() {
            self.buf = Vec::new();
            self.pos = 0;
        }
    }

    pub fn len(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops everything (the guest closed its end).
    pub fn clear(&mut self) {
        self.buf = Vec::new();
        self.pos = 0;
    }
}

/// The VIOLATIONS frame answering a QUERY: `list` as JSON, at most `min(cap, MAX_ANSWER)`
/// bytes of payload (trailing entries that do not fit are left out of this answer).
pub fn violations_frame(list: &[Violation], cap: usize) -> Vec<u8> {
    let max = cap.min(MAX_ANSWER);
    let mut n = list.len();
    loop {
        let json = serde_json::to_vec(&list[..n]).unwrap_or_else(|_| b"[]".to_vec());
        if json.len() <= max || n == 0 {
            let json = if json.len() <= max { json } else { Vec::new() };
            return encode(Kind::Violations, &json);
        }
        n /= 2;
    }
}

/// What a frame from the guest costs against `limits.output`: the whole frame for what is
/// a log or a request to the supervisor (LOG, QUERY, HELLO), so that empty frames are not
/// free; the header only for RESULT and ERROR, whose payload is the execution's outcome
/// (bounded by the frame cap, one per call).
pub fn output_charge(kind: Kind, payload_len: usize) -> u64 {
    match kind {
        Kind::Result | Kind::Error => 5,
        _ => 5 + payload_len as u64,
    }
}

/// Something the guest said that the supervisor must act on.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Log {
        level: u8,
        text: String,
    },
    /// The guest's HELLO: it is ready for calls.
    Hello,
    /// Answer with the violations recorded since the previous query.
    Query,
    Result(Vec<u8>),
    Error(GuestError),
    /// A question for the worker during the call (answered with a REPLY frame).
    Upcall(Vec<u8>),
}

/// A broken conversation; the execution ends as `guest_error` with this message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("protocol error: {0}")]
pub struct ProtocolError(pub String);

impl From<FrameError> for ProtocolError {
    fn from(e: FrameError) -> Self {
        ProtocolError(e.to_string())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before the guest's HELLO; `call` if a REQUEST is already on its way.
    AwaitHello { call: bool },
    /// A call is in progress: LOG, QUERY, then RESULT or ERROR.
    Calling,
    /// No call in progress (answered, or none sent yet); only LOG may come.
    Idle,
}

/// One guest's conversation.
#[derive(Debug)]
pub struct Conversation {
    decoder: Decoder,
    state: State,
    /// Output charge of the frames decoded since [`Conversation::take_charge`].
    charge: u64,
}

impl Conversation {
    /// `cap`: the largest payload accepted from this guest.
    pub fn new(cap: usize) -> Self {
        Conversation {
            decoder: Decoder::new(cap),
            state: State::AwaitHello { call: false },
            charge: 0,
        }
    }

    /// What the frames decoded since the previous call cost against `limits.output`
    /// ([`output_charge`]), including frames of a `feed` that ended in an error.
    pub fn take_charge(&mut self) -> u64 {
        std::mem::take(&mut self.charge)
    }

    /// Whether no call is in progress (the last one was answered, or none was made).
    pub fn idle(&self) -> bool {
        matches!(self.state, State::Idle | State::AwaitHello { call: false })
    }

    /// The supervisor wrote a REQUEST: a call is in progress until its answer.
    pub fn begin_call(&mut self) {
        self.state = match self.state {
            State::AwaitHello { .. } => State::AwaitHello { call: true },
            _ => State::Calling,
        };
    }

    /// Feeds bytes from the guest; returns the events they complete.
    pub fn feed(&mut self, data: &[u8]) -> Result<Vec<Event>, ProtocolError> {
        self.decoder.feed(data);
        let mut events = Vec::new();
        while let Some((kind, payload)) = self.decoder.next_frame()? {
            self.charge += output_charge(kind, payload.len());
            events.push(self.on_frame(kind, payload)?);
        }
        Ok(events)
    }

    /// The guest's output ended: fine between frames, an error inside one.
    pub fn eof(&mut self) -> Result<(), ProtocolError> {
        self.decoder.finish()?;
        Ok(())
    }

    fn on_frame(&mut self, kind: Kind, payload: Vec<u8>) -> Result<Event, ProtocolError> {
        let unexpected = |why: &str| {
            Err(ProtocolError(format!(
                "unexpected {} frame from the guest {why}",
                kind.name()
            )))
        };
        match (self.state, kind) {
            (State::AwaitHello { call }, Kind::Hello) => {
                let version = check_hello(&payload)?;
                if version != VERSION {
                    return Err(ProtocolError(format!(
                        "the guest speaks protocol version {version}; this wfjail speaks {VERSION}"
                    )));
                }
                self.state = if call { State::Calling } else { State::Idle };
                Ok(Event::Hello)
            }
            // A guest that cannot start (wrong version, no handler) says why with an ERROR
            // instead of HELLO.
            (State::AwaitHello { .. }, Kind::Error) => {
                self.state = State::Idle;
                Ok(Event::Error(parse_error(&payload)?))
            }
            (State::AwaitHello { .. }, _) => unexpected("(its first frame must be HELLO)"),
            (_, Kind::Log) => {
                let (&level, text) = payload
                    .split_first()
                    .ok_or_else(|| ProtocolError("LOG frame without a level byte".into()))?;
                Ok(Event::Log {
                    level,
                    text: String::from_utf8_lossy(text).into_owned(),
                })
            }
            (State::Calling, Kind::Query) => Ok(Event::Query),
            (State::Calling, Kind::Upcall) => Ok(Event::Upcall(payload)),
            (State::Calling, Kind::Result) => {
                self.state = State::Idle;
                Ok(Event::Result(payload))
            }
            (State::Calling, Kind::Error) => {
                self.state = State::Idle;
                Ok(Event::Error(parse_error(&payload)?))
            }
            (State::Idle, Kind::Result | Kind::Error | Kind::Query | Kind::Upcall) => {
                unexpected("outside a call (after its answer, or before any request)")
            }
            (_, Kind::Hello) => unexpected("(HELLO is sent once)"),
            (_, Kind::Request | Kind::Violations | Kind::Reply) => {
                unexpected("(only the supervisor sends it)")
            }
        }
    }
}

/// A REPLY frame: status 0 and the worker's answer, or status 1 and why there is none.
pub fn reply_frame(answer: Result<&[u8], &str>) -> Vec<u8> {
    let mut payload = Vec::new();
    match answer {
        Ok(bytes) => {
            payload.push(0);
            payload.extend_from_slice(bytes);
        }
        Err(why) => {
            payload.push(1);
            payload.extend_from_slice(why.as_bytes());
        }
    }
    encode(Kind::Reply, &payload)
}

/// Checks a HELLO payload and returns its version.
pub fn check_hello(payload: &[u8]) -> Result<u16, ProtocolError> {
    if payload.len() != 8 || &payload[..6] != MAGIC {
        return Err(ProtocolError(
            "HELLO without the \"wfjail\" magic and a 2-byte version".into(),
        ));
    }
    Ok(u16::from_le_bytes([payload[6], payload[7]]))
}

/// Parses an ERROR payload: a JSON object with string `type`, `message`, `traceback`.
fn parse_error(payload: &[u8]) -> Result<GuestError, ProtocolError> {
    let bad = || {
        ProtocolError(
            "ERROR payload is not a JSON object with string type, message and traceback".into(),
        )
    };
    let v: serde_json::Value = serde_json::from_slice(payload).map_err(|_| bad())?;
    let field = |k: &str| {
        v.get(k)
            .and_then(|x| x.as_str())
            .map(str::to_string)
            .ok_or_else(bad)
    };
    Ok(GuestError {
        kind: field("type")?,
        message: field("message")?,
        traceback: field("traceback")?,
    })
}

/// The guest's descriptor numbers for the protocol pipes (docs/protocol.md).
pub const PROTOCOL_FDS: (i32, i32) = (3, 4);

/// The environment that tells a framed guest where its protocol pipes are (docs/protocol.md).
pub fn protocol_env(policy: &crate::policy::Policy) -> Vec<(String, String)> {
    vec![
        ("WFJAIL_PROTOCOL".into(), VERSION.to_string()),
        (
            "WFJAIL_FDS".into(),
            format!("{},{}", PROTOCOL_FDS.0, PROTOCOL_FDS.1),
        ),
        ("WFJAIL_FRAME_CAP".into(), frame_cap(policy).to_string()),
        // Where randomness comes from, so that a zygote's session knows whether it may
        // reseed Python's `random` (python/wfjail/zygote.py).
        (
            "WFJAIL_GETRANDOM".into(),
            policy.random.getrandom.as_str().into(),
        ),
    ]
}

/// The largest frame payload accepted: 16 MiB, or `limits.output` if smaller.
pub fn frame_cap(policy: &crate::policy::Policy) -> usize {
    (policy.limits.output.0 as usize).min(crate::protocol::MAX_FRAME)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guest_bytes(frames: &[(Kind, &[u8])]) -> Vec<u8> {
        frames.iter().flat_map(|(k, p)| encode(*k, p)).collect()
    }

    #[test]
    fn upcalls_are_events_of_a_call_only() {
        let mut c = Conversation::new(1024);
        c.begin_call();
        let mut bytes = encode(Kind::Hello, &hello(VERSION));
        bytes.extend(encode(Kind::Upcall, b"q"));
        bytes.extend(encode(Kind::Result, b"r"));
        assert_eq!(
            c.feed(&bytes).unwrap(),
            vec![
                Event::Hello,
                Event::Upcall(b"q".to_vec()),
                Event::Result(b"r".to_vec())
            ]
        );
        let e = c.feed(&encode(Kind::Upcall, b"late")).unwrap_err();
        assert!(e.0.contains("unexpected UPCALL frame"), "{e}");
        // REPLY is the supervisor's to send.
        let mut c = Conversation::new(1024);
        let e = c
            .feed(
                &[
                    encode(Kind::Hello, &hello(VERSION)),
                    encode(Kind::Reply, b"\0"),
                ]
                .concat(),
            )
            .unwrap_err();
        assert!(e.0.contains("only the supervisor sends it"), "{e}");
    }

    #[test]
    fn a_good_conversation() {
        let mut c = Conversation::new(1024);
        c.begin_call();
        let bytes = guest_bytes(&[
            (Kind::Hello, &hello(1)),
            (Kind::Log, b"\x14hello"),
            (Kind::Query, b""),
            (Kind::Result, b"42"),
            (Kind::Log, b"\x14bye"),
        ]);
        let events = c.feed(&bytes).unwrap();
        assert_eq!(
            events,
            vec![
                Event::Hello,
                Event::Log {
                    level: 20,
                    text: "hello".into()
                },
                Event::Query,
                Event::Result(b"42".to_vec()),
                Event::Log {
                    level: 20,
                    text: "bye".into()
                },
            ]
        );
        c.eof().unwrap();
    }

    #[test]
    fn out_of_order_and_malformed() {
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (
                guest_bytes(&[(Kind::Result, b"x")]),
                "first frame must be HELLO",
            ),
            (guest_bytes(&[(Kind::Hello, &hello(2))]), "version 2"),
            (guest_bytes(&[(Kind::Hello, b"nope")]), "magic"),
            (
                guest_bytes(&[
                    (Kind::Hello, &hello(1)),
                    (Kind::Result, b""),
                    (Kind::Result, b""),
                ]),
                "outside a call",
            ),
            (
                guest_bytes(&[(Kind::Hello, &hello(1)), (Kind::Request, b"")]),
                "only the supervisor",
            ),
            (
                guest_bytes(&[(Kind::Hello, &hello(1)), (Kind::Error, b"{}")]),
                "JSON object",
            ),
            (
                guest_bytes(&[(Kind::Hello, &hello(1)), (Kind::Log, b"")]),
                "level byte",
            ),
        ];
        for (bytes, want) in cases {
            let mut c = Conversation::new(1024);
            c.begin_call();
            let e = c.feed(&bytes).unwrap_err();
            assert!(e.0.contains(want), "{e} should mention {want}");
        }
        let mut c = Conversation::new(1024);
        c.feed(&encode(Kind::Hello, &hello(1))[..5]).unwrap();
        assert!(c.eof().unwrap_err().0.contains("truncated"));
    }

    #[test]
    fn the_outbox_is_bounded() {
        let mut o = Outbox::with_opening(opening(b"req"));
        let opening_len = o.len();
        let answer = encode(Kind::Violations, b"[]");
        let fits = OUTBOX_SLACK / answer.len();
        for _ in 0..fits {
            o.push(&answer).unwrap();
        }
        assert!(o.push(&answer).is_err(), "over the bound");
        assert_eq!(o.len(), opening_len + fits * answer.len());
        // Written bytes make room again.
        let n = o.pending().len();
        o.advance(n);
        assert!(o.is_empty());
        o.push(&answer).unwrap();
        assert_eq!(o.pending(), &answer[..]);
    }

    #[test]
    fn answers_and_charges_are_bounded() {
        let v = Violation {
            category: crate::policy::syscalls::Category::Filesystem,
            syscall: "openat".into(),
            args: "x".repeat(1000),
            action: crate::report::Action::Denied,
            rule: "r".into(),
            hint: "h".into(),
            count: 1,
        };
        let list = vec![v; 100];
        let f = violations_frame(&list, 10_000);
        assert!(f.len() <= 10_005);
        let json: serde_json::Value = serde_json::from_slice(&f[5..]).unwrap();
        assert!(!json.as_array().unwrap().is_empty());
        let mut c = Conversation::new(64);
        c.begin_call();
        let bytes = guest_bytes(&[
            (Kind::Hello, &hello(1)),
            (Kind::Log, b"\x14"),
            (Kind::Query, b""),
        ]);
        c.feed(&bytes).unwrap();
        assert_eq!(
            c.take_charge(),
            bytes.len() as u64,
            "empty frames are charged"
        );
        assert_eq!(c.take_charge(), 0);
    }

    #[test]
    fn sessions_allow_another_call() {
        let mut c = Conversation::new(64);
        let e = c.feed(&guest_bytes(&[(Kind::Hello, &hello(1))])).unwrap();
        assert_eq!(e, vec![Event::Hello]);
        assert!(c.idle());
        assert!(
            c.feed(&guest_bytes(&[(Kind::Result, b"0")]))
                .unwrap_err()
                .0
                .contains("outside a call")
        );
        let mut c = Conversation::new(64);
        c.feed(&guest_bytes(&[(Kind::Hello, &hello(1))])).unwrap();
        c.begin_call();
        assert_eq!(
            c.feed(&guest_bytes(&[(Kind::Result, b"1")])).unwrap(),
            vec![Event::Result(b"1".to_vec())]
        );
        assert!(c.idle());
        c.begin_call();
        let e = c.feed(&guest_bytes(&[(Kind::Result, b"2")])).unwrap();
        assert_eq!(e, vec![Event::Result(b"2".to_vec())]);
    }
}
