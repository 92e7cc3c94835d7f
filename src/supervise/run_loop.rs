//! `wfjail run`'s poll loop: the guest's [`Supervisor`] (start-up, notifications, pidfd,
//! memory evidence) beside run's own descriptors — the guest's output ([`Streams`]), its
//! protocol conversation ([`Framed`]), wfjail's stop signals — and run's own clocks: the
//! deadline, the memory samples and `limits.disk`.

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, poll};

use crate::protocol::guest::Event;

use super::framed::{Framed, Pipe};
use super::guest::{self, Answers, Progress, Supervisor};
use super::memory_evidence::SampleClock;
use super::streams::{Stream, Streams};
use super::{Config, DRAIN_GRACE, Outcome, VM_SAMPLE_WAIT, disk_judged, poll_timeout};

/// Poll-set entries, by what they are.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Src {
    Guest(guest::Token),
    Stream(Stream),
    Pipe(Pipe),
    StopSignal,
}

impl From<guest::Token> for Src {
    fn from(t: guest::Token) -> Self {
        Src::Guest(t)
    }
}

impl From<Stream> for Src {
    fn from(s: Stream) -> Self {
        Src::Stream(s)
    }
}

impl From<Pipe> for Src {
    fn from(p: Pipe) -> Self {
        Src::Pipe(p)
    }
}

impl Src {
    /// The order ready descriptors are handled in, one turn: the start-up and notifications,
    /// the output, then the exit (output read in the same turn counts as before it), the stop
    /// signals and the frames.
    fn rank(self) -> u8 {
        match self {
            Src::Guest(guest::Token::Chan) => 0,
            Src::Guest(guest::Token::Listener) => 1,
            Src::Stream(Stream::Stdout) => 2,
            Src::Stream(Stream::Stderr) => 3,
            Src::Guest(guest::Token::Pidfd) => 4,
            Src::StopSignal => 5,
            Src::Pipe(Pipe::FromGuest) => 6,
            Src::Pipe(Pipe::ToGuest) => 7,
        }
    }
}

/// One run's supervision, between its start and its outcome.
pub(super) struct RunLoop<'c, 'a> {
    pub cfg: &'c Config,
    pub sup: Supervisor<Answers>,
    pub streams: Streams<'a>,
    pub framed: Option<Framed>,
    pub o: Outcome,
    pub deadline: Option<Instant>,
    pub exited_at: Option<Instant>,
    pub samples: SampleClock,
    /// Output came last turn (sample memory sooner).
    pub woke_by_output: bool,
    pub buf: Vec<u8>,
}

impl RunLoop<'_, '_> {
    /// Runs turns until the guest exited and its output is drained.
    pub fn run(&mut self) {
        loop {
            self.clocks();
            if self.drained() {
                break;
            }
            self.turn();
        }
    }

    /// What is checked on every turn, ready descriptors or not: a guest that keeps a
    /// descriptor busy must not keep its time, its memory unsampled or its disk unmeasured.
    fn clocks(&mut self) {
        let running = self.exited_at.is_none();
        if let (Some(d), true, false) = (self.deadline, running, self.o.timed_out)
            && Instant::now() >= d
        {
            self.o.timed_out = true;
            self.sup.kill();
        }
        // Kernel evidence for the memory limit: the peak address space, while the guest lives.
        let after_output = std::mem::take(&mut self.woke_by_output);
        if self.cfg.memory_limit.is_some()
            && running
            && self.sup.execd()
            && self.samples.due(after_output)
        {
            self.samples.sampled();
            self.sup.sample_memory();
        }
        // limits.disk: what the guest added under its write grants, on its own timer.
        if let Some(acct) = &self.cfg.disk
            && running
            && self.sup.execd()
            && !self.o.disk_exceeded
            && acct.borrow_mut().over(self.sup.pid())
        {
            self.sup.kill();
            disk_judged(self.cfg, &mut self.o);
        }
    }

    /// Whether the guest exited and nothing more is to be read (or the grace is over).
    fn drained(&self) -> bool {
        let open = self.streams.open() || self.framed.as_ref().is_some_and(Framed::open);
        self.exited_at
            .is_some_and(|t| (self.sup.execd() && !open) || t.elapsed() > DRAIN_GRACE)
    }

    /// How long the next poll may wait.
    fn wait(&self) -> Duration {
        let mut wait = match self.exited_at {
            Some(t) => DRAIN_GRACE.saturating_sub(t.elapsed()),
            None => Duration::from_secs(3600),
        };
        let running = self.exited_at.is_none();
        if let (Some(d), true, false) = (self.deadline, running, self.o.timed_out) {
            wait = wait.min(d.saturating_duration_since(Instant::now()));
        }
        if self.cfg.memory_limit.is_some() && running {
            wait = wait.min(VM_SAMPLE_WAIT);
        }
        if let Some(acct) = &self.cfg.disk
            && running
        {
            wait = wait.min(acct.borrow().due_in().max(Duration::from_millis(1)));
        }
        wait
    }

