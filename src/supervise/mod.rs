//! The parent while the guest runs: set-up records, seccomp notifications, the guest's output
//! (bounded), the protocol conversation, the wall-clock timeout, and the exit. One `poll`
//! loop, no threads.
//!
//! Whatever the guest sends, the supervisor's own memory and time stay bounded: each
//! iteration reads at most [`READ_CHUNK`] bytes per descriptor and then checks the deadline;
//! what it holds for the guest (the frame decoder, the outbox of answers, the echo's line
//! buffers, the stderr tail, the violations list) each has a bound; every frame from the
//! guest is charged to `limits.output`.

pub mod assemble;
pub mod disk;
pub mod guest;
pub mod memory_evidence;
pub mod output;
pub mod startup;
pub mod verdict;

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use crate::answers::{entropy, monotonic, vdso, workflow_time};
use crate::notify;
use crate::notify::violations::Violations;
use crate::policy::Policy;
use crate::process::Spawned;
use crate::process::channel::Step;
use crate::protocol::guest::{self as gp, Conversation, Event, Outbox};
use crate::report::{GuestError, Violation};
use crate::sys::{self, Reaped};
use memory_evidence::MemoryEvidence;
use output::OutputMeter;
use startup::StartupError;

use crate::echo::{GUEST_PREFIX, LineEcho};

/// How long to keep reading the guest's output after it exited (descendants that escaped a
/// missing PID namespace may hold the pipes open).
const DRAIN_GRACE: Duration = Duration::from_millis(500);
/// Bytes of stderr kept for the report.
pub const STDERR_TAIL: usize = 4096;
/// The most read from one descriptor in one iteration of the loop.
pub const READ_CHUNK: usize = 64 * 1024;
/// How often the guest's peak address space is sampled while it runs (limits.memory set).
pub const VM_SAMPLE_EVERY: Duration = Duration::from_millis(10);
/// How soon after the previous sample the guest is sampled again when it wrote output.
pub const VM_SAMPLE_AFTER_OUTPUT: Duration = Duration::from_millis(1);
/// The poll timeout while sampling, so that an idle guest is still sampled.
pub const VM_SAMPLE_WAIT: Duration = Duration::from_millis(25);

/// Where the guest's output goes.
pub struct Sinks<'a> {
    /// The result (raw mode): the guest's stdout, byte for byte. Ignored in framed mode,
    /// where the guest's stdout is a log echoed with its stderr.
    pub stdout: Option<&'a mut dyn Write>,
    /// Echo the guest's stderr (and, framed, its stdout and LOG frames) live here, each
    /// line behind [`GUEST_PREFIX`] and escaped.
    pub stderr: Option<&'a mut dyn Write>,
    /// Print a one-line summary of each new violation on stderr.
    pub violations: bool,
}

/// Supervision settings.
pub struct Config {
    pub timeout: Option<Duration>,
    pub output_limit: u64,
    /// `limits.memory` (RLIMIT_AS): the guest's peak address space is sampled as evidence.
    pub memory_limit: Option<u64>,
    /// SIGTERM, SIGINT and SIGHUP to wfjail, blocked and read here: the guest is killed and
    /// the report says the run was interrupted (instead of wfjail dying without one).
    pub stop_signals: Option<SignalFd>,
    /// The execution's seed under `[random] getrandom = "seeded"` (`--seed`, else 0).
    pub seed: Option<u64>,
    /// The workflow time under `[time] clock = "virtual"` (`--clock`, else the host's time
    /// when the run starts), in nanoseconds since the epoch.
    pub clock: Option<i64>,
    /// What to patch in the guest's vDSO at its exec stop (`vdso.rs`).
    pub vdso: Option<vdso::Patch>,
    /// `limits.disk`: the guest's account, its baseline taken before it started.
    pub disk: Option<std::cell::RefCell<disk::DiskAccount>>,
}

/// Blocks SIGTERM, SIGINT and SIGHUP in this thread (and the threads it starts later) and
/// returns a descriptor that reads them; `None` if that fails (they then end wfjail as before,
/// and the guest dies with it by its parent-death signal). The guest's mask is reset before
/// its exec.
pub fn block_stop_signals() -> Option<SignalFd> {
    let mut mask = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        mask.add(s);
    }
    mask.thread_block().ok()?;
    SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK).ok()
}

