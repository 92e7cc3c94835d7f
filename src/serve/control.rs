//! The zygote's control channel (python/wfjail/zygote.py): one frame per `SOCK_SEQPACKET`
//! packet, `length:u32le kind:u8 JSON`, the length counting the kind byte and the JSON. The
//! messages are typed here and parsed with serde; a packet that is not a frame, has a kind the
//! zygote does not send or a payload that is not its message is refused with a
//! [`ControlError`].
//!
//! ```text
//! wfjail -> zygote  FORK    0x31  {"session": n, "handler": "mod:func"} + 2 fds (SCM_RIGHTS)
//! zygote -> wfjail  READY   0x32  {"pid": p, "preloaded": [...], "python": "3.11.2",
//!                                  "session_domain": 7 | "why not", "control": 2,
//!                                  "error": "..." (preloading failed)}
//!                   FORKED  0x33  {"session": n, "pid": p} or {"session": n, "error": "..."}
//!                   EXITED  0x34  {"pid": p, "status": wait-status, "cpu_ms": f, "max_rss_kb": n}
//!                   SETTLED 0x35  {"immortal": n | "why not", "hugepages": KiB | "why not"}
//!                                 (its heap marked and collapsed, after READY, between forks)
//! ```
//!
//! Pids are the zygote's own (it is PID 1 of its namespace). Fields the zygote adds beyond
//! these are ignored; READY without `control` is version 1 (a package older than the field).

use serde::{Deserialize, Serialize};

/// Control frame kinds (python/wfjail/zygote.py).
pub const FORK: u8 = 0x31;
pub const READY: u8 = 0x32;
pub const FORKED: u8 = 0x33;
pub const EXITED: u8 = 0x34;
pub const SETTLED: u8 = 0x35;

/// The control channel's version (python/wfjail/zygote.py `CONTROL_VERSION`); a zygote
/// whose READY says another (or none: version 1) is refused with what to install.
pub const CONTROL_VERSION: u64 = 2;

/// wfjail → zygote: fork a child for a session (its socket and output pipe travel with it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Fork<'a> {
    pub session: u64,
    pub handler: &'a str,
    /// The session's arguments (OPEN's `init`): the handler is then a factory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub init: Option<&'a serde_json::Value>,
}

impl Fork<'_> {
    pub fn to_packet(&self) -> Vec<u8> {
        packet(FORK, self)
    }
}

/// The zygote has preloaded (or failed to: `error`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ready {
    pub pid: i32,
    pub preloaded: Vec<String>,
    pub python: String,
    #[serde(default)]
    pub session_domain: Option<SessionDomain>,
    #[serde(default = "version_1")]
    pub control: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Same-page merging, when `--merge-pages` asked: `any` when the kernel says the zygote
    /// is opted in (`PR_GET_MEMORY_MERGE`; the server opted it in before its exec), or
    /// `off: why` (`crate::merging::notice`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merging: Option<String>,
}

fn version_1() -> u64 {
    1
}

/// READY's `session_domain`: the Landlock ABI the zygote nests its session children's
/// domains with, or why it cannot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SessionDomain {
    Abi(u64),
    Refused(String),
}

/// Why a READY does not give each session a Landlock domain of its own.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoDomain {
    /// The zygote says why.
    #[error("{0}")]
    Refused(String),
    #[error("its READY says \"session_domain\": {0}")]
    NoAbi(u64),
    #[error("its READY does not say it can")]
    Unsaid,
}

impl Ready {
    /// The Landlock ABI of the session children's domains, or why there are none.
    pub fn session_domain(&self) -> Result<u64, NoDomain> {
        match &self.session_domain {
            Some(SessionDomain::Abi(abi)) if *abi >= 1 => Ok(*abi),
            Some(SessionDomain::Abi(abi)) => Err(NoDomain::NoAbi(*abi)),
            Some(SessionDomain::Refused(why)) => Err(NoDomain::Refused(why.clone())),
            None => Err(NoDomain::Unsaid),
        }
    }
}

/// The zygote forked (or failed to fork) a session's child.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Forked {
    pub session: u64,
    #[serde(flatten)]
    pub child: ForkOutcome,
}