    /// One poll, and what was ready handled in [`Src::rank`]'s order.
    fn turn(&mut self) {
        let mut fds: Vec<PollFd> = Vec::with_capacity(8);
        let mut srcs: Vec<Src> = Vec::with_capacity(8);
        self.sup.register(&mut fds, &mut srcs);
        self.streams.register(&mut fds, &mut srcs);
        if self.exited_at.is_none()
            && let Some(sfd) = &self.cfg.stop_signals
        {
            fds.push(PollFd::new(sfd.as_fd(), PollFlags::POLLIN));
            srcs.push(Src::StopSignal);
        }
        if let Some(f) = &self.framed {
            f.register(&mut fds, &mut srcs);
        }
        let ready = match poll(&mut fds, poll_timeout(self.wait())) {
            Ok(n) => n,
            Err(Errno::EINTR) => return,
            Err(_) => 0,
        };
        let mut revents: Vec<(Src, PollFlags)> = srcs
            .iter()
            .zip(fds.iter())
            .map(|(&s, f)| (s, f.revents().unwrap_or(PollFlags::empty())))
            .filter(|(_, r)| !r.is_empty())
            .collect();
        drop(fds);
        if ready == 0 {
            return;
        }
        revents.sort_by_key(|(s, _)| s.rank());
        for (src, rev) in revents {
            // Output is data to read: a pipe that only hung up (the guest closed it, or
            // exited: its memory is gone before its descriptors close) asks for no sample.
            self.woke_by_output |= rev.contains(PollFlags::POLLIN)
                && matches!(src, Src::Stream(_) | Src::Pipe(Pipe::FromGuest));
            match src {
                Src::Guest(token) => self.on_guest(token, rev),
                Src::Stream(s) => {
                    // Keep what fits in the bound; the rest is dropped (and the guest killed).
                    let exceeded = self.streams.on_ready(s, &mut self.buf);
                    if exceeded && !self.o.output_exceeded && self.exited_at.is_none() {
                        self.o.output_exceeded = true;
                        self.sup.kill();
                    }
                }
                Src::StopSignal => {
                    let signal = self.cfg.stop_signals.as_ref().map(|s| s.read_signal());
                    if let Some(Ok(Some(info))) = signal
                        && self.o.interrupted.is_none()
                    {
                        self.o.interrupted = Some(info.ssi_signo as i32);
                        self.sup.kill();
                    }
                }
                Src::Pipe(Pipe::ToGuest) => {
                    if let Some(f) = self.framed.as_mut() {
                        f.flush();
                    }
                }
                Src::Pipe(Pipe::FromGuest) => self.on_frames(),
            }
        }
    }

    /// The supervisor's descriptor `token` was ready: what it reports goes in the outcome.
    fn on_guest(&mut self, token: guest::Token, rev: PollFlags) {
        match self.sup.on_ready(token, rev) {
            Progress::Nothing | Progress::SetupBroken => {}
            Progress::Exited => {
                crate::timing::mark("guest exited (pidfd)");
                self.exited_at = Some(Instant::now());
            }
            Progress::ExecStopFailed(e) => self.streams.say(e),
            Progress::OverBudget => self.o.notifications_exceeded = true,
            Progress::KilledForViolation => self.o.killed_for_violation = true,
        }
    }

    /// The guest's frames: LOG echoed, QUERY and UPCALL answered, RESULT or ERROR kept.
    fn on_frames(&mut self) {
        let Some(f) = self.framed.as_mut() else {
            return;
        };
        let r = f.read(&mut self.buf, &mut self.streams.meter);
        let r = r.and_then(|events| {
            for ev in events {
                match ev {
                    Event::Hello => {}
                    Event::Log { level, text } => self.streams.log(level, &text),
                    Event::Query => {
                        let list = self.sup.answers_mut().violations.take_since_query();
                        f.answer_query(&list)?;
                    }
                    Event::Upcall(_) => f.refuse_upcall()?,
                    Event::Result(bytes) => {
                        self.o.result = Some(bytes);
                        f.answered();
                    }
                    Event::Error(e) => {
                        // The guest waits for the end of its input now, its address space
                        // whole: the memory limit may explain the failure (serve samples
                        // here too).
                        self.sup.memory.sample(self.sup.pid());
                        self.o.guest_error = Some(e);
                        f.answered();
                    }
                }
            }
            Ok(())
        });
        let o = &mut self.o;
        if self.streams.meter.over() && !o.output_exceeded && self.exited_at.is_none() {
            o.output_exceeded = true;
            self.sup.kill();
        }
        match r {
            Ok(()) => f.flush(),
            Err(e) => {
                // After we stopped the guest ourselves (deadline, output bound, violation), a
                // frame cut short is our doing, not the guest's.
                let we_stopped = o.timed_out || o.output_exceeded || o.killed_for_violation;
                if o.protocol_error.is_none() && !we_stopped {
                    o.protocol_error = Some(e.0);
                }
                f.broken();
                self.sup.kill();
            }
        }
    }
}
