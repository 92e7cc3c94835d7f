//! One session of `wfjail serve`: a worker connection, one confined guest, many calls.
//!
//! The session thread runs a poll loop over the worker's connection (worker_conn.rs), the
//! guest's socket (the guest protocol, docs/protocol.md), the guest's stdout and stderr (a
//! pipe of the session's own, echoed behind `[session N] ` and bounded by `limits.output`),
//! and how the guest can end: a zygote's EXITED report (woken through a pipe) or, in exec
//! mode, the pidfd — plus, in exec mode, the set-up channel and the guest's own seccomp
//! listener. What the session does with what it reads is decided by its phase machine
//! (phases.rs); this file does the I/O and carries out the machine's actions.
//!
//! Against a hostile guest: each turn reads at most [`READ_TURN`] bytes per descriptor and
//! checks the deadline, every frame is charged to `limits.output`, the guest is not read
//! while answers to it or to the worker wait beyond [`PENDING_CAP`], and between calls the
//! guest is stopped (SIGSTOP after its answer, SIGCONT with the next call or at CLOSE), so
//! it runs no code the worker did not ask for.

use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{ControlMessageOwned, MsgFlags, Shutdown, recvmsg, shutdown};
use serde_json::json;

use crate::echo::{LineEcho, escape_guest_text};
use crate::protocol::guest::{self as gp, Conversation, Outbox};
use crate::protocol::worker::{self, Capacity, Opened};
use crate::protocol::{Kind, MAX_FRAME, encode};
use crate::report::Report;
use crate::supervise::assemble::{self, Account, Applied};
use crate::supervise::notify::{self, Handled};
use crate::supervise::startup::{ChanRead, Listened, StartupError};
use crate::supervise::verdict::{self, Ending, Facts, SetupFailed};
use crate::supervise::{
    VM_SAMPLE_AFTER_OUTPUT, VM_SAMPLE_EVERY, VM_SAMPLE_WAIT, level_name, poll_timeout,
};
use crate::sys;

use super::launch::{Child, Launched, launch};
use super::phases::{Action, Failure, Phases};
use super::worker_conn::{OPEN_WAIT, OpenError, READ_TURN, WorkerConn};
use super::zygote::ChildExit;
use super::{Server, SessionShared};

/// Frames waiting to be written to the guest or to the worker, in bytes, above which the
/// session stops reading from the guest until they drain: a guest that asks (QUERY) and
/// never reads its answers, or a worker that does not read its results, cannot make the
/// supervisor buffer without end (the call's deadline ends the wait).
const PENDING_CAP: usize = 1 << 20;
/// How long a guest has to stop (SIGSTOP) after answering, before the session fails.
const STOP_WAIT: Duration = Duration::from_secs(2);
/// Clock ticks per second in `/proc/PID/stat` (USER_HZ, fixed at 100 in the x86_64 ABI).
const CLOCK_TICKS: f64 = 100.0;
/// How often a call's CPU time is read while it runs under `limits.cpu` (the ticks
/// themselves are 10 ms).
const CPU_SAMPLE_EVERY: Duration = Duration::from_millis(20);
/// How often the loop looks whether a guest sent SIGSTOP has stopped, until it has.
const STOP_CHECK: Duration = Duration::from_millis(1);

