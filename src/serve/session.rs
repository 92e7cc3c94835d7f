//! One session of `wfjail serve`: a worker connection, one confined guest, many calls.
//!
//! The session thread runs a poll loop over the worker's connection, the guest's socket
//! (the guest protocol, docs/protocol.md), the guest's stdout and stderr (a pipe of the
//! session's own, echoed behind `[session N] ` and bounded by `limits.output`), and how the
//! guest can end: a zygote's EXITED report (woken through a pipe) or, in exec mode, the
//! pidfd — plus, in exec mode, the set-up channel and the guest's own seccomp listener.
//!
//! Against a hostile guest: each turn reads at most [`READ_TURN`] bytes per descriptor and
//! checks the deadline, every frame is charged to `limits.output`, the guest is not read
//! while answers to it or to the worker wait beyond [`PENDING_CAP`], and between calls the
//! guest is stopped (SIGSTOP after its answer, SIGCONT with the next call or at CLOSE), so
//! it runs no code the worker did not ask for.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{
    AddressFamily, ControlMessageOwned, MsgFlags, Shutdown, SockFlag, SockType, recvmsg,
    setsockopt, shutdown, socketpair, sockopt,
};
use serde_json::json;

use crate::plan::{self, Plan, PlanRequest};
use crate::policy::Dur;
use crate::process::channel::{self as chan, ChildMsg, Received};
use crate::protocol::guest::{self as gp, Conversation, Event, Outbox};
use crate::protocol::worker::{self, OpenRequest, Opened};
use crate::protocol::{Kind, MAX_FRAME, encode};
use crate::report::{GuestError, Report};
use crate::run::{Applied, LayersBase};
use crate::supervise::notify::{self, Handled};
use crate::supervise::paths::WriteGrants;
use crate::supervise::startup::{Next, Route, Startup, StartupError};
use crate::supervise::verdict::{self, Ending, Facts, SessionEnd, SetupFailed};
use crate::supervise::{
    LineEcho, VM_SAMPLE_AFTER_OUTPUT, VM_SAMPLE_EVERY, VM_SAMPLE_WAIT, escape_guest_text,
    level_name, poll_timeout, set_nonblocking,
};
use crate::sys::{self, NotifBuf, Reaped};

use super::zygote::{ChildExit, Zygote};
use super::{Server, SessionShared};

/// How long a worker has to send OPEN after connecting.
const OPEN_WAIT: Duration = Duration::from_secs(10);
/// The least time a guest gets to start (fork or exec, then HELLO).
const START_WAIT: Duration = Duration::from_secs(30);
/// How long a guest has to exit after its session was closed, before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(2);
/// The most read from one descriptor per turn of the loop (the run supervisor's bound), so
/// that a flooding guest (or worker) cannot keep the loop from checking its deadline.
const READ_TURN: usize = crate::supervise::READ_CHUNK;
/// Frames waiting to be written to the guest or to the worker, in bytes, above which the
/// session stops reading from the guest until they drain: a guest that asks (QUERY) and
/// never reads its answers, or a worker that does not read its results, cannot make the
/// supervisor buffer without end (the call's deadline ends the wait).
const PENDING_CAP: usize = 1 << 20;
/// How long a guest has to stop (SIGSTOP) after answering, before the session fails.
const STOP_WAIT: Duration = Duration::from_secs(2);

/// A frame of the worker wire: kind and payload.
type Frame = (u8, Vec<u8>);

/// The worker's side of the session.
struct Client {
    conn: UnixStream,
    dec: crate::protocol::Decoder,
    out: Vec<u8>,
    gone: bool,
}

impl Client {
    fn new(conn: UnixStream) -> Self {
        Client {
            conn,
            dec: worker::decoder(MAX_FRAME),
            out: Vec::new(),
            gone: false,
        }
    }

    fn send(&mut self, kind: u8, payload: &[u8]) {
        self.out.extend(worker::encode(kind, payload));
        self.flush();
    }