/// The guest's pipes, parent ends.
pub struct GuestPipes {
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    /// The protocol pipes and the request, in framed mode.
    pub protocol: Option<ProtocolPipes>,
}

/// Parent ends of the protocol pipes (docs/protocol.md).
pub struct ProtocolPipes {
    /// Written by us, read by the guest on its fd 3.
    pub to_guest: OwnedFd,
    /// Written by the guest on its fd 4.
    pub from_guest: OwnedFd,
    pub request: Vec<u8>,
    /// The largest payload accepted from the guest.
    pub cap: usize,
}

/// What happened, before classification into a report.
#[derive(Debug, Default)]
pub struct Outcome {
    pub reaped: Option<Reaped>,
    /// wfjail was asked to stop by this signal while the guest ran (the guest was killed).
    pub interrupted: Option<i32>,
    pub duration: Duration,
    pub timed_out: bool,
    pub output_exceeded: bool,
    /// The guest added more than `limits.disk` under its write grants (wfjail killed it).
    pub disk_exceeded: bool,
    /// Why `limits.disk` could not judge, when that was why the guest was stopped.
    pub disk_error: Option<String>,
    /// The guest asked for more answers than its budget (`notify::Budget`): wfjail killed it.
    pub notifications_exceeded: bool,
    /// A required step failed in the child (no guest ran).
    pub fatal: Option<(Step, Errno)>,
    /// Best-effort steps that failed.
    pub degraded: Vec<(Step, Errno)>,
    /// A seccomp listener was received: violations are named.
    pub notify: bool,
    /// The set-up channel reached end-of-file without a fatal record: exec succeeded.
    pub exec_confirmed: bool,
    pub violations: Vec<Violation>,
    pub killed_for_violation: bool,
    pub stderr_tail: Vec<u8>,
    /// The seed the guest's `getrandom` was answered from (`getrandom = "seeded"`).
    pub seed: Option<u64>,
    /// The workflow time the guest's wall clock read (`clock = "virtual"`).
    pub clock: Option<i64>,
    /// `wfjail learn`: every violation, in order, up to `notify::MAX_LEARNED` (and
    /// `notify::MAX_LEARNED_BYTES` of arguments, counted in `learned_bytes`).
    pub learned: Vec<Violation>,
    pub learned_bytes: usize,
    /// A malformed set-up record (a bug or a hostile child).
    pub channel_error: Option<String>,
    /// Framed mode: the result payload, the guest's error, or what broke the conversation.
    pub result: Option<Vec<u8>>,
    pub guest_error: Option<GuestError>,
    pub protocol_error: Option<String>,
    /// Framed mode was used (the report then expects a RESULT or an ERROR).
    pub framed: bool,
    /// The largest `VmPeak` (bytes) read from the guest's /proc status while it ran
    /// (sampled when `limits.memory` is set): kernel evidence for the memory limit.
    pub vm_peak: Option<u64>,
    /// A file under the write grants at exactly the file-size limit (set by the caller
    /// after the run): kernel evidence for RLIMIT_FSIZE.
    pub file_at_limit: Option<String>,
    /// An `mmap`/`mremap` that asked for more address space (bytes) than RLIMIT_AS left:
    /// kernel evidence for the memory limit, when the filter routes large mappings here.
    pub memory_refused: Option<u64>,
}

impl Outcome {
    /// Whether wfjail itself stopped the guest (deadline, violation, output bound, broken
    /// protocol or set-up channel, or wfjail's own stop signal): a SIGKILL it did not send is
    /// the kernel's (a CPU limit).
    pub fn killed_by_supervisor(&self) -> bool {
        self.timed_out
            || self.killed_for_violation
            || self.output_exceeded
            || self.protocol_error.is_some()
            || self.interrupted.is_some()
            || self.channel_error.is_some()
    }
}

/// Sets `O_NONBLOCK` on `fd`, keeping its other status flags.
pub fn set_nonblocking(fd: &OwnedFd) {
    if let Ok(flags) = fcntl(fd, FcntlArg::F_GETFL) {
        let flags = OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK;
        let _ = fcntl(fd, FcntlArg::F_SETFL(flags));
    }
}

