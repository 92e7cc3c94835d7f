//! The session's I/O with its guest and worker: the guest's frames (its socket), its stdout and
//! stderr (echoed behind the session's prefix), both charged to `limits.output`, and the
//! worker's frames.

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Instant;

use nix::errno::Errno;
use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};

use crate::protocol::MAX_FRAME;
use crate::sys;

use super::super::launch::Child;
use super::super::phases::Failure;
use super::super::worker_conn::READ_TURN;
use super::*;

impl Session {
    /// Reads the guest's stdout and stderr (at most [`READ_TURN`] bytes; `drain`: until the
    /// end), echoes it line by line behind the session's prefix, and charges it to
    /// `limits.output`.
    pub(super) fn on_output(&mut self, drain: bool) {
        let Some(fd) = self.output.take() else {
            return;
        };
        let mut buf = [0u8; 16 * 1024];
        let mut taken = 0usize;
        let mut closed = false;
        while drain || taken < READ_TURN {
            match nix::unistd::read(&fd, &mut buf) {
                Ok(0) => {
                    closed = true;
                    break;
                }
                Ok(n) => {
                    taken += n;
                    self.output_since_sample = true;
                    if !self.output_exceeded {
                        echo_stderr(&self.echo.feed(&buf[..n]));
                    }
                    if self.charge_output(n as u64) {
                        break;
                    }
                }
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => break,
                Err(_) => {
                    closed = true;
                    break;
                }
            }
        }
        if closed {
            echo_stderr(&self.echo.finish());
        } else {
            self.output = Some(fd);
        }
    }

    /// Charges `n` bytes against `limits.output`; over it, the session fails (the guest is
    /// killed). Returns whether the limit is exceeded.
    pub(super) fn charge_output(&mut self, n: u64) -> bool {
        let limit = self.output_meter.limit();
        if self.output_meter.charge(n) && !self.output_exceeded {
            self.output_exceeded = true;
            echo_stderr(&self.echo.finish());
            let acts = self.phases.fail(Failure::Output(limit));
            self.act(acts);
        }
        self.output_exceeded
    }

    pub(super) fn flush_guest(&mut self) {
        while !self.guest_out.is_empty() {
            match nix::unistd::write(&self.guest, self.guest_out.pending()) {
                Ok(n) => self.guest_out.advance(n),
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => return,
                Err(_) => {
                    self.guest_out.clear();
                    return;
                }
            }
        }
    }

    /// Reads the worker's frames and gives them to the phase machine.
    pub(super) fn on_client(&mut self) {
        let acts = match self.client.read() {
            Ok(frames) => self
                .phases
                .worker(frames, self.client.gone(), Instant::now()),
            Err(e) => self.phases.fail(Failure::Wire(e)),
        };
        self.act(acts);
    }

    /// Reads the guest's frames: at most [`READ_TURN`] bytes, or (`drain`, after it ended)
    /// what is left; the conversation's events go to the phase machine.
    pub(super) fn on_guest(&mut self, drain: bool) {
        let mut buf = [0u8; 16 * 1024];
        let mut got = Vec::new();
        let mut eof = false;
        while drain || got.len() < READ_TURN {
            let want_creds = matches!(self.child, Child::Zygote { pid: None, .. });
            let r = if want_creds {
                recv_with_creds(&self.guest, &mut buf).map(|(n, pid)| {
                    if let (Some(p), Child::Zygote { pid, pidfd, .. }) = (pid, &mut self.child) {
                        *pid = Some(p);
                        *pidfd = sys::pidfd_open(p).ok();
                    }
                    n
                })
            } else {
                nix::unistd::read(&self.guest, &mut buf)
            };
            match r {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(Errno::EINTR) => {}
                Err(_) => break,
            }
            if drain && got.len() > MAX_FRAME + READ_TURN {
                break; // bounded even so
            }
        }
        let mut result = self.conv.feed(&got);
        if eof {
            self.guest_open = false;
            result = result.and_then(|ev| self.conv.eof().map(|_| ev));
        }
        // Every frame costs its bytes against limits.output (protocol::guest::output_charge),
        // so that empty LOG frames are not free.
        let charge = self.conv.take_charge();
        if self.charge_output(charge) {
            return;
        }
        let events = match result {
            Ok(ev) => ev,
            Err(e) => {
                let acts = self.phases.guest_broke(e);
                self.act(acts);
                return;
            }
        };
        for ev in events {
            let acts = self.phases.guest(ev, Instant::now());
            if !self.act(acts) {
                return;
            }
        }
    }
}

/// Reads from a socket with SO_PASSCRED set: the bytes and the sender's pid (translated into
/// our PID namespace by the kernel).
pub(super) fn recv_with_creds(
    fd: &OwnedFd,
    buf: &mut [u8],
) -> Result<(usize, Option<libc::pid_t>), Errno> {
    let mut iov = [std::io::IoSliceMut::new(buf)];
    let mut space = nix::cmsg_space!(libc::ucred);
    let msg = recvmsg::<()>(
        fd.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_DONTWAIT,
    )?;
    let mut pid = None;
    for c in msg.cmsgs().map_err(|_| Errno::EINVAL)? {
        if let ControlMessageOwned::ScmCredentials(cred) = c {
            pid = Some(cred.pid());
        }
    }
    Ok((msg.bytes, pid))
}

/// Writes echoed guest lines to wfjail's stderr.
pub(super) fn echo_stderr(lines: &[u8]) {
    if !lines.is_empty() {
        let _ = std::io::stderr().write_all(lines);
    }
}