    /// Writes what the socket takes now.
    fn flush(&mut self) {
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
    fn send_last(&mut self, kind: u8, payload: &[u8]) {
        self.send(kind, payload);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.out.is_empty() && !self.gone && Instant::now() < deadline {
            let mut fds = [PollFd::new(self.conn.as_fd(), PollFlags::POLLOUT)];
            let _ = poll(&mut fds, PollTimeout::from(100u16));
            self.flush();
        }
    }

    /// Reads what is available (at most [`READ_TURN`] bytes); frames decoded, or the wire
    /// error.
    fn read(&mut self) -> Result<Vec<(u8, Vec<u8>)>, String> {
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
        loop {
            match self.dec.next_raw() {
                Ok(Some(f)) => frames.push(f),
                Ok(None) => break,
                Err(e) => return Err(format!("the worker sent a bad frame: {e}")),
            }
        }
        if self.gone {
            self.dec
                .finish()
                .map_err(|e| format!("the worker's connection ended inside a frame: {e}"))?;
        }
        Ok(frames)
    }
}

/// How the guest was started.
enum Child {
    Zygote {
        zygote: Arc<Zygote>,
        ns_pid: i32,
        /// Learned from the credentials on the guest's first message.
        pid: Option<libc::pid_t>,
        pidfd: Option<OwnedFd>,
    },
    Exec(Box<ExecChild>),
}

struct ExecChild {
    plan: Plan,
    base: LayersBase,
    pid: libc::pid_t,
    pidfd: Arc<OwnedFd>,
    chan: Option<OwnedFd>,
    listener: Option<OwnedFd>,
    buf: Option<NotifBuf>,
    grants: WriteGrants,
    startup: Startup,
    reaped: Option<Reaped>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for the guest's HELLO.
    Starting,
    Idle,
    Calling,
    /// The guest was told there is no further call; waiting for it to exit.
    Closing,
}

struct Session {
    id: u64,
    server: Arc<Server>,
    shared: Arc<SessionShared>,
    client: Client,
    guest: OwnedFd,
    /// The read end of the guest's stdout and stderr (a pipe of this session's own).
    output: Option<OwnedFd>,
    echo: LineEcho,
    /// Bytes of output and LOG frames so far, against `limits.output`.
    output_bytes: u64,
    output_exceeded: bool,
    /// The guest is stopped (SIGSTOP) between calls: it runs only while a call is in
    /// progress (or while it starts, or exits after CLOSE).
    stopped: bool,
    /// Each violation's count when the current call began: the violations of a call are the
    /// new ones and those counted again since.
    counts_at_call: Vec<u32>,
    /// Frames for the guest (HELLO, requests, answers), written as its socket takes them.
    guest_out: Outbox,
    guest_open: bool,
    conv: Conversation,
    child: Child,
    phase: Phase,
    pending: VecDeque<Vec<u8>>,
    close_requested: bool,
    deadline: Option<Instant>,
    timeout: Option<Duration>,
    started: Instant,
    timed_out: bool,
    protocol_error: Option<String>,
    guest_error: Option<GuestError>,
    failure: Option<String>,
    command: Vec<String>,
    calls: u64,
    /// The worker went away while a call (or the start) was in progress.
    abandoned: bool,
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
    let mut client = Client::new(conn);
    let (open, early) = match read_open(&mut client) {
        Ok(o) => o,
        Err(e) => {
            let report = failure_report(&server, vec![], e);
            client.send_last(worker::FAILED, report.to_json().as_bytes());
            return;
        }
    };
    let _slot = server.slots.acquire();
    let mut session = match Session::start(id, server.clone(), client, open) {
        Ok(s) => s,
        Err(failed) => {
            let (mut client, message, command) = *failed;
            let report = failure_report(&server, command, message);
            client.send_last(worker::FAILED, report.to_json().as_bytes());
            return;
        }
    };
    session.take_frames(early);
    // A worker that sent OPEN and left at once is not polled again: its end must be seen here.
    session.on_client_gone();
    session.event_loop();
    session.finish();
}

/// Answers a connection that cannot be served with FAILED and `why`, without reading it.
pub fn refuse(conn: UnixStream, server: &Server, why: String) {
    let _ = conn.set_nonblocking(true);
    let mut client = Client::new(conn);
    let report = failure_report(server, vec![], why);
    client.send_last(worker::FAILED, report.to_json().as_bytes());
}

/// Reads the OPEN frame (bounded wait).
/// Returns the request and any frames the worker sent right behind it (calls it pipelined).
fn read_open(client: &mut Client) -> Result<(OpenRequest, Vec<Frame>), String> {
    client
        .conn
        .set_nonblocking(true)
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + OPEN_WAIT;
    loop {
        let mut frames = client.read()?.into_iter();
        if let Some((kind, payload)) = frames.next() {
            if kind != worker::OPEN {
                return Err(format!(
                    "expected OPEN as the first frame, got {}",
                    worker::name(kind)
                ));
            }
            let open = serde_json::from_slice(&payload)
                .map_err(|e| format!("OPEN is not a valid session request: {e}"))?;
            return Ok((open, frames.collect()));
        }
        if client.gone {
            return Err("the worker closed the connection before OPEN".into());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("no OPEN within {}s", OPEN_WAIT.as_secs()));
        }
        let mut fds = [PollFd::new(client.conn.as_fd(), PollFlags::POLLIN)];
        let _ = poll(&mut fds, poll_timeout(left));
    }
}

