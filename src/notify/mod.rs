//! Answering seccomp notifications: the one handler that `wfjail run`, exec-mode serve
//! sessions and the zygote router all call (the start-up's initial exec aside, see
//! `startup.rs`).
//!
//! A notification is judged ([`answer_for`]) and then answered ([`respond`]). An answer is one
//! of: let the call continue; fail it with an errno; kill the guest and fail it; or return a
//! value without running it, with bytes written into the guest's memory first. Guest memory
//! is trusted only once `SECCOMP_IOCTL_NOTIF_ID_VALID` says the call is still pending: after
//! reading it (a decision), and after writing it (a value), so that neither a read nor a
//! write is taken as belonging to a call that is gone.

pub mod decode;
pub mod opener;
pub mod paths;
pub mod violations;

use std::os::fd::BorrowedFd;

use crate::plan::Plan;
use crate::policy::OnViolation;
use crate::policy::decisions::{Check, Decisions};
use crate::report::{Action, Violation};
use crate::sys::{self, Notif, NotifBuf, kernel_abi};

pub use crate::answers::answer::{Answer, HeldFd, allow, refuse, respond};
use crate::answers::entropy::Entropy;
use crate::guest_memory::ProcessMemory;
use paths::Grants;
use violations::Violations;

/// What an execution's notifications are judged by.
#[derive(Clone, Copy)]
pub struct Rules<'a> {
    /// The plan's compiled decisions (policy/decisions.rs).
    pub decisions: &'a Decisions,
    pub grants: &'a Grants,
    /// Read-only opens are violations (a prefork session child after preload).
    pub late_reads: bool,
    /// What a violation does: the policy's `on_violation`, or `deny` where the guest must not
    /// be killed for it (the zygote itself).
    pub on_violation: OnViolation,
    /// The read grants reads are judged against (`wfjail run` under `warn`, where Landlock
    /// lets every path through: a read the policy would refuse runs and is reported).
    pub reads: Option<&'a Grants>,
}

impl<'a> Rules<'a> {
    pub fn new(plan: &'a Plan, grants: &'a Grants) -> Self {
        Rules {
            decisions: &plan.rules.decisions,
            grants,
            late_reads: false,
            on_violation: plan.on_violation,
            reads: None,
        }
    }
}

/// What handling one notification led to.
#[derive(Debug, PartialEq, Eq)]
pub enum Handled {
    /// Nothing to record (an allowed watched write, an answered value, a vanished call).
    Quiet,
    /// A violation was recorded.
    Recorded,
    /// A violation was recorded and the guest was killed, as the policy says.
    Killed,
}

/// The execution's state that answers may change.
pub struct State<'v> {
    pub violations: &'v mut Violations,
    /// The seeded stream, under `getrandom = "seeded"`.
    pub entropy: Option<&'v mut Entropy>,
    /// The workflow time (nanoseconds since the Unix epoch), under `clock = "virtual"`.
    pub clock: Option<i64>,
    /// The virtual monotonic clock, under `clock = "virtual"` (`monotonic.rs`).
    pub monotonic: &'v mut crate::answers::monotonic::Monotonic,
    /// The inode numbers its pipes and sockets read, under `clock = "virtual"`
    /// (`filetimes.rs`).
    pub inodes: &'v mut crate::answers::filetimes::Inodes,
    /// `wfjail learn`: every violation is also appended here (up to [`MAX_LEARNED`], and
    /// [`MAX_LEARNED_BYTES`] of arguments counted in the second).
    pub learned: Option<(&'v mut Vec<Violation>, &'v mut usize)>,
}

/// The most violations a learning run keeps (each open of a Python import is one).
pub const MAX_LEARNED: usize = 100_000;
/// The most bytes of arguments (paths, mostly) a learning run keeps: wfjail's memory is the
/// host's, and a hostile run naming 100 000 paths of 4 KiB each would fill it (those past the
/// bound are not learned, so the draft lacks them and its run is not verified).
pub const MAX_LEARNED_BYTES: usize = 32 << 20;

/// The notifications a guest may have answered in a burst: the bucket's size.
pub const BUDGET_BURST: u32 = 100_000;
/// The notifications a guest may have answered per second, sustained: the bucket's refill.
pub const BUDGET_RATE: u32 = 5_000;

