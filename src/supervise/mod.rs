//! The parent while the guest runs: set-up records, seccomp notifications, the guest's output
//! (bounded), the protocol conversation, the wall-clock timeout, and the exit. One `poll`
//! loop, no threads. The guest itself is watched by the one [`guest::Supervisor`] (also
//! embedded by exec-mode `serve` sessions); `wfjail run` drives it in `run_loop.rs` beside its
//! own descriptors (`streams.rs`: the output; `framed.rs`: the protocol conversation).
//!
//! Whatever the guest sends, the supervisor's own memory and time stay bounded: each
//! iteration reads at most [`READ_CHUNK`] bytes per descriptor and then checks the deadline;
//! what it holds for the guest (the frame decoder, the outbox of answers, the echo's line
//! buffers, the stderr tail, the violations list) each has a bound; every frame from the
//! guest is charged to `limits.output`.

pub mod assemble;
pub mod disk;
mod framed;
pub mod guest;
pub mod memory_evidence;
pub mod output;
mod run_loop;
pub mod startup;
pub mod streams;
pub mod verdict;

use std::io::Write;
use std::os::fd::OwnedFd;
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::PollTimeout;
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use crate::answers::{entropy, monotonic, vdso};
use crate::notify;
use crate::notify::violations::Violations;
use crate::policy::Policy;
use crate::process::Spawned;
use crate::process::channel::Step;
use crate::report::{GuestError, Violation};
use crate::sys::{self, Reaped};
use crate::workflow_time;
use memory_evidence::{MemoryEvidence, SampleClock};

use framed::Framed;
use run_loop::RunLoop;
use streams::Streams;
pub use streams::level_name;

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
    /// line behind [`crate::echo::GUEST_PREFIX`] and escaped.
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

/// `limits.disk` after the guest is gone: what it left under its write grants. Run again by
/// `wfjail run` once the guest's pids cgroup is emptied: without a PID namespace, a process
/// the guest started outlives it until then, and can write after the check at its exit.
pub fn disk_at_end(cfg: &Config, o: &mut Outcome) {
    if let Some(acct) = &cfg.disk
        && !o.disk_exceeded
        && acct.borrow_mut().over_at_end()
    {
        disk_judged(cfg, o);
    }
}

/// `limits.disk` found the guest over it (or unable to judge): the outcome says so.
fn disk_judged(cfg: &Config, o: &mut Outcome) {
    o.disk_exceeded = true;
    o.disk_error = cfg.disk.as_ref().and_then(|acct| {
        acct.borrow()
            .cannot_judge
            .as_ref()
            .map(|e| format!("limits.disk: {e}"))
    });
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
    let mut o = Outcome {
        framed: pipes.protocol.is_some(),
        ..Outcome::default()
    };
    if crate::policy::rules::getrandom::answered(policy) {
        o.seed = Some(cfg.seed.unwrap_or(0));
    }
    if crate::policy::rules::clock::answered(policy) {
        o.clock = Some(cfg.clock.unwrap_or_else(workflow_time::host_now));
    }
    let learn = judge.late_reads;
    let answers = guest::Answers {
        violations: Violations::new(sinks.violations.then(String::new)),
        budget: notify::Budget::default(),
        entropy: o.seed.map(entropy::Entropy::new),
        clock: o.clock,
        monotonic: monotonic::Monotonic::default(),
        inodes: Default::default(),
        learned: learn.then(|| (Vec::new(), 0)),
    };
    let pid = child.pid;
    let sup = guest::Supervisor::new(
        pid,
        std::sync::Arc::new(child.pidfd),
        child.chan,
        cfg.vdso.map(|p| p.seeded(cfg.seed)),
        judge,
        answers,
        MemoryEvidence::for_policy(cfg.memory_limit, policy),
    );
    // Framed, stdout is a log: echoed with stderr.
    let out_sink = if o.framed { None } else { sinks.stdout };
    let streams = Streams::new(
        pipes.stdout,
        pipes.stderr,
        out_sink,
        sinks.stderr,
        cfg.output_limit,
    );
    let mut run = RunLoop {
        cfg,
        sup,
        streams,
        framed: pipes.protocol.map(Framed::new),
        o,
        deadline: cfg.timeout.map(|t| child.started + t),
        exited_at: None,
        samples: SampleClock::starting_now(),
        woke_by_output: false,
        buf: vec![0u8; READ_CHUNK],
    };
    run.run();
    let RunLoop {
        sup,
        streams,
        mut o,
        ..
    } = run;
    o.stderr_tail = streams.finish();
    crate::timing::mark("output drained");
    o.reaped = sys::wait4(pid).ok();
    o.duration = child.started.elapsed();
    // A guest that wrote past limits.disk and exited between two samples.
    let start = sup.start();
    let startup = start.startup();
    if startup.exec_confirmed() {
        disk_at_end(cfg, &mut o);
    }
    o.degraded = startup.degraded().to_vec();
    o.fatal = startup.fatal();
    o.exec_confirmed = startup.exec_confirmed();
    o.vm_peak = sup.memory.vm_peak;
    o.memory_refused = sup.memory.refused;
    o.notify = start.got_listener();
    o.channel_error = startup.channel_error();
    let answers = sup.into_answers();
    o.violations = answers.violations.list;
    if let Some((learned, bytes)) = answers.learned {
        o.learned = learned;
        o.learned_bytes = bytes;
    }
    o
}