/// A report for a session that never got a guest.
fn failure_report(server: &Server, command: Vec<String>, message: String) -> Report {
    Report::launch_error(&server.policy.name, &command, message, 125)
}

type StartError = Box<(Client, String, Vec<String>)>;

impl Session {
    fn start(
        id: u64,
        server: Arc<Server>,
        client: Client,
        open: OpenRequest,
    ) -> Result<Session, StartError> {
        let timeout = match open.timeout.as_deref().map(Dur::parse) {
            Some(Ok(d)) => Some(d.0),
            Some(Err(e)) => return Err(Box::new((client, format!("OPEN timeout: {e}"), vec![]))),
            None => server.timeout,
        };
        let shared = match SessionShared::new(id, server.echo) {
            Ok(s) => s,
            Err(e) => return Err(Box::new((client, format!("pipe: {e}"), vec![]))),
        };
        // The guest's stdout and stderr: a pipe of this session's own, so that one guest cannot
        // block (O_NONBLOCK), flood or read another's.
        let (out_r, out_w) = match nix::unistd::pipe2(OFlag::O_CLOEXEC) {
            Ok(p) => p,
            Err(e) => return Err(Box::new((client, format!("output pipe: {e}"), vec![]))),
        };
        let (ours, theirs) = match socketpair(
            AddressFamily::Unix,
            SockType::Stream,
            None,
            SockFlag::SOCK_CLOEXEC,
        ) {
            Ok(p) => p,
            Err(e) => return Err(Box::new((client, format!("session socket: {e}"), vec![]))),
        };
        let (child, command, applied) = match (&server.pool, open) {
            (
                Some(pool),
                OpenRequest {
                    handler: Some(handler),
                    argv: None,
                    ..
                },
            ) => {
                let command = vec![handler.clone()];
                if let Err(e) = setsockopt(&ours, sockopt::PassCred, &true) {
                    return Err(Box::new((client, format!("SO_PASSCRED: {e}"), command)));
                }
                let Some(zygote) = pool.pick() else {
                    return Err(Box::new((
                        client,
                        "no zygote is running (restarting?)".into(),
                        command,
                    )));
                };
                match zygote.fork(shared.clone(), &handler, theirs, out_w) {
                    Ok(ns_pid) => {
                        let applied = zygote.applied.clone();
                        let child = Child::Zygote {
                            zygote,
                            ns_pid,
                            pid: None,
                            pidfd: None,
                        };
                        (child, command, applied)
                    }
                    Err(e) => return Err(Box::new((client, format!("zygote fork: {e}"), command))),
                }
            }
            (
                None,
                OpenRequest {
                    argv: Some(argv),
                    handler: None,
                    ..
                },
            ) => match start_exec(&server, &argv, theirs, out_w) {
                Ok(c) => {
                    server.children.lock().unwrap().insert(id, c.pidfd.clone());
                    let applied = Applied::of(&c.plan);
                    (Child::Exec(Box::new(c)), argv, applied)
                }
                Err(e) => return Err(Box::new((client, e, argv))),
            },
            (Some(_), _) => {
                let why = "this server runs in zygote mode: open a session with {\"handler\": \"module:function\"}";
                return Err(Box::new((client, why.into(), vec![])));
            }
            (None, _) => {
                let why = "this server runs in exec mode: open a session with {\"argv\": [\"/path/to/guest\", ...]} \
                           (or start it with --zygote)";
                return Err(Box::new((client, why.into(), vec![])));
            }
        };
        let conv = Conversation::new(MAX_FRAME);
        // The read gate (`reading_guest`) keeps it near PENDING_CAP; the bound is a backstop
        // above what one more request or answer can add.
        let mut guest_out = Outbox::new(PENDING_CAP + MAX_FRAME + gp::MAX_ANSWER);
        let _ = guest_out.push(&encode(Kind::Hello, &gp::hello(gp::VERSION)));
        set_nonblocking(&ours);
        set_nonblocking(&out_r);
        let started = Instant::now();
        Ok(Session {
            id,
            server,
            shared,
            client,
            guest: ours,
            output: Some(out_r),
            echo: LineEcho::new(format!("[session {id}] ")),
            output_bytes: 0,
            output_exceeded: false,
            stopped: false,
            counts_at_call: Vec::new(),
            guest_out,
            guest_open: true,
            conv,
            child,
            phase: Phase::Starting,
            pending: VecDeque::new(),
            close_requested: false,
            // Starting: the guest has the call timeout (at least START_WAIT) to say HELLO.
            deadline: Some(started + timeout.unwrap_or(START_WAIT).max(START_WAIT)),
            timeout,
            started,
            timed_out: false,
            protocol_error: None,
            guest_error: None,
            failure: None,
            command,
            calls: 0,
            abandoned: false,
            applied,
            killed: false,
            vm_peak: None,
            memory_refused: false,
            last_sample: None,
            output_since_sample: false,
        })
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
    fn guest_process(&self) -> Option<(libc::pid_t, std::os::fd::BorrowedFd<'_>)> {
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
            && e.chan.is_some()
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

    /// Stops the guest after it answered, so that it runs no code between calls (a guest
    /// could answer and go on working, from code after its reply or a signal handler), and
    /// waits until the kernel shows it stopped. SIGSTOP cannot be caught or ignored, and as
    /// it comes from an ancestor PID namespace it stops a guest that is PID 1 too.
    fn stop_guest(&mut self) {
        if self.stopped || self.ended() {
            return;
        }
        let Some((pid, pidfd)) = self.guest_process() else {
            return self.fail("the guest answered before its pid was known".into());
        };
        if sys::pidfd_send_signal(pidfd, libc::SIGSTOP).is_err() {
            return; // it is gone: its exit is on the way
        }
        self.stopped = true;
        let until = Instant::now() + STOP_WAIT;
        loop {
            match proc_state(pid) {
                Some(b'T' | b't' | b'Z' | b'X') | None => return,
                Some(_) if Instant::now() >= until => {
                    return self.fail(format!(
                        "the guest did not stop within {}s after answering",
                        STOP_WAIT.as_secs()
                    ));
                }
                Some(_) => std::thread::sleep(Duration::from_micros(50)),
            }
        }
    }

    /// Lets a stopped guest run again (a call begins, or it is to exit).
    fn resume_guest(&mut self) {
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

    /// The guest answered (HELLO, RESULT, ERROR): stop it unless a call is waiting.
    fn guest_idle(&mut self) {
        if self.pending.is_empty() && !self.close_requested {
            self.stop_guest();
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

    /// Charges `n` bytes against `limits.output`; over it, the guest is killed. Returns
    /// whether the limit is exceeded.
    fn charge_output(&mut self, n: u64) -> bool {
        self.output_bytes = self.output_bytes.saturating_add(n);
        if !self.output_exceeded && self.output_bytes > self.server.policy.limits.output.0 {
            self.output_exceeded = true;
            echo_stderr(&self.echo.finish());
            self.fail(format!(
                "the guest's output and logs exceeded limits.output ({} bytes)",
                self.server.policy.limits.output.0
            ));
        }
        self.output_exceeded
    }

    /// Whether the guest is read from now: not while answers to it or to the worker wait
    /// beyond [`PENDING_CAP`].
    fn reading_guest(&self) -> bool {
        self.guest_out.len() < PENDING_CAP && self.client.out.len() < PENDING_CAP
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

    /// Issues the next queued call if the guest is idle; closes it if asked and nothing is left.
    fn advance(&mut self) {
        if self.phase != Phase::Idle {
            return;
        }
        if let Some(request) = self.pending.pop_front() {
            if let Err(e) = self.guest_out.push(&encode(Kind::Request, &request)) {
                return self.fail(e.to_string());
            }
            self.conv.begin_call();
            self.counts_at_call = self
                .shared
                .violations
                .lock()
                .unwrap()
                .list
                .iter()
                .map(|v| v.count)
                .collect();
            self.resume_guest();
            self.phase = Phase::Calling;
            self.calls += 1;
            self.deadline = self.timeout.map(|t| Instant::now() + t);
            self.flush_guest();
        } else if self.close_requested {
            // End-of-file on its input tells the guest there is no further call.
            self.resume_guest();
            let _ = shutdown(self.guest.as_raw_fd(), Shutdown::Write);
            self.phase = Phase::Closing;
            self.deadline = Some(Instant::now() + EXIT_GRACE);
        }
    }

    fn fail(&mut self, why: String) {
        if self.failure.is_none() {
            self.failure = Some(why);
        }
        self.kill();
    }

    /// Queues the worker's frames: calls (issued one at a time) and CLOSE.
    fn take_frames(&mut self, frames: Vec<Frame>) {
        for (kind, payload) in frames {
            match kind {
                worker::CALL => self.pending.push_back(payload),
                worker::CLOSE => self.close_requested = true,
                k => {
                    return self.fail(format!(
                        "unexpected {} frame from the worker",
                        worker::name(k)
                    ));
                }
            }
        }
    }

    fn on_client(&mut self) {
        let frames = match self.client.read() {
            Ok(f) => f,
            Err(e) => return self.fail(e),
        };
        self.take_frames(frames);
        self.on_client_gone();
        self.advance();
    }

    /// When the worker went away: end the guest too, and give a call nobody waits for the
    /// grace period, not the call timeout.
    fn on_client_gone(&mut self) {
        if !self.client.gone {
            return;
        }
        self.close_requested = true;
        if matches!(self.phase, Phase::Starting | Phase::Calling) && !self.abandoned {
            self.abandoned = true;
            let grace = Instant::now() + EXIT_GRACE;
            self.deadline = Some(self.deadline.map_or(grace, |d| d.min(grace)));
        }
    }

    /// Reads the guest's frames: at most [`READ_TURN`] bytes, or (`drain`, after it ended)
    /// what is left.
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
            // A guest already being killed (a limit, a timeout) may stop inside a frame:
            // that is not a protocol error of its own.
            Err(_) if self.failure.is_some() => return,
            Err(e) => {
                self.protocol_error = Some(e.0.clone());
                return self.fail(e.to_string());
            }
        };
        for ev in events {
            match ev {
                Event::Hello => {
                    self.phase = Phase::Idle;
                    self.deadline = None;
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
                    self.guest_idle();
                    self.client.send(worker::OPENED, &doc);
                }
                Event::Log { level, text } => {
                    if self.server.echo {
                        // Escaped: a guest's text cannot start a line of its own.
                        eprintln!(
                            "[session {}] log ({}): {}",
                            self.id,
                            level_name(level),
                            escape_guest_text(text.as_bytes())
                        );
                    }
                }
                Event::Query => {
                    let list = self.shared.violations.lock().unwrap().take_since_query();
                    if let Err(e) = self.guest_out.push(&gp::violations_frame(&list, MAX_FRAME)) {
                        self.protocol_error = Some(e.to_string());
                        return self.fail(e.to_string());
                    }
                    self.flush_guest();
                }
                Event::Result(bytes) => {
                    self.phase = Phase::Idle;
                    self.deadline = None;
                    self.guest_idle();
                    self.client.send(worker::RESULT, &bytes);
                }
                Event::Error(e) => {
                    if self.phase == Phase::Starting {
                        // The guest could not start (no such handler, wrong version).
                        self.guest_error = Some(e.clone());
                        return self.fail(format!(
                            "the guest could not start: {}: {}",
                            e.kind, e.message
                        ));
                    }
                    // The call failed: what a limit would need to explain it, read while
                    // the guest is still there.
                    self.sample_memory(true);
                    self.phase = Phase::Idle;
                    self.deadline = None;
                    self.guest_idle();
                    // The violations of this call only: a guest's ERROR typed
                    // `wfjail.Violation` cannot borrow one from an earlier call.
                    let during: Vec<_> = {
                        let v = self.shared.violations.lock().unwrap();
                        v.list
                            .iter()
                            .enumerate()
                            .filter(|(i, v)| {
                                self.counts_at_call.get(*i).is_none_or(|&c| v.count > c)
                            })
                            .map(|(_, v)| v.clone())
                            .collect()
                    };
                    let doc = json!({
                        "type": e.kind, "message": e.message, "traceback": e.traceback,
                        "violations": during,
                    });
                    self.guest_error = Some(e);
                    self.client.send(worker::ERROR, doc.to_string().as_bytes());
                }
            }
        }
        self.advance();
    }

    /// Exec mode: set-up records until end-of-file (the exec happened); a child that breaks
    /// the set-up protocol is killed (supervise/startup.rs).
    fn on_chan(&mut self) {
        let Child::Exec(e) = &mut self.child else {
            return;
        };
        let Some(c) = &e.chan else { return };
        match chan::recv(c) {
            Ok(Ok(Received::Msg(msg, fd))) => {
                if msg == ChildMsg::Listener {
                    e.buf = NotifBuf::new().ok();
                    e.listener = fd;
                }
                e.startup.record(Ok(msg));
            }
            Ok(Ok(Received::Eof)) => {
                e.startup.eof();
                e.chan = None;
            }
            Ok(Err(err)) => {
                e.chan = None;
                if e.startup.record(Err(err)) == Next::Kill {
                    let _ = sys::pidfd_send_signal(e.pidfd.as_fd(), libc::SIGKILL);
                    self.killed = true;
                }
            }
            Err(err)
                if err.raw_os_error() == Some(libc::EINTR)
                    || err.raw_os_error() == Some(libc::EAGAIN) => {}
            Err(_) => e.chan = None,
        }
    }

    /// Exec mode: the guest's own seccomp notifications.
    fn on_listener(&mut self, rev: PollFlags) {
        let Child::Exec(e) = &mut self.child else {
            return;
        };
        if !rev.contains(PollFlags::POLLIN) {
            e.listener = None;
            return;
        }
        let (Some(l), Some(b)) = (&e.listener, e.buf.as_mut()) else {
            return;
        };
        let Some(n) = notify::receive(l.as_fd(), b) else {
            return;
        };
        match e
            .startup
            .notification(crate::supervise::is_initial_exec(&n, e.pid))
        {
            Route::AllowExec => return notify::allow(l.as_fd(), &n),
            Route::Refuse => return notify::refuse(l.as_fd(), &n, libc::EPERM),
            // Exec-mode sessions take no step between the exec's stop and its start.
            Route::HoldExec => return,
            Route::Guest => {}
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
        let pidfd = e.pidfd.clone();
        let mut v = self.shared.violations.lock().unwrap();
        let state = notify::State {
            violations: &mut v,
            entropy: None,
        };
        let rules = notify::Rules::new(&e.plan, &e.grants);
        let handled = notify::handle(l.as_fd(), &n, rules, state, || {
            let _ = sys::pidfd_send_signal(pidfd.as_fd(), libc::SIGKILL);
        });
        drop(v);
        if handled == Handled::Killed {
            self.shared.mark_killed();
        }
    }

    fn event_loop(&mut self) {
        self.flush_guest();
        while !self.ended() {
            // Poll set: 0 worker, 1 guest, 2 wake/pidfd, 3 chan, 4 listener, 5 guest output.
            let mut fds: Vec<PollFd> = Vec::with_capacity(6);
            let mut which: Vec<u8> = Vec::with_capacity(6);
            let client_flags = if self.client.out.is_empty() {
                PollFlags::POLLIN
            } else {
                PollFlags::POLLIN | PollFlags::POLLOUT
            };
            if !self.client.gone {
                fds.push(PollFd::new(self.client.conn.as_fd(), client_flags));
                which.push(0);
            }
            if self.guest_open {
                let mut flags = PollFlags::empty();
                if self.reading_guest() {
                    flags |= PollFlags::POLLIN;
                }
                if !self.guest_out.is_empty() {
                    flags |= PollFlags::POLLOUT;
                }
                fds.push(PollFd::new(self.guest.as_fd(), flags));
                which.push(1);
            }
            if let Some(o) = &self.output {
                fds.push(PollFd::new(o.as_fd(), PollFlags::POLLIN));
                which.push(5);
            }
            match &self.child {
                Child::Zygote { .. } => {
                    fds.push(PollFd::new(self.shared.wake_r.as_fd(), PollFlags::POLLIN));
                    which.push(2);
                }
                Child::Exec(e) => {
                    fds.push(PollFd::new(e.pidfd.as_fd(), PollFlags::POLLIN));
                    which.push(2);
                    if let Some(c) = &e.chan {
                        fds.push(PollFd::new(c.as_fd(), PollFlags::POLLIN));
                        which.push(3);
                    }
                    if let Some(l) = &e.listener {
                        fds.push(PollFd::new(l.as_fd(), PollFlags::POLLIN));
                        which.push(4);
                    }
                }
            }
            let mut wait = self
                .deadline
                .map(|d| d.saturating_duration_since(Instant::now()));
            if self.sampling() {
                wait = Some(wait.map_or(VM_SAMPLE_WAIT, |w| w.min(VM_SAMPLE_WAIT)));
            }
            let wait = wait.map_or(PollTimeout::NONE, poll_timeout);
            match poll(&mut fds, wait) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(_) => break,
            }
            let ready: Vec<(u8, PollFlags)> = which
                .iter()
                .zip(fds.iter())
                .map(|(&w, f)| (w, f.revents().unwrap_or(PollFlags::empty())))
                .filter(|(_, r)| !r.is_empty())
                .collect();
            drop(fds);
            if self.sampling() {
                self.sample_memory(false);
            }
            // Checked on every turn, ready descriptors or not: a flooding guest keeps some
            // descriptor ready all the time.
            if let Some(d) = self.deadline
                && Instant::now() >= d
            {
                self.deadline = None;
                match self.phase {
                    Phase::Closing => self.kill(), // did not exit after its input ended
                    _ if self.abandoned => {
                        self.fail("the worker closed the session during a call".into())
                    }
                    Phase::Starting => self.fail("the guest did not say HELLO in time".into()),
                    _ => {
                        self.timed_out = true;
                        self.fail(format!(
                            "the call took longer than {}",
                            Dur(self.timeout.unwrap_or_default())
                        ));
                    }
                }
            }
            for (w, rev) in ready {
                match w {
                    0 => {
                        if rev.contains(PollFlags::POLLOUT) {
                            self.client.flush();
                        }
                        if rev
                            .intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR)
                        {
                            self.on_client();
                        }
                    }
                    1 => {
                        if rev.contains(PollFlags::POLLOUT) {
                            self.flush_guest();
                        }
                        if rev
                            .intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR)
                            && self.reading_guest()
                        {
                            self.on_guest(false);
                        }
                    }
                    2 => match &mut self.child {
                        Child::Zygote { .. } => {
                            let mut b = [0u8; 8];
                            let _ = nix::unistd::read(&self.shared.wake_r, &mut b);
                        }
                        Child::Exec(e) => {
                            if e.reaped.is_none() {
                                e.reaped = sys::wait4(e.pid).ok();
                            }
                        }
                    },
                    3 => self.on_chan(),
                    4 => self.on_listener(rev),
                    5 => self.on_output(false),
                    _ => {}
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
        // CLOSED answers CLOSE (whatever was denied along the way); FAILED is any other end.
        let kind = if self.failure.is_none() && self.phase == Phase::Closing {
            worker::CLOSED
        } else {
            worker::FAILED
        };
        if !self.client.gone {
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
                let layers = crate::run::layers(
                    &e.plan,
                    &e.base,
                    e.startup.degraded(),
                    e.listener.is_some() || e.startup.has_listener(),
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
            Child::Exec(e) => e.startup.fatal().map(|(step, errno)| SetupFailed {
                step,
                errno,
                command: e.plan.command.display().to_string(),
            }),
            Child::Zygote { .. } => None,
        };
        let errored = self.guest_error.is_some();
        // Kernel evidence for RLIMIT_FSIZE, looked for only when the guest failed.
        let file_at_limit = verdict::guest_failed(status_word, errored)
            && self
                .applied
                .file_at_limit(std::time::SystemTime::now() - self.started.elapsed())
                .is_some();
        let end = if errored && self.phase == Phase::Starting {
            SessionEnd::RefusedStart
        } else if self.phase == Phase::Closing {
            SessionEnd::Closed
        } else {
            SessionEnd::EndedEarly
        };
        let channel_error = match &self.child {
            Child::Exec(e) => match e.startup.error() {
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
            timed_out: self.timed_out,
            protocol_error: self.protocol_error.is_some(),
            output_exceeded: self.output_exceeded,
            // Killed by the session, or by the router for a violation.
            killed_by_supervisor: self.killed || self.shared.killed(),
            cpu_ms,
            cpu_limit: self.server.policy.limits.cpu.map(|c| c.0),
            memory_limit: self.applied.memory,
            vm_peak: self.vm_peak,
            memory_refused: self.memory_refused,
            file_at_limit,
            errored,
            ending: Ending::Session(end),
            stopped: self.failure.clone(),
            ..Facts::default()
        };
        let v = verdict::classify(&facts);
        let signal = status_word
            .filter(|&st| libc::WIFSIGNALED(st))
            .map(|st| crate::report::signal_name(libc::WTERMSIG(st)));
        Report {
            status: v.status,
            exit_code: status_word
                .filter(|&st| libc::WIFEXITED(st))
                .map(|st| libc::WEXITSTATUS(st)),
            signal,
            violations: list,
            duration_ms: self.started.elapsed().as_secs_f64() * 1000.0,
            cpu_ms,
            max_rss_kb,
            policy: self.server.policy.name.clone(),
            layers,
            stderr_tail: String::new(),
            limit: v.limit.map(|l| l.as_str().to_string()),
            error: v.error,
            guest_error: self.guest_error.clone(),
            command: self.command.clone(),
            seed: None,
            skipped_paths: vec![],
            exit_status: v.exit_status,
        }
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

/// Exec mode: plans and spawns the session's guest with the session socket on fds 3 and 4.
fn start_exec(
    server: &Server,
    argv: &[String],
    theirs: OwnedFd,
    log: OwnedFd,
) -> Result<ExecChild, String> {
    let policy = &server.policy;
    let req = PlanRequest {
        argv: argv.to_vec(),
        grants: server.grants.clone(),
        extra_env: crate::run::protocol_env(policy),
        zygote: false,
    };
    let plan = plan::build(policy, &req).map_err(|e| e.to_string())?;
    let null = std::fs::File::open("/dev/null").map_err(|e| format!("/dev/null: {e}"))?;
    let targets = [
        (null.as_raw_fd(), 0),
        (log.as_raw_fd(), 1),
        (log.as_raw_fd(), 2),
        (theirs.as_raw_fd(), 3),
        (theirs.as_raw_fd(), 4),
    ];
    let spawned = crate::process::spawn(&plan, &targets).map_err(|e| e.to_string())?;
    drop((null, theirs, log));
    let base = LayersBase::of(&spawned);
    set_nonblocking(&spawned.chan);
    let grants = WriteGrants::new(&plan.write);
    Ok(ExecChild {
        base,
        pid: spawned.pid,
        pidfd: Arc::new(spawned.pidfd),
        chan: Some(spawned.chan),
        listener: None,
        buf: None,
        grants,
        startup: Startup::new(),
        reaped: None,
        plan,
    })
}

/// Writes echoed guest lines to wfjail's stderr.
fn echo_stderr(lines: &[u8]) {
    if !lines.is_empty() {
        let _ = std::io::stderr().write_all(lines);
    }
}
