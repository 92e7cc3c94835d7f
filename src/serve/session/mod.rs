//! One session of `wfjail serve`: a worker connection, one confined guest, many calls.
//!
//! The session thread runs a poll loop over the worker's connection (worker_conn.rs), the
//! guest's socket (the guest protocol, docs/protocol.md), the guest's stdout and stderr (a
//! pipe of the session's own, echoed behind `[session N] ` and bounded by `limits.output`),
//! and how the guest can end: a zygote's EXITED report (woken through a pipe) or, in exec
//! mode, the descriptors of the guest's `supervise::guest::Supervisor` (its pidfd, set-up
//! channel and seccomp listener), the same supervisor `wfjail run` embeds. What the session
//! does with what it reads is decided by its phase machine (phases.rs); the session carries
//! out the machine's actions. This file holds the session, its poll loop and its end; beside
//! it, one file per job: `actions.rs` (the machine's actions), `guest_io.rs` (the guest's
//! frames and output, the worker's frames, all bounded), `exec.rs` (exec mode: the embedded
//! supervisor, answering with the session's shared state), `pause.rs` (the guest stopped
//! between calls), `samples.rs` (memory and call CPU read on a timer) and `report.rs`.
//!
//! Against a hostile guest: each turn reads at most [`READ_TURN`] bytes per descriptor and
//! checks the deadline, every frame is charged to `limits.output`, the guest is not read
//! while answers to it or to the worker wait beyond [`PENDING_CAP`], and between calls the
//! guest is stopped (SIGSTOP after its answer, SIGCONT with the next call or at CLOSE), so
//! it runs no code the worker did not ask for.

mod actions;
mod exec;
mod guest_io;
mod pause;
mod report;
mod samples;

use guest_io::echo_stderr;
use report::failure_report;

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::echo::LineEcho;
use crate::protocol::guest::{self as gp, Conversation, Outbox};
use crate::protocol::worker::{self, Capacity};
use crate::protocol::{Kind, MAX_FRAME, encode};
use crate::supervise::assemble::Applied;
use crate::supervise::guest;
use crate::supervise::memory_evidence::{MemoryEvidence, SampleClock};
use crate::supervise::output::OutputMeter;
use crate::supervise::{VM_SAMPLE_WAIT, poll_timeout};
use crate::sys;

use super::launch::{Child, Launched, launch};
use super::phases::Phases;
use super::worker_conn::{OPEN_WAIT, OpenError, WorkerConn};
use super::{Server, SessionShared};

/// Frames waiting to be written to the guest or to the worker, in bytes, above which the
/// session stops reading from the guest until they drain: a guest that asks (QUERY) and
/// never reads its answers, or a worker that does not read its results, cannot make the
/// supervisor buffer without end (the call's deadline ends the wait).
const PENDING_CAP: usize = 1 << 20;
/// How long a guest has to stop (SIGSTOP) after answering, before the session fails.
const STOP_WAIT: Duration = Duration::from_secs(2);
/// How often a call's CPU time is read while it runs under `limits.cpu` (the ticks
/// themselves are 10 ms).
const CPU_SAMPLE_EVERY: Duration = Duration::from_millis(20);

/// What a descriptor in the session's poll set is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    /// The worker's connection.
    Worker,
    /// The session's end of the guest's socket.
    Guest,
    /// The guest's stdout and stderr.
    Output,
    /// The pipe that wakes the session when the zygote reported the exit, or when its
    /// lingering guest was displaced.
    Wake,
    /// Exec mode: the guest's supervisor's (pidfd, set-up channel, seccomp listener).
    Exec(guest::Token),
}

impl From<guest::Token> for Token {
    fn from(t: guest::Token) -> Self {
        Token::Exec(t)
    }
}

