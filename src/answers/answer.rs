//! How a notification is answered, and the sending of that answer: the vocabulary of the
//! handler (`notify/mod.rs`, which re-exports it) and of the answers beside this file, which
//! give an [`Answer`] without knowing the handler.

use std::os::fd::BorrowedFd;

use crate::sys::{self, Notif, NotifAnswer};

/// A descriptor the supervisor opened for the guest (`notify/opener.rs`).
#[derive(Debug, Clone)]
pub struct HeldFd(pub std::sync::Arc<std::os::fd::OwnedFd>);

impl PartialEq for HeldFd {
    fn eq(&self, other: &Self) -> bool {
        use std::os::fd::AsRawFd;
        self.0.as_raw_fd() == other.0.as_raw_fd()
    }
}

impl Eq for HeldFd {}

/// How to answer one notification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Let the call run (Landlock and the kernel still apply).
    Continue,
    /// Fail the call with this errno.
    Errno(i32),
    /// Kill the guest, then fail the call with this errno (it never returns to the guest).
    Kill(i32),
    /// Return `ret` without running the call, after writing each `(addr, bytes)` in the
    /// guest.
    Value {
        ret: i64,
        writes: Vec<(u64, Vec<u8>)>,
    },
    /// Install this descriptor in the guest and return its number (an open the supervisor
    /// made, `opener.rs`); close-on-exec when `cloexec`.
    Fd { fd: HeldFd, cloexec: bool },
}

/// Sends `answer` for `n`. A value's bytes are written first, and only into a call that is
/// still pending before the write (so its pid is its task's); a write the guest's memory
/// refuses fails the call with EFAULT, as the kernel's own copy would.
pub fn respond(listener: BorrowedFd<'_>, n: &Notif, answer: Answer) {
    let reply = match answer {
        Answer::Fd { fd, cloexec } => {
            use std::os::fd::AsFd;
            match sys::notif_addfd_send(listener, n.id, fd.0.as_fd(), cloexec) {
                Ok(_) => return,
                // The call is gone: nothing to answer.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return,
                // Still pending (a kernel before 5.14 without the atomic send, ...): the
                // guest's own call runs, as before the supervisor opened for it.
                Err(_) => NotifAnswer::Continue,
            }
        }
        Answer::Continue => NotifAnswer::Continue,
        Answer::Errno(e) | Answer::Kill(e) => NotifAnswer::Error(e),
        Answer::Value { ret, writes } if writes.is_empty() => NotifAnswer::Value(ret),
        Answer::Value { ret, writes } => {
            // Pending now: its task is alive and blocked, so its pid is its own.
            if !sys::notif_id_valid(listener, n.id) {
                return;
            }
            let wrote_all = writes.iter().all(|(addr, bytes)| {
                sys::write_process_memory(n.pid as i32, *addr, bytes)
                    .is_ok_and(|w| w == bytes.len())
            });
            // No second look after the write: a call that stopped pending meanwhile (killed,
            // or interrupted) refuses the SEND below (ENOENT: ids are never reused), which is
            // all a second ID_VALID could tell; it cost one ioctl per answered clock read.
            if wrote_all {
                NotifAnswer::Value(ret)
            } else {
                NotifAnswer::Error(libc::EFAULT)
            }
        }
    };
    let _ = sys::notif_send(listener, n.id, reply);
}

/// Lets the call of notification `n` run (the initial exec, the zygote's own forks).
pub fn allow(listener: BorrowedFd<'_>, n: &Notif) {
    respond(listener, n, Answer::Continue);
}

/// Denies the call of notification `n` with `errno`, without recording it.
pub fn refuse(listener: BorrowedFd<'_>, n: &Notif, errno: i32) {
    respond(listener, n, Answer::Errno(errno));
}
