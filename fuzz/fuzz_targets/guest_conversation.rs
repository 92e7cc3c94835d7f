//! The supervisor's side of the guest conversation (`protocol::guest::Conversation`): arbitrary
//! guest bytes after `begin_call`, in pieces, then end-of-file.
//!
//! Input: byte 0: the cap and whether the supervisor starts another call after each answer
//! (as `serve` does); byte 1: the chunk size; the rest: what the guest wrote.
//! Checked: no panic; never more answers (RESULT/ERROR) than calls begun plus the one ERROR a
//! guest may send instead of HELLO; a RESULT leaves the conversation idle; no payload over the
//! cap.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wfjail::protocol::guest::{Conversation, Event};

fuzz_target!(|data: &[u8]| {
    let [sel, chunk, stream @ ..] = data else {
        return;
    };
    let cap = (sel >> 1) as usize * 8;
    let again = sel & 1 == 1;
    let chunk = (*chunk as usize).max(1);
    let mut c = Conversation::new(cap);
    c.begin_call();
    let mut calls = 1usize;
    let mut answers = 0usize;
    for piece in stream.chunks(chunk) {
        let events = match c.feed(piece) {
            Ok(events) => events,
            Err(e) => {
                assert!(!e.0.is_empty());
                return;
            }
        };
        for event in events {
            match event {
                Event::Result(p) => {
                    assert!(p.len() <= cap);
                    answers += 1;
                    assert!(c.idle() || again, "idle after RESULT");
                }
                Event::Error(_) => answers += 1,
                Event::Log { text, .. } => assert!(text.len() <= 3 * cap + 3),
                // (Only during a call: the conversation refuses it outside one.)
                Event::Upcall(p) => assert!(p.len() <= cap),
                Event::Hello | Event::Query => {}
            }
            assert!(answers <= calls + 1, "{answers} answers to {calls} calls");
        }
        if again && c.idle() {
            c.begin_call();
            calls += 1;
        }
    }
    let _ = c.eof();
});