/// FORKED's `pid` (the child's, in the zygote's namespace) or `error`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ForkOutcome {
    Pid { pid: i32 },
    Error { error: String },
}

/// A session child ended; the zygote reaped it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Exited {
    pub pid: i32,
    /// The wait status.
    pub status: i32,
    pub cpu_ms: f64,
    pub max_rss_kb: u64,
}

/// The zygote's work after READY is done (its heap marked immortal, collapsed into huge
/// pages): what each gave, said as the zygote says it (a number, or why not).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Settled {
    #[serde(default)]
    pub immortal: serde_json::Value,
    #[serde(default)]
    pub hugepages: serde_json::Value,
}

/// A message from the zygote.
#[derive(Debug, Clone, PartialEq)]
pub enum Control {
    Ready(Ready),
    Forked(Forked),
    Exited(Exited),
    Settled(Settled),
}

impl Control {
    /// The frame kind of this message.
    pub fn kind(&self) -> u8 {
        match self {
            Control::Ready(_) => READY,
            Control::Forked(_) => FORKED,
            Control::Exited(_) => EXITED,
            Control::Settled(_) => SETTLED,
        }
    }

    /// The packet the zygote sends for this message.
    pub fn to_packet(&self) -> Vec<u8> {
        match self {
            Control::Ready(m) => packet(READY, m),
            Control::Forked(m) => packet(FORKED, m),
            Control::Exited(m) => packet(EXITED, m),
            Control::Settled(m) => packet(SETTLED, m),
        }
    }
}

/// A packet that is not a control message from the zygote.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error(
        "a control packet of {len} bytes is not one frame (its length prefix must count the \
         kind and the payload)"
    )]
    NotAFrame { len: usize },
    #[error("unexpected control frame kind {0:#04x}")]
    UnexpectedKind(u8),
    #[error("{} is malformed: {source}", name(*.kind))]
    Malformed { kind: u8, source: serde_json::Error },
}

impl ControlError {
    /// The kind of the frame that was refused, when it was a frame.
    pub fn kind(&self) -> Option<u8> {
        match self {
            ControlError::NotAFrame { .. } => None,
            ControlError::UnexpectedKind(k) | ControlError::Malformed { kind: k, .. } => Some(*k),
        }
    }
}

/// The name of a control kind, for messages.
pub fn name(kind: u8) -> &'static str {
    match kind {
        FORK => "FORK",
        READY => "READY",
        FORKED => "FORKED",
        EXITED => "EXITED",
        SETTLED => "SETTLED",
        _ => "unknown",
    }
}

/// Parses one control packet from the zygote.
pub fn parse(packet: &[u8]) -> Result<Control, ControlError> {
    let not_a_frame = || ControlError::NotAFrame { len: packet.len() };
    let prefix: [u8; 4] = packet
        .get(..4)
        .and_then(|p| p.try_into().ok())
        .ok_or_else(not_a_frame)?;
    let len = u32::from_le_bytes(prefix) as usize;
    if len == 0 || len.checked_add(4) != Some(packet.len()) {
        return Err(not_a_frame());
    }
    let (kind, json) = (packet[4], &packet[5..]);
    let malformed = |source| ControlError::Malformed { kind, source };
    match kind {
        READY => serde_json::from_slice(json)
            .map(Control::Ready)
            .map_err(malformed),
        FORKED => serde_json::from_slice(json)
            .map(Control::Forked)
            .map_err(malformed),
        EXITED => serde_json::from_slice(json)
            .map(Control::Exited)
            .map_err(malformed),
        SETTLED => serde_json::from_slice(json)
            .map(Control::Settled)
            .map_err(malformed),
        k => Err(ControlError::UnexpectedKind(k)),
    }
}

