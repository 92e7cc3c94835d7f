//! A connection owed a last frame (`WorkerConn::owe`) answers the worker however its session
//! thread ends: a thread that panics before answering sends the FAILED it owed, not a
//! connection the worker finds reset (the worker's `recv` fails with ECONNRESET when the
//! server's end closes with its OPEN unread).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

use super::*;

const OWED: &[u8] = br#"{"status": "launch_error", "error": "ended without answering"}"#;

/// A connection whose worker end is `peer`, the worker's OPEN already sent and unread.
fn opened() -> (WorkerConn, UnixStream) {
    let (ours, mut peer) = UnixStream::pair().unwrap();
    ours.set_nonblocking(true).unwrap();
    peer.write_all(&worker::encode(worker::OPEN, br#"{"handler": "m:f"}"#))
        .unwrap();
    (WorkerConn::new(ours), peer)
}

/// What the worker reads until the server's end is closed, decoded, and how the read ended.
fn answers(mut peer: UnixStream) -> (Vec<Frame>, std::io::Result<usize>) {
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    let end = loop {
        match peer.read(&mut buf) {
            Ok(0) => break Ok(0),
            Ok(n) => bytes.extend_from_slice(&buf[..n]),
            Err(e) => break Err(e),
        }
    };
    let mut d = worker::decoder(MAX_FRAME);
    d.feed(&bytes);
    let mut frames = Vec::new();
    while let Some(f) = d.next_raw().unwrap() {
        frames.push(f);
    }
    d.finish().unwrap();
    (frames, end)
}

#[test]
fn without_a_debt_a_dropped_connection_with_the_open_unread_is_a_reset() {
    // What the worker saw: no frame, ECONNRESET.
    let (conn, peer) = opened();
    drop(conn);
    let (frames, end) = answers(peer);
    assert_eq!(frames, vec![]);
    assert_eq!(end.unwrap_err().kind(), std::io::ErrorKind::ConnectionReset);
}

#[test]
fn a_session_thread_that_panics_sends_the_failure_it_owed() {
    let (mut conn, peer) = opened();
    conn.owe(OWED.to_vec());
    let thread = std::thread::spawn(move || {
        let _conn = conn;
        panic!("a bug in a session thread (this test's own panic)");
    });
    assert!(thread.join().is_err());
    let (frames, _) = answers(peer);
    assert_eq!(frames, vec![(worker::FAILED, OWED.to_vec())]);
}

#[test]
fn a_last_frame_sent_pays_the_debt() {
    let (mut conn, peer) = opened();
    conn.owe(OWED.to_vec());
    conn.send_last(worker::CLOSED, b"{}");
    drop(conn);
    let (frames, _) = answers(peer);
    assert_eq!(frames, vec![(worker::CLOSED, b"{}".to_vec())]);
}

#[test]
fn a_worker_gone_is_owed_nothing() {
    let (mut conn, peer) = opened();
    conn.owe(OWED.to_vec());
    drop(peer);
    assert_eq!(conn.read().unwrap().len(), 1); // the OPEN, then end-of-file
    assert!(conn.gone());
    drop(conn); // writes nothing, waits for nothing
}
