//! The worker wire of `wfjail serve` (`protocol::worker`): frames from a worker, then what the
//! server does with an OPEN payload (the session request and its timeout).
//!
//! Checked: no panic; only this wire's kinds come out of its decoder; an accepted OPEN
//! round-trips through JSON; an accepted timeout is within 1 ms..7 days and prints back to a
//! duration that parses.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wfjail::policy::Dur;
use wfjail::protocol::worker::{self, OpenRequest};

fuzz_target!(|data: &[u8]| {
    let [chunk, stream @ ..] = data else {
        return;
    };
    let chunk = (*chunk as usize).max(1);
    let mut d = worker::decoder(1 << 16);
    'stream: for piece in stream.chunks(chunk) {
        d.feed(piece);
        loop {
            match d.next_raw() {
                Ok(Some((kind, payload))) => {
                    assert!(worker::known(kind), "kind {kind:#x} is not of this wire");
                    assert_ne!(worker::name(kind), "unknown");
                    if kind == worker::OPEN {
                        open(&payload);
                    }
                }
                Ok(None) => break,
                Err(_) => break 'stream,
            }
        }
    }
    let _ = d.finish();
    // The payload alone, as if it had come in a well-formed OPEN frame.
    open(stream);
});

fn open(payload: &[u8]) {
    let Ok(req) = serde_json::from_slice::<OpenRequest>(payload) else {
        return;
    };
    let text = serde_json::to_string(&req).unwrap();
    assert_eq!(serde_json::from_str::<OpenRequest>(&text).unwrap(), req);
    if let Some(t) = &req.timeout
        && let Ok(d) = Dur::parse(t)
    {
        assert!(d.0.as_secs_f64() <= 7.0 * 86400.0 + 1e-6, "{t:?}");
        let shown = d.to_string();
        Dur::parse(&shown).unwrap_or_else(|e| panic!("{t:?} prints as {shown:?}: {e}"));
    }
}