/// How much of the supervisor's work one guest may have (`wfjail run`, one serve session):
/// a token bucket on the notifications answered for it, [`BUDGET_BURST`] deep and refilled
/// at [`BUDGET_RATE`] per second. Every answer costs the supervisor a few microseconds that
/// the guest's own CPU limit does not count; a guest that keeps asking faster than the
/// refill (a loop of wall-clock reads under the virtual clock, of seeded `getrandom`) is
/// killed, and the report says `limit`, limit `notifications`. The supervisor's time for it
/// stays under ~`BUDGET_RATE` answers a second, whatever it does, so that it cannot starve
/// the sessions that share the supervisor (a zygote's router answers them all).
#[derive(Debug)]
pub struct Budget {
    tokens: f64,
    last: std::time::Instant,
    /// Notifications answered (or refused for the budget), in all.
    pub answered: u64,
    /// The bucket ran dry: the guest was killed for it.
    pub exceeded: bool,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            tokens: f64::from(BUDGET_BURST),
            last: std::time::Instant::now(),
            answered: 0,
            exceeded: false,
        }
    }
}

impl Budget {
    /// Takes one answer from the bucket: `false` when it is empty (the caller kills the
    /// guest and fails the call, see [`charge`]); `exceeded` stays set.
    pub fn take(&mut self) -> bool {
        let now = std::time::Instant::now();
        let refill = now.duration_since(self.last).as_secs_f64() * f64::from(BUDGET_RATE);
        self.last = now;
        self.tokens = (self.tokens + refill).min(f64::from(BUDGET_BURST));
        self.answered += 1;
        if self.tokens >= 1.0 && !self.exceeded {
            self.tokens -= 1.0;
            true
        } else {
            self.exceeded = true;
            false
        }
    }
}

/// Charges notification `n` to its guest's `budget`: true when the caller goes on to answer
/// it; over the budget the guest is killed through `kill` first and the call then failed (it
/// never returns to the guest), and the caller records that it killed the guest.
pub fn charge(
    budget: &mut Budget,
    listener: BorrowedFd<'_>,
    n: &Notif,
    kill: impl FnOnce(),
) -> bool {
    if budget.take() {
        return true;
    }
    kill();
    respond(listener, n, Answer::Kill(libc::EPERM));
    false
}

/// Receives one notification (`None`: the call vanished, nothing to do).
pub fn receive(listener: BorrowedFd<'_>, buf: &mut NotifBuf) -> Option<Notif> {
    sys::notif_recv(listener, buf).ok()
}

/// Decides and answers notification `n`: records a violation in `state` (before answering:
/// a guest that asks right after its call failed must find it), kills through `kill` when
/// the answer is to, and answers.
pub fn handle(
    listener: BorrowedFd<'_>,
    n: &Notif,
    rules: Rules<'_>,
    state: State<'_>,
    kill: impl FnOnce(),
) -> Handled {
    let clock = state.clock.map(|now| (now, state.monotonic, state.inodes));
    let Some((answer, violation)) = answer_for(listener, n, rules, state.entropy, clock) else {
        return Handled::Quiet; // the call is gone: what was read may not be its own
    };
    let handled = match violation {
        Some(v) => {
            if let Some((l, bytes)) = state.learned
                && l.len() < MAX_LEARNED
                && *bytes + v.args.len() <= MAX_LEARNED_BYTES
            {
                *bytes += v.args.len();
                l.push(v.clone());
            }
            state.violations.record(v);
            if matches!(answer, Answer::Kill(_)) {
                Handled::Killed
            } else {
                Handled::Recorded
            }
        }
        None => Handled::Quiet,
    };
    if matches!(answer, Answer::Kill(_)) {
        kill();
    }
    respond(listener, n, answer);
    handled
}