/// What a descriptor in the session's poll set is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    /// The worker's connection.
    Worker,
    /// The session's end of the guest's socket.
    Guest,
    /// The guest's stdout and stderr.
    Output,
    /// Zygote mode: the pipe that wakes the session when the zygote reported the exit.
    Wake,
    /// Exec mode: the guest's pidfd (readable once it exited).
    Pidfd,
    /// Exec mode: the set-up channel, until the exec.
    Chan,
    /// Exec mode: the guest's seccomp listener.
    Listener,
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
    /// Bytes of output and LOG frames so far, against `limits.output`.
    output_bytes: u64,
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
    /// When SIGSTOP was sent, while the kernel does not show the guest stopped yet: the
    /// answer went on without waiting, and the loop confirms the stop (or fails the session
    /// after [`STOP_WAIT`]).
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
    /// Kernel evidence for the memory limit: the largest peak address space read while the
    /// guest ran, and a mapping seen asking for more than RLIMIT_AS left (exec mode).
    vm_peak: Option<u64>,
    memory_refused: bool,
    last_sample: Option<Instant>,
    /// The guest wrote output since the last sample (sample again sooner: a guest whose
    /// allocation failed prints why, then exits).
    output_since_sample: bool,
    /// When the call in progress was issued (for the latency counter).
    call_started: Option<Instant>,
}

/// The state letter of `/proc/PID/stat` (`R`, `S`, `T`...), `None` when the process is gone.
fn proc_state(pid: libc::pid_t) -> Option<u8> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    let close = stat.iter().rposition(|&b| b == b')')?;
    stat.get(close + 2).copied()
}

/// Serves one worker connection.
pub fn run(conn: UnixStream, server: Arc<Server>) {
    let id = server.next_id();
    let mut client = WorkerConn::new(conn);
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
    // A session holds its slot for its whole life. With none free the worker hears so at
    // once (BUSY), instead of waiting on a thread that may have a deadline of its own.
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
    let mut session = Session::new(id, server.clone(), client, launched);
    // Calls pipelined behind OPEN are queued; a worker that sent OPEN and left at once is not
    // polled again: its end must be seen here.
    let gone = session.client.gone();
    let acts = session.phases.worker(early, gone, Instant::now());
    session.act(acts);
    session.event_loop();
    // The slot is free before the worker hears the session ended: a worker that opens its
    // next session as soon as CLOSED arrives must find room.
    session.finish(move || drop(slot));
}

/// The server's capacity, for STATUS and BUSY.
fn capacity(server: &Server) -> Capacity {
    Capacity {
        capacity: server.slots.capacity(),
        open: server.slots.open(),
        mode: if server.pool.is_some() {
            "zygote"
        } else {
            "exec"
        }
        .into(),
        policy: server.policy.name.clone(),
    }
}

/// Answers a connection that cannot be served with FAILED and `why`, without reading it.
pub fn refuse(conn: UnixStream, server: &Server, why: String) {
    let _ = conn.set_nonblocking(true);
    let mut client = WorkerConn::new(conn);
    let report = failure_report(server, vec![], why);
    client.send_last(worker::FAILED, report.to_json().as_bytes());
}

/// A report for a session that never got a guest.
fn failure_report(server: &Server, command: Vec<String>, message: String) -> Report {
    Report::launch_error(&server.policy.name, &command, message, 125)
}

impl Session {
    fn new(id: u64, server: Arc<Server>, client: WorkerConn, launched: Launched) -> Session {
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
        Session {
            id,
            server,
            shared,
            client,
            guest,
            output: Some(output),
            echo: LineEcho::new(format!("[session {id}] ")),
            output_bytes: 0,
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
            applied,
            killed: false,
            vm_peak: None,
            memory_refused: false,
            last_sample: None,
            output_since_sample: false,
        }
    }

