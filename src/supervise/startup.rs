//! The start-up of one confined child, from `clone` to its exec: the parent's side of the
//! set-up channel and of the initial `execve` notification, as one I/O-free state machine.
//!
//! `wfjail run`, an exec-mode serve session and a zygote's start all drive this machine through
//! one [`Driver`], which owns the parent's ends of the channel and of the listener: their
//! loops poll its descriptors and hand it what is ready; it reads, feeds the machine and does
//! what the machine answers. What the machine decides (read top to bottom, this is the
//! specification; the unit tests below follow it rule by rule):
//!
//! 1. A `Degraded` record is kept; the child goes on.
//! 2. A `Fatal` record is kept; the child exits by itself after sending it.
//! 3. A `Listener` record says the seccomp listener came with it.
//! 4. A record that does not decode (length, magic, tag, step) ends the start-up: the caller
//!    kills the child and reports the channel error. A child that breaks the set-up protocol
//!    is not trusted to be confined.
//! 5. Before the child's initial exec, a notification that is that exec (the child's pid,
//!    `execve`, native ABI) is let through (the driver patches the vDSO at its stop first,
//!    when the plan asks). Any other notification before it is refused (EPERM): the child's
//!    own code makes no watched call after installing the filter but that exec. After it,
//!    every notification is the guest's, for the caller's supervision.
//! 6. End-of-file on the close-on-exec channel: the exec happened (or the child died, which
//!    its pidfd tells). With a `Fatal` record kept, the start-up failed at that step.
//!
//! Room for more: a step that needs the parent first (a parent→child "go" over the channel)
//! would be one more state between `Confining` and `Execing`, fed by a new record.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use nix::errno::Errno;
use nix::poll::PollFlags;

use crate::process::channel::{self, ChannelError, ChildMsg, Received, Step};
use crate::sys::{self, NotifBuf};

use super::notify;
use super::vdso::{self, VdsoError};

/// How a start-up ended badly.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StartupError {
    /// A required confinement step failed in the child (it exited).
    #[error("{} failed: {}", .step.describe(), .errno.desc())]
    Fatal { step: Step, errno: Errno },
    /// The child broke the set-up protocol (it must be killed).
    #[error("set-up channel: {0}")]
    Channel(ChannelError),
    /// The driver's own failures (not decisions of the machine): no exec in time,
    #[error("the child did not exec within {0:?}")]
    NoExec(std::time::Duration),
    /// or reading the channel or polling failed.
    #[error("set-up channel: {0}")]
    Io(Errno),
}

/// What the caller does after feeding a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Go on reading.
    Continue,
    /// Kill the child: it broke the set-up protocol ([`Startup::error`] says how).
    Kill,
}

/// How to answer a seccomp notification received during (or after) the start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The initial exec: let it continue.
    AllowExec,
    /// Before the initial exec and not it: refuse with EPERM.
    Refuse,
    /// The guest's own call: the caller's supervision answers it.
    Guest,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Set-up records arrive; the exec has not been seen.
    Confining,
    /// The initial exec was let through (or there is no listener to see it).
    Execing,
    /// End-of-file: the exec happened or the child died.
    Done,
}

/// The start-up of one child. See the module documentation for the rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Startup {
    state: State,
    degraded: Vec<(Step, Errno)>,
    fatal: Option<(Step, Errno)>,
    channel_error: Option<ChannelError>,
    listener: bool,
    exec_seen: bool,
}

impl Default for Startup {
    fn default() -> Self {
        Self::new()
    }
}

impl Startup {
    pub fn new() -> Self {
        Startup {
            state: State::Confining,
            degraded: Vec::new(),
            fatal: None,
            channel_error: None,
            listener: false,
            exec_seen: false,
        }
    }

    /// Rules 1–4: one record from the channel, or the error decoding it.
    pub fn record(&mut self, rec: Result<ChildMsg, ChannelError>) -> Next {
        if self.state == State::Done || self.channel_error.is_some() {
            return Next::Continue;
        }
        match rec {
            Ok(ChildMsg::Degraded { step, errno }) => self.degraded.push((step, errno)),
            Ok(ChildMsg::Fatal { step, errno }) => self.fatal = Some((step, errno)),
            Ok(ChildMsg::Listener) => self.listener = true,
            Err(e) => {
                self.channel_error = Some(e);
                return Next::Kill;
            }
        }
        Next::Continue
    }

    /// A step the parent takes for the child failed (the exec stop, `vdso.rs`): the start-up
    /// fails at it, as if the child had sent a `Fatal` record; the caller kills the child.
    pub fn parent_failed(&mut self, step: Step, errno: Errno) {
        self.fatal = Some((step, errno));
    }

    /// Rule 6: the channel reached end-of-file.
    pub fn eof(&mut self) {
        self.state = State::Done;
    }

