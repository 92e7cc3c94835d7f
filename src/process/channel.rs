//! The set-up channel between the parent and the child before `execve`: a close-on-exec
//! `SOCK_SEQPACKET` pair. The child reports each step that failed or degraded, and hands over
//! the seccomp listener with `SCM_RIGHTS`; end-of-file means the child exec'd (or died).
//!
//! The records and the child's sending are the child's (`confine/records.rs`, re-exported
//! here); this is the parent's reading.

use std::os::fd::{AsFd, OwnedFd};

use crate::confine::records::RECORD_LEN;
pub use crate::confine::records::{ChannelError, ChildMsg, Step, send};
use crate::sys;

/// Parent side: one received record.
pub enum Received {
    Msg(ChildMsg, Option<OwnedFd>),
    Eof,
}

/// Parent side: receives one record (blocking unless the fd is non-blocking).
pub fn recv(chan: &impl AsFd) -> std::io::Result<Result<Received, ChannelError>> {
    let mut buf = [0u8; RECORD_LEN + 1];
    let (n, fd) = sys::recv_with_fd(chan.as_fd(), &mut buf)?;
    if n == 0 && fd.is_none() {
        return Ok(Ok(Received::Eof));
    }
    Ok(ChildMsg::decode(&buf[..n]).map(|m| Received::Msg(m, fd)))
}