/// A `poll` timeout of `wait`, rounded down to milliseconds and capped at poll's maximum.
pub fn poll_timeout(wait: Duration) -> PollTimeout {
    let ms = wait.as_millis().min(i32::MAX as u128) as i32;
    PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)
}

/// Reads once from `fd` into `buf` (at most its length: the caller's bound per iteration);
/// returns the bytes read and false at end-of-file. The loop polls again for more, so a
/// guest that writes without pause cannot keep the supervisor here.
fn read_some<'b>(fd: &OwnedFd, buf: &'b mut [u8]) -> (&'b [u8], bool) {
    loop {
        match nix::unistd::read(fd, buf) {
            Ok(0) => return (&[], false),
            Ok(n) => return (&buf[..n], true),
            Err(Errno::EINTR) => continue,
            Err(Errno::EAGAIN) => return (&[], true),
            Err(_) => return (&[], false),
        }
    }
}

/// The framed-mode state: our outgoing bytes and the guest's conversation.
struct Framed {
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
    /// Writes what the pipe takes now.
    fn flush(&mut self) {
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
}

/// Adds `fd` (if present) to the poll set, remembering what it is.
fn add<'a>(
    fds: &mut Vec<PollFd<'a>>,
    srcs: &mut Vec<Src>,
    fd: Option<&'a OwnedFd>,
    flags: PollFlags,
    src: Src,
) {
    if let Some(fd) = fd {
        fds.push(PollFd::new(fd.as_fd(), flags));
        srcs.push(src);
    }
}

/// Poll-set entries, by what they are.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Src {
    Guest(guest::Token),
    Stdout,
    Stderr,
    FromGuest,
    ToGuest,
    StopSignal,
}

impl From<guest::Token> for Src {
    fn from(t: guest::Token) -> Self {
        Src::Guest(t)
    }
}

/// `limits.disk` after the guest is gone: what it left under its write grants. Run again by
/// `wfjail run` once the guest's pids cgroup is emptied: without a PID namespace, a process
/// the guest started outlives it until then, and can write after the check at its exit.
pub fn disk_at_end(cfg: &Config, o: &mut Outcome) {
    if let Some(acct) = &cfg.disk
        && !o.disk_exceeded
        && acct.borrow_mut().over_at_end()
    {
        o.disk_exceeded = true;
        o.disk_error = acct
            .borrow()
            .cannot_judge
            .as_ref()
            .map(|e| format!("limits.disk: {e}"));
    }
}

