//! `wfjail run`'s protocol conversation in framed mode (docs/protocol.md): the request goes out
//! with HELLO, the guest's frames come back on its own pipe, every one charged to
//! `limits.output`. Run answers QUERY and UPCALL itself (a session's frames drive its phase
//! machine instead).

use std::os::fd::{AsFd, OwnedFd};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags};

use crate::protocol::guest::ProtocolError;
use crate::protocol::guest::{self as gp, Conversation, Event, Outbox, OutboxFull};
use crate::report::Violation;

use super::output::OutputMeter;
use super::streams::read_some;
use super::{ProtocolPipes, set_nonblocking};

/// One of the protocol pipes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pipe {
    /// The guest's frames (its fd 4).
    FromGuest,
    /// Our frames, while some wait (its fd 3).
    ToGuest,
}

/// The framed-mode state: our outgoing bytes and the guest's conversation.
pub struct Framed {
    to_guest: Option<OwnedFd>,
    from_guest: Option<OwnedFd>,
    outbox: Outbox,
    /// Close our writing end once the outbox is flushed (the call is answered).
    close_when_flushed: bool,
    conv: Conversation,
    /// The largest payload accepted from (and sent in an answer to) the guest.
    cap: usize,
}

impl Framed {
    /// The conversation over `p`, its pipes non-blocking, HELLO and the request written as far
    /// as the pipe takes them (they wait there for the guest).
    pub fn new(p: ProtocolPipes) -> Framed {
        set_nonblocking(&p.to_guest);
        set_nonblocking(&p.from_guest);
        let mut conv = Conversation::new(p.cap);
        conv.begin_call(); // the request goes out with HELLO
        let mut f = Framed {
            outbox: Outbox::with_opening(gp::opening(&p.request)),
            to_guest: Some(p.to_guest),
            from_guest: Some(p.from_guest),
            close_when_flushed: false,
            conv,
            cap: p.cap,
        };
        f.flush();
        f
    }

    /// Whether the guest's pipe is still open.
    pub fn open(&self) -> bool {
        self.from_guest.is_some()
    }

    /// Adds the guest's pipe, and ours while frames wait, to the caller's poll set.
    pub fn register<'b, T: From<Pipe>>(&'b self, fds: &mut Vec<PollFd<'b>>, tokens: &mut Vec<T>) {
        if let Some(fd) = &self.from_guest {
            fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
            tokens.push(Pipe::FromGuest.into());
        }
        if !self.outbox.is_empty()
            && let Some(fd) = &self.to_guest
        {
            fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLOUT));
            tokens.push(Pipe::ToGuest.into());
        }
    }

    /// Writes what the pipe takes now.
    pub fn flush(&mut self) {
        while let Some(fd) = &self.to_guest {
            if self.outbox.is_empty() {
                break;
            }
            match nix::unistd::write(fd, self.outbox.pending()) {
                Ok(n) => self.outbox.advance(n),
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => return,
                Err(_) => {
                    self.to_guest = None; // the guest closed its end
                    self.outbox.clear();
                }
            }
        }
        if self.outbox.is_empty() && self.close_when_flushed {
            self.to_guest = None; // end-of-file tells the guest there is no further call
        }
    }

    /// Reads once (at most `buf`'s length) and decodes; every frame is charged to `meter`,
    /// empty ones included.
    pub fn read(
        &mut self,
        buf: &mut [u8],
        meter: &mut OutputMeter,
    ) -> Result<Vec<Event>, ProtocolError> {
        let Some(fd) = self.from_guest.as_ref() else {
            return Ok(Vec::new());
        };
        let (data, open) = read_some(fd, buf);
        let mut r = self.conv.feed(data);
        if !open {
            self.from_guest = None;
            r = r.and_then(|ev| self.conv.eof().map(|_| ev));
        }
        meter.charge(self.conv.take_charge());
        r
    }

    /// Answers QUERY with the violations since the last one.
    pub fn answer_query(&mut self, list: &[Violation]) -> Result<(), OutboxFull> {
        self.outbox.push(&gp::violations_frame(list, self.cap))
    }

    /// Answers UPCALL: `run` has no worker to ask.
    pub fn refuse_upcall(&mut self) -> Result<(), OutboxFull> {
        self.outbox.push(&gp::reply_frame(Err(
            "no worker to ask: UPCALL needs a wfjail serve session",
        )))
    }

    /// The call is answered (RESULT or ERROR): our end closes once the outbox is flushed.
    pub fn answered(&mut self) {
        self.close_when_flushed = true;
    }

    /// The conversation broke: both pipes close, nothing more is sent.
    pub fn broken(&mut self) {
        self.from_guest = None;
        self.to_guest = None;
        self.outbox.clear();
    }
}