    /// Rule 5: a notification; `initial_exec` says whether it is the child's `execve`
    /// (see [`is_initial_exec`]).
    pub fn notification(&mut self, initial_exec: bool) -> Route {
        match self.state {
            State::Confining if initial_exec && !self.exec_seen => {
                self.exec_seen = true;
                self.state = State::Execing;
                Route::AllowExec
            }
            State::Confining => Route::Refuse,
            State::Execing | State::Done => Route::Guest,
        }
    }

    /// Whether the channel is still to be read.
    pub fn reading(&self) -> bool {
        self.state != State::Done && self.channel_error.is_none()
    }

    /// Whether the start-up is over (end-of-file, or a broken channel).
    pub fn finished(&self) -> bool {
        !self.reading()
    }

    /// Whether the initial exec has been let through (a zygote's caller stops reading the
    /// listener there and hands it to its router).
    pub fn exec_allowed(&self) -> bool {
        self.exec_seen
    }

    /// Whether the seccomp listener arrived.
    pub fn has_listener(&self) -> bool {
        self.listener
    }

    /// Best-effort steps that failed, in the child's order.
    pub fn degraded(&self) -> &[(Step, Errno)] {
        &self.degraded
    }

    /// The required step that failed, if any.
    pub fn fatal(&self) -> Option<(Step, Errno)> {
        self.fatal
    }

    /// How the start-up failed, if it did: a broken channel first (the child was killed),
    /// then a fatal step.
    pub fn error(&self) -> Option<StartupError> {
        if let Some(e) = self.channel_error {
            return Some(StartupError::Channel(e));
        }
        self.fatal
            .map(|(step, errno)| StartupError::Fatal { step, errno })
    }

    /// What the report says of a broken set-up channel (`Facts::channel_error`), for `run`
    /// and sessions alike.
    pub fn channel_error(&self) -> Option<String> {
        self.channel_error
            .map(|e| StartupError::Channel(e).to_string())
    }

    /// End-of-file without a failure: the exec happened (unless the pidfd says the child died).
    pub fn exec_confirmed(&self) -> bool {
        self.state == State::Done && self.error().is_none()
    }
}

/// The one driver of the start-up machine: the parent's ends of the set-up channel and of the
/// child's seccomp listener, read into a [`Startup`]. `wfjail run` and an exec-mode session
/// keep it for the guest's life (the listener then carries the guest's notifications, which
/// [`Driver::on_listener`] hands back); a zygote's start drives it up to the exec.
pub struct Driver {
    machine: Startup,
    pid: libc::pid_t,
    chan: Option<OwnedFd>,
    listener: Option<OwnedFd>,
    buf: Option<NotifBuf>,
    /// What to patch in the child's vDSO at its exec stop (`vdso.rs`).
    vdso: Option<vdso::Patch>,
    /// Set the listener non-blocking (a supervisor that reads it in its own loop: a
    /// notification that vanished between poll and read must not block it).
    nonblocking: bool,
    /// A listener descriptor arrived: violations are named.
    got_listener: bool,
}

/// What reading the channel did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChanRead {
    /// Records (or nothing yet); the channel stays open.
    More,
    /// The seccomp listener arrived with a record.
    Listener,
    /// End-of-file: the exec happened, or the child died.
    Eof,
    /// A record did not decode: kill the child ([`Startup::error`] says why).
    Kill,
    /// Reading failed (not EINTR, not EAGAIN): the channel is dropped.
    Failed(Errno),
}

/// What a notification on the listener was.
#[derive(Debug)]
pub enum Listened {
    /// Nothing to do (answered by the start-up, gone, or the listener hung up).
    Nothing,
    /// The guest's own call, for the caller's supervision (answer it on [`Driver::listener`]).
    Guest(sys::Notif),
    /// The exec stop failed (the vDSO patch): the start-up failed at `Step::Vdso`; kill the
    /// child.
    ExecStopFailed(VdsoError),
}

impl Driver {
    /// The start-up of child `pid`, whose set-up channel is `chan` (made non-blocking here).
    pub fn new(pid: libc::pid_t, chan: OwnedFd, vdso: Option<vdso::Patch>) -> Driver {
        super::set_nonblocking(&chan);
        Driver {
            machine: Startup::new(),
            pid,
            chan: Some(chan),
            listener: None,
            buf: None,
            vdso,
            nonblocking: false,
            got_listener: false,
        }
    }

    /// Sets the listener non-blocking when it arrives.
    pub fn nonblocking_listener(mut self) -> Self {
        self.nonblocking = true;
        self
    }

    /// The machine, for what it decided.
    pub fn startup(&self) -> &Startup {
        &self.machine
    }