/// One frame: `length:u32le kind:u8 JSON`.
fn packet(kind: u8, msg: &impl Serialize) -> Vec<u8> {
    // These messages always serialize (plain fields, string keys).
    let json = serde_json::to_vec(msg).unwrap_or_default();
    crate::protocol::frame::encode_raw(kind, &json)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, json: &str) -> Vec<u8> {
        crate::protocol::frame::encode_raw(kind, json.as_bytes())
    }

    /// What python/wfjail/zygote.py sends, byte for byte (`json.dumps` spacing).
    #[test]
    fn the_zygotes_messages_parse_as_it_writes_them() {
        let ready = frame(
            READY,
            r#"{"pid": 1, "preloaded": ["wf"], "python": "3.11.2", "session_domain": 7, "control": 2}"#,
        );
        assert_eq!(
            parse(&ready).unwrap(),
            Control::Ready(Ready {
                pid: 1,
                preloaded: vec!["wf".into()],
                python: "3.11.2".into(),
                session_domain: Some(SessionDomain::Abi(7)),
                control: 2,
                error: None,
                merging: None,
            })
        );
        let forked = frame(FORKED, r#"{"session": 12, "pid": 5}"#);
        assert_eq!(
            parse(&forked).unwrap(),
            Control::Forked(Forked {
                session: 12,
                child: ForkOutcome::Pid { pid: 5 }
            })
        );
        let failed = frame(FORKED, r#"{"session": 12, "error": "[Errno 11] EAGAIN"}"#);
        assert_eq!(
            parse(&failed).unwrap(),
            Control::Forked(Forked {
                session: 12,
                child: ForkOutcome::Error {
                    error: "[Errno 11] EAGAIN".into()
                }
            })
        );
        let exited = frame(
            EXITED,
            r#"{"pid": 5, "status": 256, "cpu_ms": 12.5, "max_rss_kb": 9000}"#,
        );
        assert_eq!(
            parse(&exited).unwrap(),
            Control::Exited(Exited {
                pid: 5,
                status: 256,
                cpu_ms: 12.5,
                max_rss_kb: 9000
            })
        );
    }

    #[test]
    fn a_ready_without_a_control_version_is_version_1_and_other_fields_are_ignored() {
        let old = frame(
            READY,
            r#"{"pid": 1, "preloaded": [], "python": "3", "session_domain": 7, "spare": true}"#,
        );
        let Control::Ready(r) = parse(&old).unwrap() else {
            panic!("not READY")
        };
        assert_eq!((r.control, r.error), (1, None));
    }

    #[test]
    fn session_domain_is_an_abi_or_the_reason_it_is_not() {
        let ready = |v: &str| {
            let json =
                format!(r#"{{"pid": 1, "preloaded": [], "python": "3", "session_domain": {v}}}"#);
            match parse(&frame(READY, &json)) {
                Ok(Control::Ready(r)) => Ok(r.session_domain()),
                Ok(other) => panic!("{other:?}"),
                Err(e) => Err(e.to_string()),
            }
        };
        assert_eq!(ready("7"), Ok(Ok(7)));
        assert_eq!(ready("1"), Ok(Ok(1)));
        assert_eq!(
            ready(r#""landlock_create_ruleset: Function not implemented""#),
            Ok(Err(NoDomain::Refused(
                "landlock_create_ruleset: Function not implemented".into()
            )))
        );
        assert_eq!(ready("0"), Ok(Err(NoDomain::NoAbi(0))));
        assert_eq!(
            NoDomain::NoAbi(0).to_string(),
            "its READY says \"session_domain\": 0"
        );
        assert_eq!(ready("null"), Ok(Err(NoDomain::Unsaid)));
        for bad in ["-1", "true", "6.5", "[]"] {
            let err = ready(bad).unwrap_err();
            assert!(err.starts_with("READY is malformed: "), "{bad}: {err}");
        }
        let unsaid = frame(READY, r#"{"pid": 1, "preloaded": [], "python": "3"}"#);
        let Control::Ready(r) = parse(&unsaid).unwrap() else {
            panic!("not READY")
        };
        assert_eq!(r.session_domain(), Err(NoDomain::Unsaid));
        assert_eq!(
            NoDomain::Unsaid.to_string(),
            "its READY does not say it can"
        );
    }

    #[test]
    fn a_packet_must_be_exactly_one_frame() {
        let good = frame(
            EXITED,
            r#"{"pid": 5, "status": 0, "cpu_ms": 1, "max_rss_kb": 1}"#,
        );
        assert!(parse(&good).is_ok());
        for bad in [
            &good[..good.len() - 1],
            &[good.as_slice(), b" "].concat()[..],
            &good[..4],
            &good[..3],
            b"",
            &[0, 0, 0, 0, EXITED][..],
        ] {
            let err = parse(bad).unwrap_err();
            assert!(
                matches!(err, ControlError::NotAFrame { .. }),
                "{bad:?}: {err}"
            );
            assert_eq!(err.kind(), None);
        }
    }

    #[test]
    fn a_kind_the_zygote_does_not_send_is_refused() {
        let fork = Fork {
            session: 1,
            handler: "wf:run",
            init: None,
        }
        .to_packet();
        let err = parse(&fork).unwrap_err();
        assert_eq!(err.to_string(), "unexpected control frame kind 0x31");
        assert_eq!(err.kind(), Some(FORK));
        assert!(matches!(
            parse(&frame(0x99, "{}")),
            Err(ControlError::UnexpectedKind(0x99))
        ));
    }

    #[test]
    fn a_message_missing_a_field_or_of_the_wrong_type_is_malformed() {
        for (kind, json) in [
            (READY, r#"{"preloaded": [], "python": "3"}"#),
            (
                READY,
                r#"{"pid": 1, "preloaded": [], "python": "3", "control": "2"}"#,
            ),
            (READY, r#"not json"#),
            (FORKED, r#"{"session": 1}"#),
            (FORKED, r#"{"pid": 5}"#),
            (FORKED, r#"{"session": 1, "pid": "5"}"#),
            (FORKED, r#"{"session": 1, "pid": 4294967296}"#),
            (EXITED, r#"{"pid": 5, "cpu_ms": 1.0, "max_rss_kb": 1}"#),
            (
                EXITED,
                r#"{"pid": 5, "status": null, "cpu_ms": 1.0, "max_rss_kb": 1}"#,
            ),
            (
                EXITED,
                r#"{"pid": 5, "status": 0, "cpu_ms": 1.0, "max_rss_kb": -1}"#,
            ),
            (EXITED, r#"5"#),
        ] {
            let err = parse(&frame(kind, json)).unwrap_err();
            assert!(
                matches!(err, ControlError::Malformed { kind: k, .. } if k == kind),
                "{json}: {err:?}"
            );
            assert!(err.to_string().starts_with(name(kind)), "{err}");
        }
    }

    #[test]
    fn fork_is_the_json_the_zygote_reads() {
        let p = Fork {
            session: 3,
            handler: "wf:run",
            init: None,
        }
        .to_packet();
        assert_eq!(p[4], FORK);
        let doc: serde_json::Value = serde_json::from_slice(&p[5..]).unwrap();
        assert_eq!(doc, serde_json::json!({"session": 3, "handler": "wf:run"}));
        let init = serde_json::json!({"workflow": "wf.Greeting", "args": [1, "x"]});
        let p = Fork {
            session: 4,
            handler: "wf:factory",
            init: Some(&init),
        }
        .to_packet();
        let doc: serde_json::Value = serde_json::from_slice(&p[5..]).unwrap();
        assert_eq!(
            doc,
            serde_json::json!({"session": 4, "handler": "wf:factory", "init": init})
        );
    }

    #[test]
    fn every_message_parses_back_from_its_packet() {
        let msgs = [
            Control::Ready(Ready {
                pid: 1,
                preloaded: vec!["a".into(), "b".into()],
                python: "3.13.5".into(),
                session_domain: Some(SessionDomain::Refused("no".into())),
                control: 2,
                error: Some("preloading a: ImportError: x".into()),
                merging: Some("any".into()),
            }),
            Control::Forked(Forked {
                session: u64::MAX,
                child: ForkOutcome::Error {
                    error: "fork failed".into(),
                },
            }),
            Control::Exited(Exited {
                pid: 7,
                status: 9,
                cpu_ms: 0.1,
                max_rss_kb: 0,
            }),
        ];
        for m in msgs {
            assert_eq!(parse(&m.to_packet()).unwrap(), m);
        }
    }
}