struct Session {
    id: u64,
    server: Arc<Server>,
    shared: Arc<SessionShared>,
    client: WorkerConn,
    guest: OwnedFd,
    /// The read end of the guest's stdout and stderr (a pipe of this session's own).
    output: Option<OwnedFd>,
    echo: LineEcho,
    /// Output and frames so far, against `limits.output`.
    output_meter: OutputMeter,
    output_exceeded: bool,
    /// The guest's CPU time (ms) when the current call began, while a call runs under
    /// `limits.cpu` (a call's budget; the session's whole life is `limits.session_cpu`).
    call_cpu_start: Option<f64>,
    /// A call went over `limits.cpu` and wfjail killed the guest.
    call_cpu_exceeded: bool,
    /// The guest's log records go to the worker (LOG frames), not to wfjail's stderr.
    relay_logs: bool,
    /// The guest is stopped (SIGSTOP) between calls: it runs only while a call is in
    /// progress (or while it starts, or exits after CLOSE).
    stopped: bool,
    /// When SIGSTOP was sent, until the next call resumes the guest or the loop looks at it
    /// [`STOP_WAIT`] later (it fails the session if the guest is not stopped then): the
    /// answer went on without waiting.
    stop_unconfirmed: Option<Instant>,
    /// Each violation's count when the current call began: the violations of a call are the
    /// new ones and those counted again since.
    counts_at_call: Vec<u32>,
    /// Frames for the guest (HELLO, requests, answers), written as its socket takes them.
    guest_out: Outbox,
    guest_open: bool,
    conv: Conversation,
    child: Child,
    /// Where the session is, and how it ends (phases.rs).
    phases: Phases,
    started: Instant,
    command: Vec<String>,
    /// The rlimits and write grants the guest runs under.
    applied: Applied,
    /// wfjail killed the guest itself (a SIGKILL it did not send is the CPU limit's).
    killed: bool,
    /// Zygote mode: kernel evidence for the memory limit, the largest peak address space read
    /// while the guest ran (in exec mode, the supervisor's: `memory()`).
    memory: MemoryEvidence,
    samples: SampleClock,
    /// The guest wrote output since the last sample (sample again sooner: a guest whose
    /// allocation failed prints why, then exits).
    output_since_sample: bool,
    /// When the call in progress was issued (for the latency counter).
    call_started: Option<Instant>,
    /// The session's slot, then its closed guest's place among the lingering (`linger`).
    slot: Option<super::SlotGuard>,
    /// The guest's `/proc/PID/stat` and `/proc/PID/status`, opened at their first look and
    /// read again from then on (`samples.rs`).
    proc_stat: std::cell::OnceCell<Option<crate::procfs::ProcFile>>,
    proc_status: std::cell::OnceCell<Option<crate::procfs::ProcFile>>,
}

/// Serves one worker connection (its thread's; `client` owes the worker a FAILED should the
/// thread not start).
pub fn run(mut client: WorkerConn, server: Arc<Server>) {
    let id = server.next_id();
    // Every way out below answers the worker (STATUS, BUSY, FAILED, CLOSED); one that does
    // not (a panic: a bug) still does, with this, rather than drop the connection unanswered.
    client.owe(failure_doc(
        &server,
        format!(
            "wfjail's session {id} ended without answering (a bug in wfjail: its stderr says \
             where)"
        ),
    ));
    let (open, early) = match client.read_open(OPEN_WAIT) {
        Ok(o) => o,
        // STATUS instead of OPEN: the capacity, and nothing else on this connection.
        Err(OpenError::NotOpen(worker::STATUS)) => {
            let doc = serde_json::to_vec(&capacity(&server)).unwrap_or_default();
            client.send_last(worker::SERVER, &doc);
            return;
        }
        Err(e) => {
            let report = failure_report(&server, vec![], e.to_string());
            client.send_last(worker::FAILED, report.to_json().as_bytes());
            return;
        }
    };
    // A session holds its slot until its CLOSE is taken (then its guest lingers, holding
    // none). With none free the worker hears so at once (BUSY), instead of waiting on a
    // thread that may have a deadline of its own.
    let Some(slot) = server.slots.try_acquire() else {
        server.metrics.session_busy();
        let doc = serde_json::to_vec(&capacity(&server)).unwrap_or_default();
        client.send_last(worker::BUSY, &doc);
        return;
    };
    let launched = match launch(id, &server, open) {
        Ok(l) => l,
        Err((e, command)) => {
            let report = failure_report(&server, command, e.to_string());
            client.send_last(worker::FAILED, report.to_json().as_bytes());
            return;
        }
    };
    let mut session = Session::new(id, server.clone(), client, launched, slot);
    // Calls pipelined behind OPEN are queued; a worker that sent OPEN and left at once is not
    // polled again: its end must be seen here.
    let gone = session.client.gone();
    let acts = session.phases.worker(early, gone, Instant::now());
    session.act(acts);
    session.event_loop();
    session.finish();
}

/// The server's capacity, for STATUS and BUSY.
fn capacity(server: &Server) -> Capacity {
    let (zygotes, zygotes_ready, zygotes_settled) = server.pool.as_ref().map_or((0, 0, 0), |p| {
        let list = p.zygotes.lock().unwrap();
        let running = || list.iter().flatten().filter(|z| z.alive());
        (
            list.len(),
            running().count(),
            running().filter(|z| z.settled.get().is_some()).count(),
        )
    });
    Capacity {
        capacity: server.slots.capacity(),
        open: server.slots.open(),
        lingering: server.slots.lingering(),
        mode: if server.pool.is_some() {
            "zygote"
        } else {
            "exec"
        }
        .into(),
        policy: server.policy.name.clone(),
        zygote_restarts: server.metrics.zygote_restarts(),
        waits_timed_out: super::waits::counts(),
        pid_answers: super::pid_answers::counts(),
        zygotes,
        zygotes_ready,
        zygotes_settled,
    }
}