    /// Carries out the phase machine's actions, in order. Returns false when one could not
    /// be carried out (the guest's outbox was full: the session failed) and the rest were
    /// dropped.
    fn act(&mut self, actions: Vec<Action>) -> bool {
        for action in actions {
            match action {
                Action::SetClock(t) => {
                    let mut det = self.shared.determinism.lock().unwrap();
                    if det.clock.is_some() {
                        det.clock = Some(t); // a TIME under a real clock changes nothing
                    }
                }
                Action::Request(request) => {
                    if let Err(e) = self.guest_out.push(&encode(Kind::Request, &request)) {
                        let acts = self.phases.request_unsent(e);
                        self.act(acts);
                        return false;
                    }
                    self.conv.begin_call();
                    self.call_started = Some(Instant::now());
                    self.start_call_cpu(true);
                    self.counts_at_call = self
                        .shared
                        .violations
                        .lock()
                        .unwrap()
                        .list
                        .iter()
                        .map(|v| v.count)
                        .collect();
                    self.flush_guest();
                }
                Action::Resume => self.resume_guest(),
                Action::Stop => {
                    if let Err(why) = self.stop_guest() {
                        let acts = self.phases.fail(why);
                        self.act(acts);
                    }
                }
                Action::EndInput => {
                    // End-of-file on its input tells the guest there is no further call.
                    let _ = shutdown(self.guest.as_raw_fd(), Shutdown::Write);
                }
                Action::Opened => {
                    // The guest said HELLO: from now on its randomness is the session's
                    // stream (a forked child drew before, at fork and while starting; those
                    // draws depend on whether a spare was ready, so they get fixed bytes).
                    self.shared.determinism.lock().unwrap().armed = true;
                    self.server.metrics.session_opened();
                    let mode = if matches!(self.child, Child::Zygote { .. }) {
                        "zygote"
                    } else {
                        "exec"
                    };
                    let opened = Opened {
                        session: self.id,
                        mode: mode.into(),
                    };
                    let doc = serde_json::to_vec(&opened).unwrap_or_default();
                    self.client.send(worker::OPENED, &doc);
                }
                Action::Result(bytes) => {
                    self.start_call_cpu(false);
                    if let Some(t) = self.call_started.take() {
                        self.server.metrics.call(t.elapsed(), false);
                    }
                    // A call that succeeded may still have been denied something (code that
                    // swallowed the error): the worker hears of it before the result.
                    let during = self.call_violations();
                    if !during.is_empty() {
                        let doc = serde_json::to_vec(&during).unwrap_or_default();
                        self.client.send(worker::VIOLATIONS, &doc);
                    }
                    self.client.send(worker::RESULT, &bytes)
                }
                Action::CallError(e) => {
                    self.start_call_cpu(false);
                    if let Some(t) = self.call_started.take() {
                        self.server.metrics.call(t.elapsed(), true);
                    }
                    // The violations of this call only: a guest's ERROR typed
                    // `wfjail.Violation` cannot borrow one from an earlier call.
                    let during = self.call_violations();
                    let doc = json!({
                        "type": e.kind, "message": e.message, "traceback": e.traceback,
                        "violations": during,
                    });
                    self.client.send(worker::ERROR, doc.to_string().as_bytes());
                }
                Action::AnswerQuery => {
                    let list = self.shared.violations.lock().unwrap().take_since_query();
                    if let Err(e) = self.guest_out.push(&gp::violations_frame(&list, MAX_FRAME)) {
                        let acts = self.phases.fail(Failure::QueryUnread(e));
                        self.act(acts);
                        return false;
                    }
                    self.flush_guest();
                }
                Action::Log { level, text } => {
                    if self.relay_logs {
                        let doc = json!({"level": level, "text": text});
                        self.client.send(worker::LOG, doc.to_string().as_bytes());
                    } else if self.server.echo {
                        // Escaped: a guest's text cannot start a line of its own.
                        eprintln!(
                            "[session {}] log ({}): {}",
                            self.id,
                            level_name(level),
                            escape_guest_text(text.as_bytes())
                        );
                    }
                }
                Action::Upcall(bytes) => self.client.send(worker::UPCALL, &bytes),
                Action::Interrupt => {
                    if let Some((_, pidfd)) = self.guest_process() {
                        let _ = sys::pidfd_send_signal(pidfd, libc::SIGUSR2);
                    }
                }
                Action::Reply(payload) => {
                    if let Err(e) = self.guest_out.push(&encode(Kind::Reply, &payload)) {
                        let acts = self.phases.fail(Failure::RequestUnsent(e));
                        self.act(acts);
                        return false;
                    }
                    self.flush_guest();
                }
                Action::SampleMemory => self.sample_memory(true),
                Action::Kill => self.kill(),
            }
        }
        true
    }