    /// The channel, while it is to be read.
    pub fn chan(&self) -> Option<BorrowedFd<'_>> {
        self.chan.as_ref().map(AsFd::as_fd)
    }

    /// The seccomp listener, while it is open.
    pub fn listener(&self) -> Option<BorrowedFd<'_>> {
        self.listener.as_ref().map(AsFd::as_fd)
    }

    /// Whether a listener descriptor came (it may have closed since): violations are named.
    pub fn got_listener(&self) -> bool {
        self.got_listener
    }

    /// The listener, taken (a zygote hands it to its router after the exec).
    pub fn take_listener(&mut self) -> Option<OwnedFd> {
        self.listener.take()
    }

    /// Reads what the channel holds (rules 1-4 and 6), until it would block. A read error is
    /// handled here, one way for every caller: the channel is dropped and the error returned.
    pub fn read_chan(&mut self) -> ChanRead {
        let mut read = ChanRead::More;
        while let Some(c) = &self.chan {
            match channel::recv(c) {
                Ok(Ok(Received::Msg(msg, fd))) => {
                    if msg == ChildMsg::Listener
                        && let Some(fd) = fd
                    {
                        if self.nonblocking {
                            super::set_nonblocking(&fd);
                        }
                        sys::notif_sync_wake_up(fd.as_fd());
                        self.buf = NotifBuf::new().ok();
                        self.listener = Some(fd);
                        self.got_listener = true;
                        read = ChanRead::Listener;
                        crate::timing::mark("child confined (listener received)");
                    }
                    self.machine.record(Ok(msg));
                }
                Ok(Ok(Received::Eof)) => {
                    self.machine.eof();
                    self.chan = None;
                    crate::timing::mark("exec confirmed (channel closed)");
                    return ChanRead::Eof;
                }
                Ok(Err(e)) => {
                    self.chan = None;
                    if self.machine.record(Err(e)) == Next::Kill {
                        return ChanRead::Kill;
                    }
                }
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => break,
                Err(e) => {
                    self.chan = None;
                    return ChanRead::Failed(Errno::from_raw(
                        e.raw_os_error().unwrap_or(libc::EIO),
                    ));
                }
            }
        }
        read
    }

    /// The listener was ready with `rev`: a hang-up (every task under the filter is gone)
    /// closes it; a notification is answered by the machine (rule 5: the initial exec let
    /// through, its vDSO patched at its stop; any other call before it refused) or, after the
    /// exec, handed back as the guest's.
    pub fn on_listener(&mut self, rev: PollFlags) -> Listened {
        if !rev.contains(PollFlags::POLLIN) {
            self.listener = None;
            return Listened::Nothing;
        }
        let (Some(l), Some(buf)) = (&self.listener, self.buf.as_mut()) else {
            return Listened::Nothing;
        };
        let Some(n) = notify::receive(l.as_fd(), buf) else {
            return Listened::Nothing;
        };
        match self.machine.notification(is_initial_exec(&n, self.pid)) {
            Route::AllowExec => match vdso::exec(l.as_fd(), &n, self.pid, self.vdso) {
                Ok(()) => Listened::Nothing,
                Err(e) => {
                    self.machine.parent_failed(Step::Vdso, e.errno());
                    Listened::ExecStopFailed(e)
                }
            },
            Route::Refuse => {
                notify::refuse(l.as_fd(), &n, libc::EPERM);
                Listened::Nothing
            }
            Route::Guest => Listened::Guest(n),
        }
    }
}