/// The FAILED report of a connection that cannot be served, for `why`, as JSON.
pub fn failure_doc(server: &Server, why: String) -> Vec<u8> {
    failure_report(server, vec![], why).to_json().into_bytes()
}

/// Answers a connection that cannot be served with FAILED and `why`, without reading it.
pub fn refuse(conn: UnixStream, server: &Server, why: String) {
    let _ = conn.set_nonblocking(true);
    let mut client = WorkerConn::new(conn);
    let report = failure_report(server, vec![], why);
    client.send_last(worker::FAILED, report.to_json().as_bytes());
}

impl Session {
    fn new(
        id: u64,
        server: Arc<Server>,
        client: WorkerConn,
        launched: Launched,
        slot: super::SlotGuard,
    ) -> Session {
        let Launched {
            shared,
            child,
            command,
            applied,
            guest,
            output,
            timeout,
            relay_logs,
        } = launched;
        let conv = Conversation::new(MAX_FRAME);
        // The read gate (`reading_guest`) keeps it near PENDING_CAP; the bound is a backstop
        // above what one more request or answer can add.
        let mut guest_out = Outbox::new(PENDING_CAP + MAX_FRAME + gp::MAX_ANSWER);
        let _ = guest_out.push(&encode(Kind::Hello, &gp::hello(gp::VERSION)));
        let started = Instant::now();
        let output_meter = OutputMeter::new(server.policy.limits.output.0);
        Session {
            id,
            output_meter,
            server,
            shared,
            client,
            guest,
            output: Some(output),
            echo: LineEcho::new(format!("[session {id}] ")),
            output_exceeded: false,
            call_cpu_start: None,
            call_started: None,
            call_cpu_exceeded: false,
            stopped: false,
            stop_unconfirmed: None,
            counts_at_call: Vec::new(),
            guest_out,
            guest_open: true,
            conv,
            child,
            phases: Phases::new(timeout, started),
            relay_logs,
            started,
            command,
            memory: MemoryEvidence::new(applied.memory),
            applied,
            killed: false,
            samples: SampleClock::default(),
            output_since_sample: false,
            slot: Some(slot),
            proc_stat: std::cell::OnceCell::new(),
            proc_status: std::cell::OnceCell::new(),
        }
    }

    /// Kills the guest (it may already be gone).
    fn kill(&mut self) {
        self.killed = true;
        match &mut self.child {
            Child::Exec(e) => e.sup.kill(),
            Child::Zygote {
                zygote,
                ns_pid,
                pid,
                pidfd,
            } => {
                if pidfd.is_none() {
                    let p = pid.or_else(|| zygote.find_child(*ns_pid));
                    *pidfd = p.and_then(|p| sys::pidfd_open(p).ok());
                }
                if let Some(fd) = pidfd {
                    let _ = sys::pidfd_send_signal(fd.as_fd(), libc::SIGKILL);
                }
            }
        }
    }

    /// The guest's pid and pidfd (in zygote mode known once its first message arrived).
    fn guest_process(&self) -> Option<(libc::pid_t, BorrowedFd<'_>)> {
        match &self.child {
            Child::Exec(e) => Some((e.sup.pid(), e.sup.pidfd().as_fd())),
            Child::Zygote {
                pid: Some(p),
                pidfd: Some(fd),
                ..
            } => Some((*p, fd.as_fd())),
            Child::Zygote { .. } => None,
        }
    }

    /// Whether the guest is read from now: not while answers to it or to the worker wait
    /// beyond [`PENDING_CAP`].
    fn reading_guest(&self) -> bool {
        self.guest_out.len() < PENDING_CAP && self.client.unsent() < PENDING_CAP
    }

    /// Whether the guest has ended (its exit is known).
    fn ended(&self) -> bool {
        match &self.child {
            Child::Zygote { .. } => self.shared.exit().is_some(),
            Child::Exec(e) => e.reaped.is_some(),
        }
    }