    /// Kills the guest (it may already be gone).
    fn kill(&mut self) {
        self.killed = true;
        match &mut self.child {
            Child::Exec(e) => {
                let _ = sys::pidfd_send_signal(e.pidfd.as_fd(), libc::SIGKILL);
            }
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
            Child::Exec(e) => Some((e.pid, e.pidfd.as_fd())),
            Child::Zygote {
                pid: Some(p),
                pidfd: Some(fd),
                ..
            } => Some((*p, fd.as_fd())),
            Child::Zygote { .. } => None,
        }
    }

    /// Kernel evidence for the memory limit (`limits.memory` set): the guest's peak address
    /// space (`VmPeak`, a high-water mark the kernel keeps until the guest exits), read at
    /// most every [`VM_SAMPLE_EVERY`] ([`VM_SAMPLE_AFTER_OUTPUT`] after output), or now
    /// (`force`).
    fn sample_memory(&mut self, force: bool) {
        if self.applied.memory.is_none() || self.ended() {
            return;
        }
        let every = if self.output_since_sample {
            VM_SAMPLE_AFTER_OUTPUT
        } else {
            VM_SAMPLE_EVERY
        };
        if !force && self.last_sample.is_some_and(|t| t.elapsed() < every) {
            return;
        }
        if let Child::Exec(e) = &self.child
            && e.start.chan().is_some()
        {
            return; // not exec'd yet: wfjail's own image
        }
        let Some((pid, pidfd)) = self.guest_process() else {
            return;
        };
        let peak = crate::supervise::vm_peak(pid);
        // Read after the guest exited, the pid may be another process's (a zygote reaps its
        // children): only a read made while the guest still ran counts.
        let mut fds = [PollFd::new(pidfd, PollFlags::POLLIN)];
        let exited = poll(&mut fds, PollTimeout::ZERO).is_ok_and(|n| n > 0);
        if !exited {
            self.vm_peak = self.vm_peak.max(peak);
        }
        self.last_sample = Some(Instant::now());
        self.output_since_sample = false;
    }

    /// Whether the guest's memory is sampled on a timer now: it runs (not stopped between
    /// calls) and `limits.memory` is set.
    fn sampling(&self) -> bool {
        self.applied.memory.is_some() && !self.stopped && self.guest_process().is_some()
    }

