//! The worker's connection of one `wfjail serve` session: frames of the worker wire
//! (`protocol::worker`, docs/protocol.md) read from and written to the session's Unix socket,
//! which is non-blocking. What the worker sends is decoded under the frame cap and read at most
//! [`READ_TURN`] bytes per turn of the session's loop; what the session sends waits in a
//! buffer until the socket takes it (session/ stops reading the guest while that buffer is
//! large).

use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::protocol::worker::{self, OpenRequest};
use crate::protocol::{Decoder, FrameError, MAX_FRAME};
use crate::supervise::poll_timeout;

/// How long a worker has to send OPEN after connecting.
pub const OPEN_WAIT: Duration = Duration::from_secs(10);
/// The most read from the worker per turn of the loop (the run supervisor's bound), so that a
/// flooding worker cannot keep the session from checking its deadline.
pub const READ_TURN: usize = crate::supervise::READ_CHUNK;
/// How long the session's last frame (CLOSED, FAILED) may take to be written.
const LAST_FRAME_WAIT: Duration = Duration::from_secs(5);

/// A frame of the worker wire: kind and payload.
pub type Frame = (u8, Vec<u8>);

/// The worker broke the wire.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("the worker sent a bad frame: {0}")]
    BadFrame(#[source] FrameError),
    #[error("the worker's connection ended inside a frame: {0}")]
    Truncated(#[source] FrameError),
}

/// Why a connection did not open a session.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The socket could not be made non-blocking.
    #[error("{0}")]
    Socket(#[source] std::io::Error),
    #[error(transparent)]
    Wire(#[from] WireError),
    #[error("expected OPEN as the first frame, got {}", worker::name(*.0))]
    NotOpen(u8),
    #[error("OPEN is not a valid session request: {0}")]
    BadRequest(#[source] serde_json::Error),
    #[error("the worker closed the connection before OPEN")]
    Closed,
    #[error("no OPEN within {}s", .0.as_secs())]
    NoOpen(Duration),
}

/// The worker's side of a session.
pub struct WorkerConn {
    conn: UnixStream,
    dec: Decoder,
    /// Encoded frames the socket has not taken yet.
    out: Vec<u8>,
    gone: bool,
    /// The FAILED report the worker gets if this connection is dropped before its last frame
    /// was sent ([`WorkerConn::owe`]): a session thread that panicked, or any way out that
    /// forgot to answer, ends with why, not with a connection the worker sees reset.
    owed: Option<Vec<u8>>,
}

impl WorkerConn {
    pub fn new(conn: UnixStream) -> Self {
        WorkerConn {
            conn,
            dec: worker::decoder(MAX_FRAME),
            out: Vec::new(),
            gone: false,
            owed: None,
        }
    }

    /// Owes the worker a last frame: dropped without one (`send_last`), the connection
    /// sends FAILED with `report` (a session report as JSON) first.
    pub fn owe(&mut self, report: Vec<u8>) {
        self.owed = Some(report);
    }

    /// Whether the worker is gone: end-of-file or an error on its connection.
    pub fn gone(&self) -> bool {
        self.gone
    }

    /// Bytes waiting to be written to the worker.
    pub fn unsent(&self) -> usize {
        self.out.len()
    }

    /// Queues a frame and writes what the socket takes now.
    pub fn send(&mut self, kind: u8, payload: &[u8]) {
        self.out.extend(worker::encode(kind, payload));
        self.flush();
    }

    /// Writes what the socket takes now.
    pub fn flush(&mut self) {
        while !self.out.is_empty() && !self.gone {
            match self.conn.write(&self.out) {
                Ok(n) => {
                    self.out.drain(..n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => self.gone = true,
            }
        }
    }

    /// Sends the last frame, waiting (bounded) until it is written.
    pub fn send_last(&mut self, kind: u8, payload: &[u8]) {
        self.owed = None;
        self.send(kind, payload);
        let deadline = Instant::now() + LAST_FRAME_WAIT;
        while !self.out.is_empty() && !self.gone && Instant::now() < deadline {
            let mut fds = [PollFd::new(self.conn.as_fd(), PollFlags::POLLOUT)];
            let _ = poll(&mut fds, PollTimeout::from(100u16));
            self.flush();
        }
    }

    /// Reads what is available (at most [`READ_TURN`] bytes); the frames decoded, or how the
    /// worker broke the wire.
    pub fn read(&mut self) -> Result<Vec<Frame>, WireError> {
        let mut buf = [0u8; 16 * 1024];
        let mut taken = 0;
        while taken < READ_TURN {
            match self.conn.read(&mut buf) {
                Ok(0) => {
                    self.gone = true;
                    break;
                }
                Ok(n) => {
                    taken += n;
                    self.dec.feed(&buf[..n])
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.gone = true;
                    break;
                }
            }
        }
        let mut frames = Vec::new();
        while let Some(f) = self.dec.next_raw().map_err(WireError::BadFrame)? {
            frames.push(f);
        }
        if self.gone {
            self.dec.finish().map_err(WireError::Truncated)?;
        }
        Ok(frames)
    }

    /// Makes the socket non-blocking and reads the OPEN frame, waiting at most `wait`.
    /// Returns the request and any frames the worker sent right behind it (calls it pipelined).
    pub fn read_open(&mut self, wait: Duration) -> Result<(OpenRequest, Vec<Frame>), OpenError> {
        self.conn.set_nonblocking(true).map_err(OpenError::Socket)?;
        let deadline = Instant::now() + wait;
        loop {
            let mut frames = self.read()?.into_iter();
            if let Some((kind, payload)) = frames.next() {
                if kind != worker::OPEN {
                    return Err(OpenError::NotOpen(kind));
                }
                let open = serde_json::from_slice(&payload).map_err(OpenError::BadRequest)?;
                return Ok((open, frames.collect()));
            }
            if self.gone {
                return Err(OpenError::Closed);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(OpenError::NoOpen(wait));
            }
            let mut fds = [PollFd::new(self.conn.as_fd(), PollFlags::POLLIN)];
            let _ = poll(&mut fds, poll_timeout(left));
        }
    }
}

impl Drop for WorkerConn {
    fn drop(&mut self) {
        if let Some(report) = self.owed.take()
            && !self.gone
        {
            self.send_last(worker::FAILED, &report);
        }
    }
}

impl AsFd for WorkerConn {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.conn.as_fd()
    }
}

#[cfg(test)]
#[path = "worker_conn_owed_tests.rs"]
mod owed_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::frame::encode_raw;

    /// A connection whose worker end is `peer`.
    fn pair() -> (WorkerConn, UnixStream) {
        let (ours, peer) = UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        (WorkerConn::new(ours), peer)
    }

    /// Every frame `peer` can read until `conn` is dropped.
    fn frames_of(mut peer: UnixStream) -> Vec<Frame> {
        let mut bytes = Vec::new();
        peer.read_to_end(&mut bytes).unwrap();
        let mut d = worker::decoder(MAX_FRAME);
        d.feed(&bytes);
        let mut out = Vec::new();
        while let Some(f) = d.next_raw().unwrap() {
            out.push(f);
        }
        d.finish().unwrap();
        out
    }

    #[test]
    fn a_frame_cut_anywhere_is_read_whole_once_its_last_byte_came() {
        let (mut conn, mut peer) = pair();
        let bytes = worker::encode(worker::CALL, b"activation-1");
        peer.write_all(&bytes[..7]).unwrap();
        assert_eq!(conn.read().unwrap(), vec![]);
        peer.write_all(&bytes[7..]).unwrap();
        peer.write_all(&worker::encode(worker::CLOSE, b"")).unwrap();
        assert_eq!(
            conn.read().unwrap(),
            vec![
                (worker::CALL, b"activation-1".to_vec()),
                (worker::CLOSE, vec![])
            ]
        );
        assert!(!conn.gone());
    }

    #[test]
    fn a_kind_of_another_wire_is_a_bad_frame() {
        let (mut conn, mut peer) = pair();
        peer.write_all(&encode_raw(0x02, b"x")).unwrap(); // the guest's RESULT
        assert_eq!(
            conn.read(),
            Err(WireError::BadFrame(FrameError::UnknownKind(0x02)))
        );
    }

    #[test]
    fn end_of_file_between_frames_is_the_worker_gone_and_inside_one_an_error() {
        let (mut conn, peer) = pair();
        drop(peer);
        assert_eq!(conn.read(), Ok(vec![]));
        assert!(conn.gone());

        let (mut conn, mut peer) = pair();
        peer.write_all(&worker::encode(worker::CALL, b"abc")[..6])
            .unwrap();
        drop(peer);
        let err = conn.read().unwrap_err();
        assert!(matches!(err, WireError::Truncated(_)), "{err:?}");
        assert_eq!(
            err.to_string(),
            "the worker's connection ended inside a frame: truncated frame: the stream ended \
             after 6 of 8 bytes"
        );
    }

    #[test]
    fn open_comes_with_the_frames_pipelined_behind_it() {
        let (mut conn, mut peer) = pair();
        let mut bytes = worker::encode(worker::OPEN, br#"{"argv": ["/bin/guest"]}"#);
        bytes.extend(worker::encode(worker::CALL, b"one"));
        bytes.extend(worker::encode(worker::CLOSE, b""));
        peer.write_all(&bytes).unwrap();
        let (open, early) = conn.read_open(OPEN_WAIT).unwrap();
        assert_eq!(open.argv, Some(vec!["/bin/guest".to_string()]));
        assert_eq!(
            early,
            vec![(worker::CALL, b"one".to_vec()), (worker::CLOSE, vec![])]
        );
    }

    #[test]
    fn open_must_be_the_first_frame_and_a_session_request() {
        let (mut conn, mut peer) = pair();
        peer.write_all(&worker::encode(worker::CALL, b"x")).unwrap();
        let err = conn.read_open(OPEN_WAIT).unwrap_err();
        assert_eq!(
            err.to_string(),
            "expected OPEN as the first frame, got CALL"
        );

        let (mut conn, mut peer) = pair();
        peer.write_all(&worker::encode(worker::OPEN, br#"{"command": "x"}"#))
            .unwrap();
        let err = conn.read_open(OPEN_WAIT).unwrap_err();
        assert!(matches!(err, OpenError::BadRequest(_)), "{err:?}");
        assert!(
            err.to_string()
                .starts_with("OPEN is not a valid session request: unknown field `command`"),
            "{err}"
        );
    }

    #[test]
    fn a_worker_that_leaves_or_says_nothing_opens_no_session() {
        let (mut conn, peer) = pair();
        drop(peer);
        let err = conn.read_open(OPEN_WAIT).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the worker closed the connection before OPEN"
        );

        let (mut conn, _peer) = pair();
        let err = conn.read_open(Duration::ZERO).unwrap_err();
        assert!(matches!(err, OpenError::NoOpen(_)), "{err:?}");
        assert_eq!(err.to_string(), "no OPEN within 0s");
    }

    #[test]
    fn what_the_socket_does_not_take_waits_and_goes_out_in_order() {
        let (mut conn, peer) = pair();
        // Larger than a Unix socket's buffer: the rest waits in the connection.
        let big = vec![7u8; 4 << 20];
        conn.send(worker::RESULT, &big);
        assert!(conn.unsent() > 0, "the socket took 4 MiB at once");
        let reader = std::thread::spawn(move || frames_of(peer));
        conn.send_last(worker::CLOSED, b"{}");
        assert_eq!(conn.unsent(), 0);
        drop(conn);
        assert_eq!(
            reader.join().unwrap(),
            vec![(worker::RESULT, big), (worker::CLOSED, b"{}".to_vec())]
        );
    }

    #[test]
    fn a_worker_gone_is_seen_when_writing_and_nothing_more_is_written() {
        let (mut conn, peer) = pair();
        drop(peer);
        conn.send(worker::RESULT, b"lost");
        assert!(conn.gone());
        conn.send_last(worker::FAILED, b"{}"); // returns at once
        assert!(conn.gone());
    }
}