/// The answer to `n` and the violation to record, if any; `None` when the call stopped
/// being pending while it was decided.
fn answer_for(
    listener: BorrowedFd<'_>,
    n: &Notif,
    rules: Rules<'_>,
    entropy: Option<&mut Entropy>,
    clock: Option<(
        i64,
        &mut crate::answers::monotonic::Monotonic,
        &mut crate::answers::filetimes::Inodes,
    )>,
) -> Option<(Answer, Option<Violation>)> {
    let native = n.arch == crate::policy::bpf::AUDIT_ARCH_X86_64;
    let decision = rules.decisions.get(n.nr as u32).filter(|_| native);
    // Seeded randomness: answered with the stream's next bytes, not a violation.
    if let (Some(d), Some(e)) = (decision, entropy)
        && d.check == Check::Seeded
    {
        return Some((seeded_answer(n, e), None));
    }
    // A pinned CPU count: the affinity mask of that many CPUs.
    if let Some(d) = decision
        && let Check::CpuCount(cpus) = d.check
    {
        return Some((cpu_answer(&n.args, cpus), None));
    }
    // Workflow time: the wall clock reads the execution's time, not a violation.
    if let (Some(d), Some((now, monotonic, inodes))) = (decision, clock)
        && matches!(d.check, Check::Clock | Check::Usage | Check::Stat)
    {
        // A descriptor's times and inode number, a file system's free space (filetimes.rs).
        if d.check == Check::Stat {
            let mem = ProcessMemory { pid: n.pid };
            return Some((
                crate::answers::filetimes::answer(n, &mem, d.name, now, inodes),
                None,
            ));
        }
        // Resource usage, `times`, `sysinfo`: pinned (no CPU time, a virtual uptime).
        if d.check == Check::Usage {
            let mono = monotonic.read(now);
            return Some((usage_answer(d.name, &n.args, mono), None));
        }
        // A monotonic clock reads the virtual monotonic clock (monotonic.rs); the filter lets
        // the CPU-time clocks run, so any other clock here is the kernel's to answer.
        let clockid = n.args[0] & 0xffff_ffff;
        if d.name == "clock_gettime" && crate::policy::bpf::MONOTONIC_CLOCKS.contains(&clockid) {
            let mono = monotonic.read(now);
            return Some((clock_answer(d.name, &n.args, mono), None));
        }
        if d.name == "clock_gettime" && !crate::policy::bpf::REALTIME_CLOCKS.contains(&clockid) {
            // Another process's CPU clock: as if that pid did not exist (monotonic.rs).
            if crate::answers::monotonic::foreign_cpu_clock(clockid, n.pid) {
                return Some((Answer::Errno(libc::EINVAL), None));
            }
            return Some((Answer::Continue, None));
        }
        return Some((clock_answer(d.name, &n.args, now), None));
    }
    // `getpid` reaches the supervisor only from a prefork plan, whose router answers a
    // session's; anywhere else the guest's own pid is its namespace's.
    if decision.is_some_and(|d| d.check == Check::Pid) {
        return Some((Answer::Continue, None));
    }
    let mem = ProcessMemory { pid: n.pid };
    // A write-open inside the grants: the supervisor opens what it judged (opener.rs). One
    // it judged refused must not run after all if a second look (below) finds it granted.
    // (syscall, the path as shown)
    let mut refused_open: Option<(&'static str, String)> = None;
    if let Some(d) = decision
        && d.check == Check::Writes
        && let Some(t) = opener::candidate(n, &mem, d.name, rules.grants)
    {
        if !sys::notif_id_valid(listener, n.id) {
            return None;
        }
        match opener::open(n.pid, &t) {
            Some(opener::Opened::Fd(fd)) => {
                let cloexec = t.flags & libc::O_CLOEXEC as u64 != 0;
                let fd = HeldFd(std::sync::Arc::new(fd));
                return Some((Answer::Fd { fd, cloexec }, None));
            }
            Some(opener::Opened::Errno(e)) => return Some((Answer::Errno(e), None)),
            Some(opener::Opened::Escaped) => {
                return Some(changed_while_judged(t.syscall, &t.shown, rules));
            }
            None if t.how == crate::notify::paths::GrantedOpen::Refused => {
                refused_open = Some((t.syscall, t.shown));
            }
            None => {} // left to the kernel
        }
    }
    // mkdir, unlink, rename, symlink inside the grants: made by the supervisor too.
    if let Some(d) = decision
        && d.check == Check::Writes
        && refused_open.is_none()
        && let Some(r) = opener::candidate_op(n, &mem, d.name, rules.grants)
    {
        if !sys::notif_id_valid(listener, n.id) {
            return None;
        }
        let shown = r.paths.first().map(|(s, _)| s.clone()).unwrap_or_default();
        match opener::path_op(n.pid, &r) {
            Some(Ok(())) => {
                return Some((
                    Answer::Value {
                        ret: 0,
                        writes: vec![],
                    },
                    None,
                ));
            }
            Some(Err(opener::Opened::Errno(e))) => return Some((Answer::Errno(e), None)),
            Some(Err(_)) => return Some(changed_while_judged(r.syscall, &shown, rules)),
            None if r
                .paths
                .iter()
                .any(|(_, h)| *h == crate::notify::paths::GrantedOpen::Refused) =>
            {
                refused_open = Some((r.syscall, shown));
            }
            None => {}
        }
    }
    let verdict = decode::classify(n, &mem, rules.decisions, rules.grants, rules.late_reads)
        .or_else(|| {
            let reads = rules.reads?;
            let d = decision.filter(|d| d.check == Check::Writes)?;
            decode::check_read(n, &mem, d.name, reads)
        });
    if !sys::notif_id_valid(listener, n.id) {
        return None;
    }
    let Some(d) = verdict else {
        if let Some((syscall, shown)) = &refused_open {
            // Refused a moment ago, granted now: the path is changing under the judgement.
            return Some(changed_while_judged(syscall, shown, rules));
        }
        // A watched write inside the grants: Landlock has the last word.
        return Some((Answer::Continue, None));
    };
    let (answer, action) = match rules.on_violation {
        OnViolation::Kill => (Answer::Kill(d.errno), Action::Killed),
        OnViolation::Warn if !d.always_deny => (Answer::Continue, Action::Warned),
        _ => (Answer::Errno(d.errno), Action::Denied),
    };
    let violation = Violation {
        hint: d.hint.unwrap_or(d.category.hint()).to_string(),
        category: d.category,
        syscall: d.syscall,
        args: d.args,
        action,
        rule: d.rule,
        count: 1,
    };
    Some((answer, Some(violation)))
}

/// The answer to a write-open whose path changed while it was judged (a symbolic link
/// swapped in a shared directory): refused as Landlock would, and reported.
fn changed_while_judged(
    syscall: &str,
    shown: &str,
    rules: Rules<'_>,
) -> (Answer, Option<Violation>) {
    let (answer, action) = match rules.on_violation {
        OnViolation::Kill => (Answer::Kill(libc::EACCES), Action::Killed),
        _ => (Answer::Errno(libc::EACCES), Action::Denied),
    };
    let category = crate::policy::syscalls::Category::Filesystem;
    let violation = Violation {
        category,
        syscall: syscall.to_string(),
        args: format!("{shown} (write)"),
        action,
        rule: "filesystem.write: the path left the grants while it was judged (a symbolic link changed)".into(),
        hint: category.hint().to_string(),
        count: 1,
    };
    (answer, Some(violation))
}

/// The answer to a seeded `getrandom` (`n`): the stream's next bytes, or EINVAL for flags
/// the kernel refuses (as it does, before any byte).
pub fn seeded_answer(n: &Notif, entropy: &mut Entropy) -> Answer {
    if !getrandom_flags_valid(n.args[2]) {
        return Answer::Errno(libc::EINVAL);
    }
    let bytes = entropy.take(n.args[1] as usize);
    let ret = bytes.len() as i64;
    let writes = if ret > 0 {
        vec![(n.args[0], bytes)]
    } else {
        vec![]
    };
    Answer::Value { ret, writes }
}

/// Whether the kernel accepts `flags` of `getrandom`: only `GRND_NONBLOCK`, `GRND_RANDOM`
/// and `GRND_INSECURE`, and not the last two together (otherwise EINVAL, which a seeded
/// answer gives too).
pub fn getrandom_flags_valid(flags: u64) -> bool {
    let (random, insecure) = (libc::GRND_RANDOM as u64, libc::GRND_INSECURE as u64);
    let flags = flags & 0xffff_ffff; // an unsigned int to the kernel
    flags & !(libc::GRND_NONBLOCK as u64 | random | insecure) == 0
        && flags & (random | insecure) != random | insecure
}

/// The answer to `sched_getaffinity(pid, len, mask)` with `cpus` CPUs pinned: CPUs 0..cpus
/// set, in as many 8-byte words as they need; EINVAL for a buffer the kernel would refuse
/// (shorter than that, or not a multiple of 8 bytes).
pub fn cpu_answer(args: &[u64; 6], cpus: u32) -> Answer {
    let words = (cpus as usize).div_ceil(64).max(1);
    let len = args[1] as usize;
    if len < words * 8 || !len.is_multiple_of(8) {
        return Answer::Errno(libc::EINVAL);
    }
    let mut mask = vec![0u8; words * 8];
    for cpu in 0..cpus as usize {
        mask[cpu / 8] |= 1 << (cpu % 8);
    }
    Answer::Value {
        ret: mask.len() as i64,
        writes: vec![(args[2], mask)],
    }
}

/// The answer to wall-clock read `name` (arguments `args`) at `now` nanoseconds since the
/// epoch: what the kernel would write and return, with the time frozen there.
pub fn clock_answer(name: &str, args: &[u64; 6], now: i64) -> Answer {
    let secs = now.div_euclid(1_000_000_000);
    let nanos = now.rem_euclid(1_000_000_000);
    let pair = |a: i64, b: i64| [a.to_ne_bytes(), b.to_ne_bytes()].concat();
    match name {
        // clock_gettime(clockid, struct timespec *): a NULL buffer faults in the kernel too.
        "clock_gettime" if args[1] == 0 => Answer::Errno(libc::EFAULT),
        "clock_gettime" => Answer::Value {
            ret: 0,
            writes: vec![(args[1], pair(secs, nanos))],
        },
        // gettimeofday(struct timeval *, struct timezone *): either may be NULL; the time
        // zone is UTC (the kernel's is whatever settimeofday set, usually zero).
        "gettimeofday" => {
            let mut writes = vec![];
            if args[0] != 0 {
                writes.push((args[0], pair(secs, nanos / 1000)));
            }
            if args[1] != 0 {
                writes.push((args[1], vec![0u8; kernel_abi::TIMEZONE]));
            }
            Answer::Value { ret: 0, writes }
        }
        // time(time_t *): returns the seconds, and stores them too when asked.
        _ => Answer::Value {
            ret: secs,
            writes: if args[0] != 0 {
                vec![(args[0], secs.to_ne_bytes().to_vec())]
            } else {
                vec![]
            },
        },
    }
}

/// The answer to `getrusage`, `times` or `sysinfo` (`name`, arguments `args`) while the
/// virtual monotonic clock reads `mono`: what the kernel would write for a process that has
/// used no CPU time, on a machine up for `mono` with no load and nothing else running (the
/// memory totals are the host's, from `/proc/meminfo`, and all of it free).
pub fn usage_answer(name: &str, args: &[u64; 6], mono: i64) -> Answer {
    match name {
        // getrusage(who, struct rusage *): RUSAGE_SELF, _CHILDREN, _THREAD.
        "getrusage" if !(-1..=1).contains(&(args[0] as i32)) => Answer::Errno(libc::EINVAL),
        "getrusage" if args[1] == 0 => Answer::Errno(libc::EFAULT),
        "getrusage" => Answer::Value {
            ret: 0,
            writes: vec![(args[1], vec![0u8; kernel_abi::RUSAGE])],
        },
        // times(struct tms *): no CPU time; returns clock ticks (100 Hz) since "boot".
        "times" => Answer::Value {
            ret: mono / 10_000_000,
            writes: if args[0] != 0 {
                vec![(args[0], vec![0u8; kernel_abi::TMS])]
            } else {
                vec![]
            },
        },
        "sysinfo" if args[0] == 0 => Answer::Errno(libc::EFAULT),
        _ => {
            let (ram, swap) = memory_totals();
            let mut info = vec![0u8; kernel_abi::SYSINFO];
            let mut put = |at: usize, v: u64| info[at..at + 8].copy_from_slice(&v.to_ne_bytes());
            put(0, (mono / 1_000_000_000) as u64); // uptime; loads stay 0
            put(32, ram); // totalram
            put(40, ram); // freeram
            put(64, swap); // totalswap
            put(72, swap); // freeswap
            info[80..82].copy_from_slice(&1u16.to_ne_bytes()); // procs
            info[104..108].copy_from_slice(&1u32.to_ne_bytes()); // mem_unit
            Answer::Value {
                ret: 0,
                writes: vec![(args[0], info)],
            }
        }
    }
}

/// The host's memory and swap totals in bytes (`/proc/meminfo`; 0 when it cannot be read).
fn memory_totals() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kib = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|r| r.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |k| k * 1024)
    };
    (kib("MemTotal:"), kib("SwapTotal:"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lengths of what `a` writes, in order.
    fn lengths(a: Answer) -> Vec<usize> {
        match a {
            Answer::Value { writes, .. } => writes.iter().map(|(_, b)| b.len()).collect(),
            other => panic!("not a value: {other:?}"),
        }
    }

    #[test]
    fn usage_and_clock_answers_write_the_kernels_struct_sizes_whatever_the_c_library() {
        let args = [0, 0x1000, 0x2000, 0, 0, 0];
        assert_eq!(lengths(usage_answer("getrusage", &args, 0)), [144]);
        assert_eq!(
            lengths(usage_answer("times", &[0x1000, 0, 0, 0, 0, 0], 0)),
            [32]
        );
        assert_eq!(
            lengths(usage_answer("sysinfo", &[0x1000, 0, 0, 0, 0, 0], 0)),
            [112]
        );
        assert_eq!(lengths(clock_answer("clock_gettime", &args, 0)), [16]);
        let both = [0x1000, 0x2000, 0, 0, 0, 0];
        assert_eq!(lengths(clock_answer("gettimeofday", &both, 0)), [16, 8]);
    }
}