/// Whether notification `n` is the `execve` that starts the guest `pid` (native ABI).
pub fn is_initial_exec(n: &sys::Notif, pid: libc::pid_t) -> bool {
    n.pid == pid as u32
        && n.nr == libc::SYS_execve as i32
        && n.arch == crate::policy::bpf::AUDIT_ARCH_X86_64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn degraded(step: Step) -> Result<ChildMsg, ChannelError> {
        Ok(ChildMsg::Degraded {
            step,
            errno: Errno::EPERM,
        })
    }

    #[test]
    fn rule_1_degraded_steps_are_kept_in_order_and_the_child_goes_on() {
        let mut s = Startup::new();
        assert_eq!(s.record(degraded(Step::NetNs)), Next::Continue);
        assert_eq!(s.record(degraded(Step::UtsNs)), Next::Continue);
        assert_eq!(
            s.degraded(),
            &[(Step::NetNs, Errno::EPERM), (Step::UtsNs, Errno::EPERM)]
        );
        assert!(s.reading() && s.error().is_none());
    }

    #[test]
    fn rule_2_a_fatal_step_fails_the_start_up_at_end_of_file() {
        let mut s = Startup::new();
        let fatal = ChildMsg::Fatal {
            step: Step::Exec,
            errno: Errno::ENOENT,
        };
        assert_eq!(s.record(Ok(fatal)), Next::Continue);
        s.eof();
        assert!(s.finished() && !s.exec_confirmed());
        assert_eq!(
            s.error(),
            Some(StartupError::Fatal {
                step: Step::Exec,
                errno: Errno::ENOENT
            })
        );
        assert_eq!(
            s.error().unwrap().to_string(),
            "executing the command failed: No such file or directory"
        );
    }

    #[test]
    fn rule_3_the_listener_record_is_noted() {
        let mut s = Startup::new();
        assert!(!s.has_listener());
        s.record(Ok(ChildMsg::Listener));
        assert!(s.has_listener());
    }

    #[test]
    fn rule_4_a_record_that_does_not_decode_kills_the_child_and_ends_the_start_up() {
        let mut s = Startup::new();
        s.record(degraded(Step::NetNs));
        let bad = ChildMsg::decode(&[0xf7, 9, 0, 0, 0, 0, 0, 0]);
        assert_eq!(s.record(bad), Next::Kill);
        assert!(s.finished() && !s.exec_confirmed());
        assert_eq!(s.error(), Some(StartupError::Channel(ChannelError::Tag(9))));
        // Nothing read after it changes the verdict, not even end-of-file.
        s.record(Ok(ChildMsg::Fatal {
            step: Step::Landlock,
            errno: Errno::EPERM,
        }));
        s.eof();
        assert_eq!(s.error(), Some(StartupError::Channel(ChannelError::Tag(9))));
    }

    #[test]
    fn rule_5_the_initial_exec_passes_once_other_calls_before_it_are_refused() {
        let mut s = Startup::new();
        assert_eq!(s.notification(false), Route::Refuse);
        assert!(!s.exec_allowed());
        assert_eq!(s.notification(true), Route::AllowExec);
        assert!(s.exec_allowed());
        // After it, everything is the guest's, a second execve included.
        assert_eq!(s.notification(true), Route::Guest);
        assert_eq!(s.notification(false), Route::Guest);
        s.eof();
        assert_eq!(s.notification(true), Route::Guest);
    }

    #[test]
    fn rule_6_end_of_file_without_a_failure_confirms_the_exec() {
        let mut s = Startup::new();
        s.record(Ok(ChildMsg::Listener));
        assert_eq!(s.notification(true), Route::AllowExec);
        assert!(!s.exec_confirmed(), "not before end-of-file");
        s.eof();
        assert!(s.finished() && s.exec_confirmed() && s.error().is_none());
        // Without a listener (the fall-back filter) no exec notification comes: end-of-file
        // alone confirms it.
        let mut s = Startup::new();
        s.eof();
        assert!(s.exec_confirmed());
    }
    /// A set-up channel as `process::spawn` makes it: (the parent's end, the child's end).
    fn channel_pair() -> (OwnedFd, OwnedFd) {
        use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
        socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap()
    }

    #[test]
    fn the_driver_reads_every_record_waiting_and_end_of_file_confirms_the_exec() {
        use std::os::fd::AsRawFd;
        let (parent, child) = channel_pair();
        let mut d = Driver::new(1, parent, None);
        assert_eq!(
            d.read_chan(),
            ChanRead::More,
            "nothing yet: it does not block"
        );
        for step in [Step::NetNs, Step::UtsNs] {
            channel::send(
                child.as_raw_fd(),
                ChildMsg::Degraded {
                    step,
                    errno: Errno::EPERM,
                },
            );
        }
        assert_eq!(d.read_chan(), ChanRead::More);
        assert_eq!(d.startup().degraded().len(), 2, "both records in one read");
        drop(child); // the exec closed the child's end
        assert_eq!(d.read_chan(), ChanRead::Eof);
        assert!(d.chan().is_none() && d.startup().exec_confirmed());
        assert!(!d.got_listener() && d.listener().is_none());
    }

    #[test]
    fn the_driver_asks_for_the_kill_of_a_child_that_breaks_the_channel() {
        let (parent, child) = channel_pair();
        let mut d = Driver::new(1, parent, None);
        nix::unistd::write(&child, &[0xf7, 9, 0, 0, 0, 0, 0, 0]).unwrap();
        assert_eq!(d.read_chan(), ChanRead::Kill);
        assert!(d.chan().is_none(), "not read again");
        assert_eq!(
            d.startup().error(),
            Some(StartupError::Channel(ChannelError::Tag(9)))
        );
        assert_eq!(
            d.startup().channel_error(),
            Some(StartupError::Channel(ChannelError::Tag(9)).to_string()),
            "what the report says of it"
        );
    }

    #[test]
    fn a_listener_hang_up_closes_it_and_without_one_nothing_is_read() {
        let (parent, _child) = channel_pair();
        let mut d = Driver::new(1, parent, None);
        assert!(matches!(
            d.on_listener(PollFlags::POLLIN),
            Listened::Nothing
        ));
        assert!(matches!(
            d.on_listener(PollFlags::POLLHUP),
            Listened::Nothing
        ));
        assert!(d.listener().is_none());
    }
}