/// Supervises `child` until it exits (and its output is drained), its notifications judged
/// by `judge` (`learn`: every violation is kept in `Outcome::learned` too).
pub fn supervise(
    child: Spawned,
    pipes: GuestPipes,
    policy: &Policy,
    cfg: &Config,
    judge: guest::Judge,
    sinks: Sinks<'_>,
) -> Outcome {
    let Sinks {
        stdout: mut out_sink,
        stderr: mut err_sink,
        violations: echo,
    } = sinks;
    let mut o = Outcome {
        framed: pipes.protocol.is_some(),
        ..Outcome::default()
    };
    if o.framed {
        out_sink = None; // framed, stdout is a log: echoed with stderr below
    }
    if crate::policy::rules::getrandom::answered(policy) {
        o.seed = Some(cfg.seed.unwrap_or(0));
    }
    if crate::policy::rules::clock::answered(policy) {
        o.clock = Some(cfg.clock.unwrap_or_else(workflow_time::host_now));
    }
    let learn = judge.late_reads;
    let answers = guest::Answers {
        violations: Violations::new(echo.then(String::new)),
        budget: notify::Budget::default(),
        entropy: o.seed.map(entropy::Entropy::new),
        clock: o.clock,
        monotonic: monotonic::Monotonic::default(),
        learned: learn.then(|| (Vec::new(), 0)),
    };
    // The start-up (set-up channel, the initial exec), then the guest's notifications.
    let pid = child.pid;
    let mut sup = guest::Supervisor::new(
        pid,
        std::sync::Arc::new(child.pidfd),
        child.chan,
        cfg.vdso.map(|p| p.seeded(cfg.seed)),
        judge,
        answers,
        MemoryEvidence::for_policy(cfg.memory_limit, policy),
    );
    let mut stdout = Some(pipes.stdout);
    let mut stderr = Some(pipes.stderr);
    let mut framed = pipes.protocol.map(|p| Framed {
        outbox: Outbox::with_opening(gp::opening(&p.request)),
        to_guest: Some(p.to_guest),
        from_guest: Some(p.from_guest),
        close_when_flushed: false,
        conv: {
            let mut c = Conversation::new(p.cap);
            c.begin_call(); // the request goes out with HELLO
            c
        },
        cap: p.cap,
    });
    for fd in [&stdout, &stderr].into_iter().flatten() {
        set_nonblocking(fd);
    }
    if let Some(f) = framed.as_mut() {
        for fd in [&f.to_guest, &f.from_guest].into_iter().flatten() {
            set_nonblocking(fd);
        }
        f.flush(); // HELLO and the request wait in the pipe for the guest
    }
    // Echoes of the guest's streams, each line behind the guest prefix.
    let mut err_echo = LineEcho::new(GUEST_PREFIX);
    let mut out_echo = LineEcho::new(GUEST_PREFIX);
    let deadline = cfg.timeout.map(|t| child.started + t);
    let mut exited_at: Option<Instant> = None;
    let mut output = OutputMeter::new(cfg.output_limit);
    let mut tail: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; READ_CHUNK];
    let mut last_sample: Option<Instant> = None;
    let mut woke_by_output = false;

    loop {
        // The deadline is checked on every iteration, not only when nothing is ready: a guest
        // that keeps a descriptor busy must not keep its time.
        if let (Some(d), None, false) = (deadline, exited_at, o.timed_out)
            && Instant::now() >= d
        {
            o.timed_out = true;
            sup.kill();
        }
        // Kernel evidence for the memory limit: the peak address space, while the guest lives.
        // Sooner after output: a guest whose allocation failed prints why, then exits, and
        // its address space is gone once it has.
        let every = if woke_by_output {
            VM_SAMPLE_AFTER_OUTPUT
        } else {
            VM_SAMPLE_EVERY
        };
        woke_by_output = false;
        if cfg.memory_limit.is_some()
            && exited_at.is_none()
            && sup.execd()
            && last_sample.is_none_or(|t| t.elapsed() >= every)
        {
            last_sample = Some(Instant::now());
            sup.sample_memory();
        }
        // limits.disk: what the guest added under its write grants, on its own timer.
        if let Some(acct) = &cfg.disk
            && exited_at.is_none()
            && sup.execd()
            && !o.disk_exceeded
            && acct.borrow_mut().over(pid)
        {
            o.disk_exceeded = true;
            sup.kill();
            o.disk_error = acct
                .borrow()
                .cannot_judge
                .as_ref()
                .map(|e| format!("limits.disk: {e}"));
        }
        let streams_open = stdout.is_some()
            || stderr.is_some()
            || framed.as_ref().is_some_and(|f| f.from_guest.is_some());
        if let Some(t) = exited_at
            && ((sup.execd() && !streams_open) || t.elapsed() > DRAIN_GRACE)
        {
            break;
        }
        let mut fds: Vec<PollFd> = Vec::with_capacity(7);
        let mut srcs: Vec<Src> = Vec::with_capacity(7);
        sup.register(&mut fds, &mut srcs);
        add(
            &mut fds,
            &mut srcs,
            stdout.as_ref(),
            PollFlags::POLLIN,
            Src::Stdout,
        );
        add(
            &mut fds,
            &mut srcs,
            stderr.as_ref(),
            PollFlags::POLLIN,
            Src::Stderr,
        );
        if exited_at.is_none()
            && let Some(sfd) = &cfg.stop_signals
        {
            fds.push(PollFd::new(sfd.as_fd(), PollFlags::POLLIN));
            srcs.push(Src::StopSignal);
        }
        if let Some(f) = &framed {
            add(
                &mut fds,
                &mut srcs,
                f.from_guest.as_ref(),
                PollFlags::POLLIN,
                Src::FromGuest,
            );
            if !f.outbox.is_empty() {
                add(
                    &mut fds,
                    &mut srcs,
                    f.to_guest.as_ref(),
                    PollFlags::POLLOUT,
                    Src::ToGuest,
                );
            }
        }
        let mut wait = match exited_at {
            Some(t) => DRAIN_GRACE.saturating_sub(t.elapsed()),
            None => Duration::from_secs(3600),
        };
        if let (Some(d), None, false) = (deadline, exited_at, o.timed_out) {
            wait = wait.min(d.saturating_duration_since(Instant::now()));
        }
        if cfg.memory_limit.is_some() && exited_at.is_none() {
            wait = wait.min(VM_SAMPLE_WAIT);
        }
        if let Some(acct) = &cfg.disk
            && exited_at.is_none()
        {
            wait = wait.min(acct.borrow().due_in().max(Duration::from_millis(1)));
        }
        let ready = match poll(&mut fds, poll_timeout(wait)) {
            Ok(n) => n,
            Err(Errno::EINTR) => continue,
            Err(_) => 0,
        };
        let revents: Vec<(Src, PollFlags)> = srcs
            .iter()
            .zip(fds.iter())
            .map(|(&s, f)| (s, f.revents().unwrap_or(PollFlags::empty())))
            .filter(|(_, r)| !r.is_empty())
            .collect();
        drop(fds);
        if ready == 0 {
            continue;
        }
        for (src, rev) in revents {
            woke_by_output |= matches!(src, Src::Stdout | Src::Stderr | Src::FromGuest);
            match src {
                Src::Guest(token) => match sup.on_ready(token, rev) {
                    guest::Progress::Nothing | guest::Progress::SetupBroken => {}
                    guest::Progress::Exited => {
                        crate::timing::mark("guest exited (pidfd)");
                        exited_at = Some(Instant::now());
                    }
                    guest::Progress::ExecStopFailed(e) => {
                        if let Some(w) = err_sink.as_mut() {
                            let _ = writeln!(w, "wfjail: {e}");
                        }
                    }
                    guest::Progress::OverBudget => o.notifications_exceeded = true,
                    guest::Progress::KilledForViolation => o.killed_for_violation = true,
                },
                Src::Stdout | Src::Stderr => {
                    let is_out = src == Src::Stdout;
                    let slot = if is_out { &mut stdout } else { &mut stderr };
                    let Some(fd) = slot.as_ref() else { continue };
                    let (data, open) = read_some(fd, &mut buf);
                    // Keep what fits in the bound; the rest is dropped (and the guest killed).
                    let room = output.room();
                    output.charge(data.len() as u64);
                    let exceeded = data.len() > room;
                    let data = &data[..data.len().min(room)];
                    if is_out && let Some(w) = out_sink.as_mut() {
                        let _ = w.write_all(data); // the result: byte for byte
                    } else if let Some(w) = err_sink.as_mut() {
                        let echo = if is_out { &mut out_echo } else { &mut err_echo };
                        let _ = w.write_all(&echo.feed(data));
                    }
                    if !is_out {
                        tail.extend_from_slice(data);
                        if tail.len() > 2 * STDERR_TAIL {
                            tail.drain(..tail.len() - STDERR_TAIL);
                        }
                    }
                    if exceeded && !o.output_exceeded && exited_at.is_none() {
                        o.output_exceeded = true;
                        sup.kill();
                    }
                    if !open {
                        *slot = None;
                    }
                }
                Src::StopSignal => {
                    if let Some(Ok(Some(info))) = cfg.stop_signals.as_ref().map(|s| s.read_signal())
                        && o.interrupted.is_none()
                    {
                        o.interrupted = Some(info.ssi_signo as i32);
                        sup.kill();
                    }
                }
                Src::ToGuest => {
                    if let Some(f) = framed.as_mut() {
                        f.flush();
                    }
                }
                Src::FromGuest => {
                    let Some(f) = framed.as_mut() else { continue };
                    let Some(fd) = f.from_guest.as_ref() else {
                        continue;
                    };
                    let (data, open) = read_some(fd, &mut buf);
                    let mut r = f.conv.feed(data);
                    if !open {
                        f.from_guest = None;
                        r = r.and_then(|ev| f.conv.eof().map(|_| ev));
                    }
                    // Every frame costs against the output bound, empty ones included.
                    output.charge(f.conv.take_charge());
                    let r = r.and_then(|events| {
                        for ev in events {
                            match ev {
                                Event::Hello => {}
                                Event::Log { level, text } => {
                                    if let Some(w) = err_sink.as_mut() {
                                        let mut e = LineEcho::new(format!(
                                            "{GUEST_PREFIX}log ({}): ",
                                            level_name(level)
                                        ));
                                        let mut line = e.feed(text.as_bytes());
                                        line.extend(e.finish());
                                        if line.is_empty() {
                                            line = e.feed(b"\n");
                                        }
                                        // What the echo adds (prefix, escapes) counts too,
                                        // so an empty LOG costs its printed line.
                                        let added = line.len().saturating_sub(text.len());
                                        output.charge(added as u64);
                                        let _ = w.write_all(&line);
                                    }
                                }
                                Event::Query => {
                                    let list = sup.answers_mut().violations.take_since_query();
                                    f.outbox.push(&gp::violations_frame(&list, f.cap))?;
                                }
                                // `run` has no worker to ask.
                                Event::Upcall(_) => {
                                    f.outbox.push(&gp::reply_frame(Err(
                                        "no worker to ask: UPCALL needs a wfjail serve session",
                                    )))?;
                                }
                                Event::Result(bytes) => {
                                    o.result = Some(bytes);
                                    f.close_when_flushed = true;
                                }
                                Event::Error(e) => {
                                    // The guest waits for the end of its input now, its
                                    // address space whole: the memory limit may explain
                                    // the failure (serve samples here too).
                                    sup.memory.sample(pid);
                                    o.guest_error = Some(e);
                                    f.close_when_flushed = true;
                                }
                            }
                        }
                        Ok(())
                    });
                    if output.over() && !o.output_exceeded && exited_at.is_none() {
                        o.output_exceeded = true;
                        sup.kill();
                    }
                    match r {
                        Ok(()) => f.flush(),
                        Err(e) => {
                            // After we stopped the guest ourselves (deadline, output bound,
                            // violation), a frame cut short is our doing, not the guest's.
                            let we_stopped =
                                o.timed_out || o.output_exceeded || o.killed_for_violation;
                            if o.protocol_error.is_none() && !we_stopped {
                                o.protocol_error = Some(e.0);
                            }
                            f.from_guest = None;
                            f.to_guest = None;
                            f.outbox.clear();
                            sup.kill();
                        }
                    }
                }
            }
        }
    }
    if let Some(w) = err_sink.as_mut() {
        let _ = w.write_all(&out_echo.finish());
        let _ = w.write_all(&err_echo.finish());
    }
    if let Some(w) = out_sink.as_mut() {
        let _ = w.flush();
    }
    crate::timing::mark("output drained");
    o.reaped = sys::wait4(pid).ok();
    o.duration = child.started.elapsed();
    // A guest that wrote past limits.disk and exited between two samples.
    let start = sup.start();
    let startup = start.startup();
    if startup.exec_confirmed() {
        disk_at_end(cfg, &mut o);
    }
    if tail.len() > STDERR_TAIL {
        tail.drain(..tail.len() - STDERR_TAIL);
    }
    o.stderr_tail = tail;
    o.vm_peak = sup.memory.vm_peak;
    o.memory_refused = sup.memory.refused;
    o.degraded = startup.degraded().to_vec();
    o.fatal = startup.fatal();
    o.exec_confirmed = startup.exec_confirmed();
    o.notify = start.got_listener();
    if let Some(e @ StartupError::Channel(_)) = startup.error() {
        o.channel_error = Some(e.to_string());
    }
    let answers = sup.into_answers();
    o.violations = answers.violations.list;
    if let Some((learned, bytes)) = answers.learned {
        o.learned = learned;
        o.learned_bytes = bytes;
    }
    o
}

/// The name of a LOG frame's level (Python's logging levels).
pub fn level_name(level: u8) -> &'static str {
    match level {
        0..=10 => "debug",
        11..=20 => "info",
        21..=30 => "warning",
        _ => "error",
    }
}