    /// The violations recorded during the current call: the new entries, and those counted
    /// again since it began.
    fn call_violations(&self) -> Vec<crate::report::Violation> {
        let v = self.shared.violations.lock().unwrap();
        v.list
            .iter()
            .enumerate()
            .filter(|(i, v)| self.counts_at_call.get(*i).is_none_or(|&c| v.count > c))
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Stops the guest after it answered, so that it runs no code between calls (a guest
    /// could answer and go on working, from code after its reply or a signal handler).
    /// SIGSTOP cannot be caught or ignored, and as it comes from an ancestor PID namespace it
    /// stops a guest that is PID 1 too. The kernel stops it as soon as it runs (a running
    /// guest is interrupted at once); the answer does not wait for that, the event loop
    /// confirms it ([`Session::confirm_stop`]).
    fn stop_guest(&mut self) -> Result<(), Failure> {
        if self.stopped || self.ended() {
            return Ok(());
        }
        let Some((_, pidfd)) = self.guest_process() else {
            return Err(Failure::NoPid);
        };
        if sys::pidfd_send_signal(pidfd, libc::SIGSTOP).is_err() {
            return Ok(()); // it is gone: its exit is on the way
        }
        self.stopped = true;
        self.stop_unconfirmed = Some(Instant::now());
        Ok(())
    }

    /// Whether the stop sent last is confirmed by the kernel (or moot: the guest runs again,
    /// or is gone); a guest still not stopped [`STOP_WAIT`] after SIGSTOP fails the session.
    fn confirm_stop(&mut self) -> Result<(), Failure> {
        let (Some(sent), true) = (self.stop_unconfirmed, self.stopped) else {
            self.stop_unconfirmed = None;
            return Ok(());
        };
        let Some((pid, _)) = self.guest_process() else {
            self.stop_unconfirmed = None;
            return Ok(());
        };
        match proc_state(pid) {
            Some(b'T' | b't' | b'Z' | b'X') | None => {
                self.stop_unconfirmed = None;
                Ok(())
            }
            Some(_) if sent.elapsed() >= STOP_WAIT => {
                self.stop_unconfirmed = None;
                Err(Failure::NoStop(STOP_WAIT))
            }
            Some(_) => Ok(()),
        }
    }

    /// Lets a stopped guest run again (a call begins, or it is to exit).
    fn resume_guest(&mut self) {
        self.stop_unconfirmed = None;
        if !std::mem::take(&mut self.stopped) {
            return;
        }
        // The peak address space is a high-water mark: a sample taken a sampling period
        // into the call sees everything before it, so a short call costs no read of /proc.
        self.last_sample = Some(Instant::now());
        if let Some((_, pidfd)) = self.guest_process() {
            let _ = sys::pidfd_send_signal(pidfd, libc::SIGCONT);
        }
    }

    /// Reads the guest's stdout and stderr (at most [`READ_TURN`] bytes; `drain`: until the
    /// end), echoes it line by line behind the session's prefix, and charges it to
    /// `limits.output`.
    fn on_output(&mut self, drain: bool) {
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
    fn charge_output(&mut self, n: u64) -> bool {
        self.output_bytes = self.output_bytes.saturating_add(n);
        let limit = self.server.policy.limits.output.0;
        if !self.output_exceeded && self.output_bytes > limit {
            self.output_exceeded = true;
            echo_stderr(&self.echo.finish());
            let acts = self.phases.fail(Failure::Output(limit));
            self.act(acts);
        }
        self.output_exceeded
    }

    /// The guest's user + system CPU time in ms (`/proc/PID/stat`), while it runs.
    fn guest_cpu_ms(&self) -> Option<f64> {
        let (pid, _) = self.guest_process()?;
        let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
        let close = stat.iter().rposition(|&b| b == b')')?;
        let fields: Vec<&[u8]> = stat[close + 2..].split(|&b| b == b' ').collect();
        // After the command: state is field 3, utime 14 and stime 15 (1-based).
        let tick =
            |i: usize| -> Option<f64> { std::str::from_utf8(fields.get(i)?).ok()?.parse().ok() };
        let ticks = tick(11)? + tick(12)?;
        Some(ticks * 1000.0 / CLOCK_TICKS)
    }

    /// A call began (or ended): its CPU budget starts from the guest's CPU time now.
    fn start_call_cpu(&mut self, calling: bool) {
        self.call_cpu_start = if calling && self.server.policy.limits.cpu.is_some() {
            self.guest_cpu_ms()
        } else {
            None
        };
    }

    /// Checks the current call against `limits.cpu`; over it, the guest is killed.
    fn check_call_cpu(&mut self) {
        let (Some(start), Some(limit)) = (self.call_cpu_start, self.server.policy.limits.cpu)
        else {
            return;
        };
        if self.call_cpu_exceeded {
            return;
        }
        if let Some(now) = self.guest_cpu_ms()
            && now - start >= limit.0.as_secs_f64() * 1000.0
        {
            self.call_cpu_exceeded = true;
            self.call_cpu_start = None;
            let acts = self.phases.fail(Failure::CallCpu(limit.0));
            self.act(acts);
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

    fn flush_guest(&mut self) {
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
    fn on_client(&mut self) {
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
    fn on_guest(&mut self, drain: bool) {
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

    /// Exec mode: set-up records until end-of-file (the exec happened); a child that breaks
    /// the set-up protocol is killed (supervise/startup.rs).
    fn on_chan(&mut self) {
        let Child::Exec(e) = &mut self.child else {
            return;
        };
        if e.start.read_chan() == ChanRead::Kill {
            let _ = sys::pidfd_send_signal(e.pidfd.as_fd(), libc::SIGKILL);
            self.killed = true;
        }
    }

    /// Exec mode: the guest's own seccomp notifications.
    fn on_listener(&mut self, rev: PollFlags) {
        let Child::Exec(e) = &mut self.child else {
            return;
        };
        let n = match e.start.on_listener(rev) {
            Listened::Guest(n) => n,
            Listened::Nothing => return,
            Listened::ExecStopFailed(err) => {
                eprintln!("wfjail: session {}: {err}", self.id);
                let _ = sys::pidfd_send_signal(e.pidfd.as_fd(), libc::SIGKILL);
                return;
            }
        };
        let Some(l) = e.start.listener() else { return };
        // The supervisor's work for the session is bounded (notify::Budget).
        let pidfd = e.pidfd.clone();
        let kill = || {
            let _ = sys::pidfd_send_signal(pidfd.as_fd(), libc::SIGKILL);
        };
        if !notify::charge(&mut self.shared.budget.lock().unwrap(), l.as_fd(), &n, kill) {
            self.shared.mark_killed();
            return;
        }
        if let Some(limit) = self.applied.memory
            && crate::supervise::mapping_beyond_limit(
                l.as_fd(),
                &n,
                e.pid,
                limit,
                &self.server.policy,
            )
            .is_some()
        {
            self.memory_refused = true;
        }
        if self.applied.memory.is_some()
            && let Some(peak) =
                crate::supervise::peak_at_exit(l.as_fd(), &n, e.pid, &e.plan.decisions)
        {
            self.vm_peak = self.vm_peak.max(Some(peak));
        }
        let mut v = self.shared.violations.lock().unwrap();
        let mut det = self.shared.determinism.lock().unwrap();
        let det = &mut *det;
        let clock = det.clock;
        let state = notify::State {
            violations: &mut v,
            entropy: det.entropy.as_mut(),
            clock,
            monotonic: &mut det.monotonic,
            learned: None,
        };
        let rules = notify::Rules::new(&e.plan, &e.grants);
        let handled = notify::handle(l.as_fd(), &n, rules, state, || {
            let _ = sys::pidfd_send_signal(pidfd.as_fd(), libc::SIGKILL);
        });
        drop((v, det));
        if handled == Handled::Killed {
            self.shared.mark_killed();
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
                watch(e.pidfd.as_fd(), PollFlags::POLLIN, Token::Pidfd);
                if let Some(c) = e.start.chan() {
                    watch(c, PollFlags::POLLIN, Token::Chan);
                }
                if let Some(l) = e.start.listener() {
                    watch(l, PollFlags::POLLIN, Token::Listener);
                }
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
            if self.stop_unconfirmed.is_some() {
                wait = Some(wait.map_or(STOP_CHECK, |w| w.min(STOP_CHECK)));
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
                    Token::Pidfd => {
                        if let Child::Exec(e) = &mut self.child
                            && e.reaped.is_none()
                        {
                            e.reaped = sys::wait4(e.pid).ok();
                        }
                    }
                    Token::Chan => self.on_chan(),
                    Token::Listener => self.on_listener(rev),
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

    /// Sends the session's report (CLOSED after CLOSE, FAILED otherwise) and cleans up;
    /// `release` frees the session's slot, once its guest is gone and before the worker is
    /// told.
    fn finish(mut self, release: impl FnOnce()) {
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
        release();
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

    /// The session's report: the facts of how its guest ended, judged by
    /// [`verdict::classify`] as `wfjail run` judges its guest.
    fn report(&mut self) -> Report {
        let (status_word, cpu_ms, max_rss_kb, layers, zygote_died) = match &self.child {
            Child::Zygote { zygote, .. } => {
                let exit = self.shared.exit().unwrap_or(ChildExit {
                    status: None,
                    cpu_ms: 0.0,
                    max_rss_kb: 0,
                });
                (
                    exit.status,
                    exit.cpu_ms,
                    exit.max_rss_kb,
                    zygote.layers.clone(),
                    exit.status.is_none(),
                )
            }
            Child::Exec(e) => {
                let layers = assemble::layers(
                    &e.plan,
                    &e.base,
                    e.start.startup().degraded(),
                    e.start.startup().has_listener(),
                );
                let (cpu, rss) = e.reaped.map_or((0.0, 0), |r| (r.cpu_ms(), r.max_rss_kb()));
                (e.reaped.map(|r| r.status), cpu, rss, layers, false)
            }
        };
        let violations = self.shared.violations.lock().unwrap();
        let enforced = violations.any_enforced();
        let list = violations.list.clone();
        drop(violations);
        let fatal = match &self.child {
            Child::Exec(e) => e.start.startup().fatal().map(|(step, errno)| SetupFailed {
                step,
                errno,
                command: e.plan.command.display().to_string(),
            }),
            Child::Zygote { .. } => None,
        };
        let errored = self.phases.guest_error().is_some();
        // Kernel evidence for RLIMIT_FSIZE, looked for only when the guest failed.
        let file_at_limit = verdict::guest_failed(status_word, errored)
            && self
                .applied
                .file_at_limit(std::time::SystemTime::now() - self.started.elapsed())
                .is_some();
        let channel_error = match &self.child {
            Child::Exec(e) => match e.start.startup().error() {
                Some(err @ StartupError::Channel(_)) => Some(err.to_string()),
                _ => None,
            },
            Child::Zygote { .. } => None,
        };
        let facts = Facts {
            fatal,
            channel_error,
            wait_status: status_word,
            zygote_died,
            violation_enforced: enforced,
            timed_out: self.phases.timed_out(),
            protocol_error: self.phases.protocol_error(),
            output_exceeded: self.output_exceeded,
            notifications_exceeded: self.shared.budget.lock().unwrap().exceeded,
            call_cpu_exceeded: self.call_cpu_exceeded,
            // Killed by the session, or by the router for a violation.
            killed_by_supervisor: self.killed || self.shared.killed(),
            cpu_ms,
            // The kernel's CPU limit in a session is its whole life's (RLIMIT_CPU); a call's
            // own budget is measured here (`call_cpu_exceeded`).
            cpu_limit: self.server.policy.limits.session_cpu.map(|c| c.0),
            memory_limit: self.applied.memory,
            vm_peak: self.vm_peak,
            memory_refused: self.memory_refused,
            file_at_limit,
            errored,
            ending: Ending::Session(self.phases.end()),
            stopped: self.phases.failure().map(ToString::to_string),
            ..Facts::default()
        };
        // One lock, taken apart from the account: a struct literal keeps its temporaries.
        let (seed, clock) = {
            let det = self.shared.determinism.lock().unwrap();
            (det.seed, det.clock)
        };
        let account = Account {
            policy: self.server.policy.name.clone(),
            command: self.command.clone(),
            layers,
            violations: list,
            duration: self.started.elapsed(),
            max_rss_kb,
            guest_error: self.phases.guest_error().cloned(),
            seed,
            clock,
            ..Account::default()
        };
        assemble::report(&facts, account)
    }
}

/// Reads from a socket with SO_PASSCRED set: the bytes and the sender's pid (translated into
/// our PID namespace by the kernel).
fn recv_with_creds(fd: &OwnedFd, buf: &mut [u8]) -> Result<(usize, Option<libc::pid_t>), Errno> {
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
fn echo_stderr(lines: &[u8]) {
    if !lines.is_empty() {
        let _ = std::io::stderr().write_all(lines);
    }
}