    /// The descriptors to poll this turn, and what each is.
    fn poll_set<'a>(&'a self) -> (Vec<PollFd<'a>>, Vec<Token>) {
        let mut fds = Vec::with_capacity(6);
        let mut tokens = Vec::with_capacity(6);
        let mut watch = |fd: BorrowedFd<'a>, flags: PollFlags, token: Token| {
            fds.push(PollFd::new(fd, flags));
            tokens.push(token);
        };
        if !self.client.gone() {
            let flags = if self.client.unsent() == 0 {
                PollFlags::POLLIN
            } else {
                PollFlags::POLLIN | PollFlags::POLLOUT
            };
            watch(self.client.as_fd(), flags, Token::Worker);
        }
        if self.guest_open {
            let mut flags = PollFlags::empty();
            if self.reading_guest() {
                flags |= PollFlags::POLLIN;
            }
            if !self.guest_out.is_empty() {
                flags |= PollFlags::POLLOUT;
            }
            watch(self.guest.as_fd(), flags, Token::Guest);
        }
        if let Some(o) = &self.output {
            watch(o.as_fd(), PollFlags::POLLIN, Token::Output);
        }
        match &self.child {
            Child::Zygote { .. } => {
                watch(self.shared.wake_r.as_fd(), PollFlags::POLLIN, Token::Wake);
            }
            Child::Exec(e) => {
                // Woken when its lingering guest is displaced (`Slots`).
                watch(self.shared.wake_r.as_fd(), PollFlags::POLLIN, Token::Wake);
                e.sup.register(&mut fds, &mut tokens)
            }
        }
        (fds, tokens)
    }

    fn event_loop(&mut self) {
        self.flush_guest();
        while !self.ended() {
            let (mut fds, tokens) = self.poll_set();
            let mut wait = self
                .phases
                .deadline()
                .map(|d| d.saturating_duration_since(Instant::now()));
            if self.sampling() {
                wait = Some(wait.map_or(VM_SAMPLE_WAIT, |w| w.min(VM_SAMPLE_WAIT)));
            }
            if let Some(sent) = self.stop_unconfirmed {
                let left = STOP_WAIT.saturating_sub(sent.elapsed());
                wait = Some(wait.map_or(left, |w| w.min(left)));
            }
            if self.call_cpu_start.is_some() {
                wait = Some(wait.map_or(CPU_SAMPLE_EVERY, |w| w.min(CPU_SAMPLE_EVERY)));
            }
            let wait = wait.map_or(PollTimeout::NONE, poll_timeout);
            match poll(&mut fds, wait) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(_) => break,
            }
            let ready: Vec<(Token, PollFlags)> = tokens
                .into_iter()
                .zip(fds.iter())
                .map(|(t, f)| (t, f.revents().unwrap_or(PollFlags::empty())))
                .filter(|(_, r)| !r.is_empty())
                .collect();
            drop(fds);
            if let Err(why) = self.confirm_stop() {
                let acts = self.phases.fail(why);
                self.act(acts);
            }
            self.check_call_cpu();
            self.check_displaced();
            if self.sampling() {
                self.sample_memory(false);
            }
            // Checked on every turn, ready descriptors or not: a flooding guest keeps some
            // descriptor ready all the time.
            let acts = self.phases.tick(Instant::now());
            self.act(acts);
            let readable = PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR;
            for (token, rev) in ready {
                match token {
                    Token::Worker => {
                        if rev.contains(PollFlags::POLLOUT) {
                            self.client.flush();
                        }
                        if rev.intersects(readable) {
                            self.on_client();
                        }
                    }
                    Token::Guest => {
                        if rev.contains(PollFlags::POLLOUT) {
                            self.flush_guest();
                        }
                        if rev.intersects(readable) && self.reading_guest() {
                            self.on_guest(false);
                        }
                    }
                    Token::Output => self.on_output(false),
                    Token::Wake => {
                        let mut b = [0u8; 8];
                        let _ = nix::unistd::read(&self.shared.wake_r, &mut b);
                    }
                    Token::Exec(t) => self.on_exec(t, rev),
                }
            }
        }
        // What the guest wrote just before it ended.
        if self.guest_open {
            self.on_guest(true);
        }
        self.on_output(true);
        echo_stderr(&self.echo.finish());
    }

    /// Sends the session's report (CLOSED after CLOSE, FAILED otherwise) and cleans up.
    fn finish(mut self) {
        let report = self.report();
        self.server.metrics.session_ended(
            report.status.as_str(),
            report
                .violations
                .iter()
                .map(|v| (v.category.as_str(), u64::from(v.count))),
        );
        // CLOSED answers CLOSE (whatever was denied along the way); FAILED is any other end.
        let kind = if self.phases.closed() {
            worker::CLOSED
        } else {
            worker::FAILED
        };
        // Freed (or no longer lingering) before the worker hears the session ended: a worker
        // that opens its next session as soon as CLOSED arrives must find room.
        drop(self.slot.take());
        if !self.client.gone() {
            self.client.send_last(kind, report.to_json().as_bytes());
        }
        match &self.child {
            Child::Zygote { zygote, .. } => zygote.forget(&self.shared),
            Child::Exec(_) => {
                self.server.children.lock().unwrap().remove(&self.id);
            }
        }
    }
}
