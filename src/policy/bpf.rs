//! Compiles a policy into a classic-BPF seccomp program, in the parent, before any fork.
//!
//! `seccompiler` compiles the argument conditions (its `SeccompRule`s); the layout is ours:
//! the kernel evaluates a new filter once per syscall number to build its allow-cache, so the
//! install cost is proportional to the decision path. A linear chain (what
//! `seccompiler::SeccompFilter` emits) costs ~2.5x more to install than a binary search tree
//! over syscall-number ranges, which is what [`compile`] lays out.
//!
//! Program shape:
//! ```text
//!   arch != x86_64        -> violation (foreign ABI: int 0x80)
//!   nr >= 0x40000000      -> violation (x32 ABI)
//!   binary tree on nr     -> leaf: ALLOW | ERRNO(ENOSYS) | violation | argument rules
//! ```
//! "violation" is `SECCOMP_RET_USER_NOTIF` in [`Mode::Notify`] (the supervisor decides and
//! reports) and an in-filter action in [`Mode::Fallback`].

use std::collections::BTreeMap;

use seccompiler::{
    SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition as Cond, SeccompRule,
};

use super::syscalls::{self, ArgRule, Category};
use super::{NetworkMode, OnViolation, Policy, Toggle};

pub const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;
/// Syscall numbers at or above this are the x32 ABI on x86_64.
pub const X32_SYSCALL_BIT: u32 = 0x4000_0000;

const RET_ALLOW: u32 = 0x7fff_0000;
const RET_USER_NOTIF: u32 = 0x7fc0_0000;
const RET_LOG: u32 = 0x7ffc_0000;
const RET_ERRNO: u32 = 0x0005_0000;
const RET_KILL_PROCESS: u32 = 0x8000_0000;

const BPF_LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
const BPF_JMP_JA: u16 = 0x05;
const BPF_JMP_JEQ_K: u16 = 0x05 | 0x10;
const BPF_JMP_JGE_K: u16 = 0x05 | 0x30;
const BPF_RET_K: u16 = 0x06;

/// `MAP_SHARED | MAP_PRIVATE | MAP_SHARED_VALIDATE` live in the low nibble of mmap's flags.
const MAP_TYPE: u64 = 0x0f;
/// Set in both `MAP_SHARED` (1) and `MAP_SHARED_VALIDATE` (3), clear in `MAP_PRIVATE` (2).
pub(crate) const MAP_SHARED_BIT: u64 = 0x01;

/// A placeholder for the guest's own pid in the program (above any pid_max); the child writes
/// its pid over it before installing the filter, at the slots [`self_pid_slots`] finds.
pub const SELF_PID: u32 = 0x7fff_fff0;

/// The instructions that compare an argument with [`SELF_PID`].
pub fn self_pid_slots(prog: &[libc::sock_filter]) -> Vec<usize> {
    prog.iter()
        .enumerate()
        .filter(|(_, i)| i.code == BPF_JMP_JEQ_K && i.k == SELF_PID)
        .map(|(n, _)| n)
        .collect()
}

/// How violations are handled by the program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Violations go to the supervisor over the user-notification listener.
    Notify,
    /// No listener: the filter itself denies (EPERM), kills, or logs per `on_violation`.
    Fallback,
}

/// The decision for one syscall number.
#[derive(Debug, Clone, PartialEq)]
pub enum Leaf {
    Allow,
    /// Allowed when one of the rules matches, a violation otherwise.
    AllowIf(Vec<SeccompRule>),
    /// Answered with ENOSYS and not reported (`clone3`: libc then falls back to `clone`,
    /// whose flags a filter can read).
    Enosys,
    /// Answered with ENOSYS, not reported, when one of the rules matches; a violation
    /// otherwise (glibc's malloc-key `getrandom`, `rules::getrandom`).
    EnosysIf(Vec<SeccompRule>),
    /// Denied and reported.
    Violation,
    /// Sent to the supervisor in notify mode (which checks it and usually lets it run);
    /// allowed in fallback mode, where Landlock alone decides.
    Watch,
    /// Allowed when one of the rules matches, [`Leaf::Watch`] otherwise.
    AllowIfElseWatch(Vec<SeccompRule>),
    /// Allowed when one of `allow` matches; else supervised when one of `supervise` matches
    /// (`None`: in every other case); else a violation. Supervised is a notification in
    /// notify mode (the supervisor judges and reports) and a violation in fallback mode: the
    /// call is not safe without someone to judge it (`fcntl` locks, `flock`).
    AllowElseSupervise {
        allow: Vec<SeccompRule>,
        supervise: Option<Vec<SeccompRule>>,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    #[error("seccomp rule for {syscall}: {source}")]
    Rule {
        syscall: &'static str,
        source: seccompiler::BackendError,
    },
    #[error("the seccomp program has {0} instructions; the kernel accepts at most 4096")]
    TooLarge(usize),
}

pub(crate) fn cond(arg: u8, len: Len, op: Op, value: u64) -> Cond {
    // Only fails for arg > 5, which callers here never pass.
    Cond::new(arg, len, op, value).expect("argument index is at most 5")
}

pub(crate) fn rule(conds: Vec<Cond>, syscall: &'static str) -> Result<SeccompRule, BpfError> {
    SeccompRule::new(conds).map_err(|source| BpfError::Rule { syscall, source })
}

/// Argument rules for the base allowlist entries that have them.
fn arg_rules(name: &'static str, r: ArgRule, zygote: bool) -> Result<Leaf, BpfError> {
    const SOCK_TYPE_MASK: u64 = 0xf; // SOCK_NONBLOCK and SOCK_CLOEXEC live above it
    Ok(match r {
        ArgRule::Any => Leaf::Allow,
        ArgRule::UnixStreamPair => Leaf::AllowIf(vec![rule(
            vec![
                cond(0, Len::Dword, Op::Eq, libc::AF_UNIX as u64),
                cond(
                    1,
                    Len::Dword,
                    Op::MaskedEq(SOCK_TYPE_MASK),
                    libc::SOCK_STREAM as u64,
                ),
            ],
            name,
        )?]),
        ArgRule::NoDestAddr => {
            Leaf::AllowIf(vec![rule(vec![cond(4, Len::Qword, Op::Eq, 0)], name)?])
        }
        ArgRule::IoctlAllowlist => Leaf::AllowIf(one_of(name, 1, syscalls::IOCTL_ALLOWED)?),
        ArgRule::ArchPrctlAllowlist => {
            Leaf::AllowIf(one_of(name, 0, syscalls::ARCH_PRCTL_ALLOWED)?)
        }
        // Every option but the opt-in: another option, or PR_SET_MEMORY_MERGE with 0 (the
        // kernel reads the option as an int, its argument as an unsigned long).
        ArgRule::PrctlNoMergeOptIn => Leaf::AllowIf(vec![
            rule(
                vec![cond(0, Len::Dword, Op::Ne, syscalls::PR_SET_MEMORY_MERGE)],
                name,
            )?,
            rule(
                vec![
                    cond(0, Len::Dword, Op::Eq, syscalls::PR_SET_MEMORY_MERGE),
                    cond(1, Len::Qword, Op::Eq, 0),
                ],
                name,
            )?,
        ]),
        // Every advice but MADV_MERGEABLE (an int to the kernel).
        ArgRule::MadviseNoMergeable => Leaf::AllowIf(vec![rule(
            vec![cond(2, Len::Dword, Op::Ne, syscalls::MADV_MERGEABLE)],
            name,
        )?]),
        ArgRule::FcntlAllowlist => Leaf::AllowElseSupervise {
            allow: one_of(name, 1, syscalls::FCNTL_ALLOWED)?,
            supervise: Some(one_of(name, 1, syscalls::FCNTL_LOCKS)?),
        },
        ArgRule::Lock => Leaf::AllowElseSupervise {
            // LOCK_UN, with or without LOCK_NB: letting go of a lock is always fine.
            allow: vec![rule(
                vec![cond(
                    1,
                    Len::Dword,
                    Op::MaskedEq(!(libc::LOCK_NB as u64) & 0xffff_ffff),
                    libc::LOCK_UN as u64,
                )],
                name,
            )?],
            supervise: None,
        },
        ArgRule::NoSharedAnonInZygote if zygote => Leaf::AllowIf(vec![
            // A file mapping (shared or not: the file is shared anyway), or a private one.
            rule(
                vec![cond(
                    3,
                    Len::Dword,
                    Op::MaskedEq(libc::MAP_ANONYMOUS as u64),
                    0,
                )],
                name,
            )?,
            rule(
                vec![cond(
                    3,
                    Len::Dword,
                    Op::MaskedEq(MAP_TYPE),
                    libc::MAP_PRIVATE as u64,
                )],
                name,
            )?,
        ]),
        ArgRule::NoSharedAnonInZygote => Leaf::Allow,
        ArgRule::Watch => Leaf::Watch,
        ArgRule::SelfOnly => Leaf::AllowIf(vec![rule(vec![cond(0, Len::Dword, Op::Eq, 0)], name)?]),
        // Prefork: each child has its own pid, so the supervisor checks the target (by pid).
        ArgRule::SelfPid if zygote => Leaf::Watch,
        ArgRule::SelfPid => Leaf::AllowIf(vec![rule(
            vec![cond(0, Len::Dword, Op::Eq, SELF_PID as u64)],
            name,
        )?]),
        ArgRule::WatchWrites(arg) => {
            // O_WRONLY | O_RDWR | O_CREAT | O_TRUNC: any of them asks to change the file.
            let write_bits = (libc::O_WRONLY | libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC) as u64;
            Leaf::AllowIfElseWatch(vec![rule(
                vec![cond(arg, Len::Dword, Op::MaskedEq(write_bits), 0)],
                name,
            )?])
        }
        ArgRule::NoListener => Leaf::AllowIf(vec![rule(
            vec![cond(
                1,
                Len::Dword,
                Op::MaskedEq(libc::SECCOMP_FILTER_FLAG_NEW_LISTENER),
                0,
            )],
            name,
        )?]),
    })
}

/// The clocks that read the wall clock: `CLOCK_REALTIME`, `CLOCK_REALTIME_COARSE`,
/// `CLOCK_REALTIME_ALARM`, `CLOCK_TAI` (which is the wall clock plus a constant).
pub const REALTIME_CLOCKS: [u64; 4] = [0, 5, 8, 11];

/// The monotonic clocks (`CLOCK_MONOTONIC`, `_RAW`, `_COARSE`, `CLOCK_BOOTTIME`,
/// `_BOOTTIME_ALARM`): read from the virtual monotonic clock under `clock = "virtual"`
/// (`answers/monotonic.rs`). The CPU-time clocks stay the kernel's.
pub const MONOTONIC_CLOCKS: [u64; 5] = [1, 4, 6, 7, 9];

/// The CPU-time clocks that are the caller's own, whichever its pid: `CLOCK_PROCESS_CPUTIME_ID`,
/// `CLOCK_THREAD_CPUTIME_ID`, the pid-encoded clocks of pid 0 (itself), and the tid-encoded
/// thread clocks (the kernel refuses a thread outside the caller's process). A process clock
/// naming a pid is left out: the kernel lets any process of the namespace be read.
pub const OWN_CPU_CLOCKS: [u64; 5] = [2, 3, 0xffff_fff8, 0xffff_fff9, 0xffff_fffa];

/// One rule per value: argument `arg` (an `unsigned int` to the kernel) equals one of `values`.
fn one_of(
    name: &'static str,
    arg: u8,
    values: &[(u64, &str)],
) -> Result<Vec<SeccompRule>, BpfError> {
    values
        .iter()
        .map(|&(v, _)| rule(vec![cond(arg, Len::Dword, Op::Eq, v)], name))
        .collect()
}

pub(crate) fn nr(name: &str) -> u32 {
    syscalls::number(name).unwrap_or_else(|| panic!("{name} is in the syscall table"))
}

/// The filter's leaf of each syscall under `policy` (numbers absent from the map are
/// violations): the base allowlist, then each knob's leaves (`rules/`), then the lists.
/// `initial_exec` is the address of the guest path that the child passes to `execve`: in
/// fallback mode that one exec is allowed by pointer (see docs/architecture.md).
/// `zygote`: prefork mode (signals are not pinned to one pid). `watch_reads` sends every open
/// to the supervisor (prefork, `reads_after_preload`).
pub fn leaves(
    policy: &Policy,
    mode: Mode,
    initial_exec: Option<u64>,
    zygote: bool,
    watch_reads: bool,
) -> Result<BTreeMap<u32, Leaf>, BpfError> {
    let mut map = BTreeMap::new();
    for a in syscalls::BASE_ALLOWLIST {
        map.insert(nr(a.name), arg_rules(a.name, a.rule, zygote)?);
    }
    let shape = super::rules::Shape {
        zygote,
        watch_reads,
        learn: false,
    };
    // The knobs' leaves (each knob writes its checks beside them, `rules/`).
    super::rules::knob_leaves(policy, mode, shape, &mut map)?;
    if policy.network.mode == NetworkMode::Allow {
        for n in syscalls::NETWORK.iter().chain(&["socketpair", "sendto"]) {
            map.insert(nr(n), Leaf::Allow);
        }
    }
    let clone_thread = libc::CLONE_THREAD as u64;
    match (policy.process.threads, policy.process.subprocess) {
        (Toggle::Allow, Toggle::Allow) => {
            map.insert(nr("clone"), Leaf::Allow);
        }
        (Toggle::Allow, Toggle::Deny) => {
            map.insert(
                nr("clone"),
                Leaf::AllowIf(vec![rule(
                    vec![cond(
                        0,
                        Len::Dword,
                        Op::MaskedEq(clone_thread),
                        clone_thread,
                    )],
                    "clone",
                )?]),
            );
        }
        (Toggle::Deny, Toggle::Allow) => {
            map.insert(
                nr("clone"),
                Leaf::AllowIf(vec![rule(
                    vec![cond(0, Len::Dword, Op::MaskedEq(clone_thread), 0)],
                    "clone",
                )?]),
            );
        }
        (Toggle::Deny, Toggle::Deny) => {}
    }
    if policy.process.subprocess == Toggle::Allow {
        map.insert(nr("fork"), Leaf::Allow);
        map.insert(nr("vfork"), Leaf::Allow);
    }
    if policy.process.exec == Toggle::Allow {
        map.insert(nr("execve"), Leaf::Allow);
        map.insert(nr("execveat"), Leaf::Allow);
    } else if let (Mode::Fallback, Some(ptr)) = (mode, initial_exec) {
        map.insert(
            nr("execve"),
            Leaf::AllowIf(vec![rule(
                vec![cond(0, Len::Qword, Op::Eq, ptr)],
                "execve",
            )?]),
        );
    }
    for a in &policy.syscalls.allow {
        map.insert(nr(&a.value.0), Leaf::Allow);
    }
    for d in &policy.syscalls.deny {
        map.remove(&nr(&d.value.0));
    }
    super::rules::memory::leaves(policy, mode, shape, &mut map)?;
    if watch_reads {
        // Prefork with `reads_after_preload = "deny"`: every open goes to the supervisor, which
        // lets the zygote's through and stops a session child's (a late import).
        for name in ["open", "openat", "openat2"] {
            if !policy.syscalls.denies(name) {
                map.insert(nr(name), Leaf::Watch);
            }
        }
    }
    map.insert(nr("clone3"), Leaf::Enosys);
    Ok(map)
}

/// The return value for a violation of syscall `nr` (in fallback mode it depends on the
/// category: privileged calls are denied even under `warn`).
fn violation_action(policy: &Policy, mode: Mode, nr: Option<u32>) -> u32 {
    if mode == Mode::Notify {
        return RET_USER_NOTIF;
    }
    let privileged = nr
        .and_then(syscalls::name)
        .is_none_or(|n| syscalls::category(n) == Category::Privilege);
    match policy.on_violation {
        OnViolation::Deny => RET_ERRNO | libc::EPERM as u32,
        OnViolation::Kill => RET_KILL_PROCESS,
        OnViolation::Warn if privileged => RET_ERRNO | libc::EPERM as u32,
        OnViolation::Warn => RET_LOG,
    }
}

/// Watched calls: the supervisor sees them in notify mode; Landlock alone decides otherwise.
fn watch_action(mode: Mode) -> u32 {
    match mode {
        Mode::Notify => RET_USER_NOTIF,
        Mode::Fallback => RET_ALLOW,
    }
}

fn stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// A run of syscall numbers `[start, end)` that share one leaf.
struct Range<'a> {
    start: u32,
    leaf: &'a Leaf,
    /// The syscall number when the range is a single syscall (for fallback categories).
    single: Option<u32>,
}

/// Compiles `policy` into a seccomp program for `mode`.
pub fn compile(
    policy: &Policy,
    mode: Mode,
    initial_exec: Option<u64>,
    zygote: bool,
    watch_reads: bool,
) -> Result<Vec<libc::sock_filter>, BpfError> {
    compile_with(policy, mode, initial_exec, zygote, watch_reads, emit_rules)
}

/// How a leaf's argument rules are laid out ([`emit_rules`]; the tests' reference layout).
type EmitRules = fn(&[SeccompRule], u32, &mut Vec<libc::sock_filter>);

/// [`compile`] with the argument rules laid out by `emit`.
fn compile_with(
    policy: &Policy,
    mode: Mode,
    initial_exec: Option<u64>,
    zygote: bool,
    watch_reads: bool,
    emit: EmitRules,
) -> Result<Vec<libc::sock_filter>, BpfError> {
    let decisions = leaves(policy, mode, initial_exec, zygote, watch_reads)?;
    let highest = super::syscall_table::X86_64.last().map_or(0, |&(_, n)| n);
    // Ranges over 0..=highest+1; the last one extends to the x32 bit.
    let mut ranges: Vec<Range> = Vec::with_capacity(256);
    for n in 0..=highest + 1 {
        let leaf = if n > highest {
            &Leaf::Violation
        } else {
            decisions.get(&n).unwrap_or(&Leaf::Violation)
        };
        // In fallback mode a violation's action depends on its syscall, so each denied
        // syscall is its own range there; in notify mode equal leaves merge.
        let mergeable = match leaf {
            Leaf::AllowIf(_)
            | Leaf::EnosysIf(_)
            | Leaf::AllowIfElseWatch(_)
            | Leaf::AllowElseSupervise { .. } => false,
            Leaf::Violation => mode == Mode::Notify || n > highest,
            _ => true,
        };
        if let Some(last) = ranges.last_mut()
            && mergeable
            && last.leaf == leaf
            && last.single.is_none()
        {
            continue;
        }
        ranges.push(Range {
            start: n,
            leaf,
            single: (!mergeable).then_some(n),
        });
    }

    let foreign = violation_action(policy, mode, None);
    let mut prog = vec![
        stmt(BPF_LD_W_ABS, 4), // seccomp_data.arch
        jump(BPF_JMP_JEQ_K, AUDIT_ARCH_X86_64, 1, 0),
        stmt(BPF_RET_K, foreign),
        stmt(BPF_LD_W_ABS, 0), // seccomp_data.nr
        jump(BPF_JMP_JGE_K, X32_SYSCALL_BIT, 0, 1),
        stmt(BPF_RET_K, foreign),
    ];
    emit_tree(policy, mode, &ranges, &mut prog, emit)?;
    if prog.len() > 4096 {
        return Err(BpfError::TooLarge(prog.len()));
    }
    Ok(prog)
}

/// Emits a binary search over `ranges` (sorted by start; the first starts at 0) at the end of
/// `out`. The accumulator holds the syscall number on entry; every path ends in a RET.
fn emit_tree(
    policy: &Policy,
    mode: Mode,
    ranges: &[Range],
    out: &mut Vec<libc::sock_filter>,
    emit: EmitRules,
) -> Result<(), BpfError> {
    if ranges.len() == 1 {
        return emit_leaf(policy, mode, &ranges[0], out, emit);
    }
    let mid = ranges.len() / 2;
    let k = ranges[mid].start;
    let at = out.len();
    out.push(jump(BPF_JMP_JGE_K, k, 0, 0)); // patched once the left subtree's size is known
    emit_tree(policy, mode, &ranges[..mid], out, emit)?;
    let left = out.len() - at - 1;
    match u8::try_from(left) {
        Ok(skip) => out[at].jt = skip, // >= k: jump over the left subtree
        Err(_) => {
            // Too far for a conditional jump: go through an unconditional one.
            out[at].jf = 1;
            out.insert(at + 1, stmt(BPF_JMP_JA, left as u32));
        }
    }
    emit_tree(policy, mode, &ranges[mid..], out, emit)
}

fn emit_leaf(
    policy: &Policy,
    mode: Mode,
    range: &Range,
    out: &mut Vec<libc::sock_filter>,
    emit_rules: EmitRules,
) -> Result<(), BpfError> {
    let violation = violation_action(policy, mode, range.single);
    match range.leaf {
        Leaf::Allow => out.push(stmt(BPF_RET_K, RET_ALLOW)),
        Leaf::Enosys => out.push(stmt(BPF_RET_K, RET_ERRNO | libc::ENOSYS as u32)),
        Leaf::Violation => out.push(stmt(BPF_RET_K, violation)),
        Leaf::Watch => out.push(stmt(BPF_RET_K, watch_action(mode))),
        Leaf::AllowElseSupervise { allow, supervise } => {
            // Supervised: the supervisor judges it; without one it is not safe to let through.
            let supervised = match mode {
                Mode::Notify => RET_USER_NOTIF,
                Mode::Fallback => violation,
            };
            emit_rules(allow, RET_ALLOW, out);
            match supervise {
                Some(rules) => {
                    emit_rules(rules, supervised, out);
                    out.push(stmt(BPF_RET_K, violation));
                }
                None => out.push(stmt(BPF_RET_K, supervised)),
            }
        }
        Leaf::AllowIf(rules) | Leaf::EnosysIf(rules) | Leaf::AllowIfElseWatch(rules) => {
            let on_match = match range.leaf {
                Leaf::EnosysIf(_) => RET_ERRNO | libc::ENOSYS as u32,
                _ => RET_ALLOW,
            };
            let otherwise = match range.leaf {
                Leaf::AllowIfElseWatch(_) => watch_action(mode),
                _ => violation,
            };
            emit_rules(rules, on_match, out);
            out.push(stmt(BPF_RET_K, otherwise));
        }
    }
    Ok(())
}

/// Each rule followed by `RET on_match`: a seccompiler rule falls through when it matches and
/// jumps past the instruction that follows it when it does not. Shorter than seccompiler lays
/// it out (the kernel converts and JIT-compiles every instruction at each install): its two
/// leading jumps (enter the rule; leave it, for a layout that jumps into rules from elsewhere)
/// are dropped, since here nothing jumps but forward and within, and a run of one-value rules
/// on the same argument word (`one_of`: the ioctl, fcntl, prctl... allowlists) becomes one
/// load, one comparison per value and one shared `RET on_match`. `tests` hold the result to
/// [`emit_rules_plain`]'s decisions.
fn emit_rules(rules: &[SeccompRule], on_match: u32, out: &mut Vec<libc::sock_filter>) {
    let codes: Vec<Vec<libc::sock_filter>> = rules.iter().map(rule_code).collect();
    let mut i = 0;
    while i < codes.len() {
        // The longest run from `i` of rules that are `LD word; JEQ value (0, 1)` on one word.
        let word = one_value(&codes[i]).map(|(off, _)| off);
        let run = match word {
            Some(off) => codes[i..]
                .iter()
                .take(MAX_ONE_VALUE_RUN)
                .take_while(|c| one_value(c).is_some_and(|(o, _)| o == off))
                .count(),
            None => 0,
        };
        if run < 2 {
            out.extend_from_slice(&codes[i]);
            out.push(stmt(BPF_RET_K, on_match));
            i += 1;
            continue;
        }
        out.push(codes[i][0]); // LD word
        for (n, c) in codes[i..i + run].iter().enumerate() {
            let (_, value) = one_value(c).expect("checked above");
            let last = n + 1 == run;
            // A match jumps to the shared RET after the last comparison; the last one's
            // mismatch jumps over it, to what follows (as each rule's did).
            let (jt, jf) = if last {
                (0, 1)
            } else {
                ((run - n - 1) as u8, 0)
            };
            out.push(jump(BPF_JMP_JEQ_K, value, jt, jf));
        }
        out.push(stmt(BPF_RET_K, on_match));
        i += run;
    }
}

/// The most one-value rules merged into one run (a conditional jump reaches 255 ahead).
const MAX_ONE_VALUE_RUN: usize = 200;

/// A seccompiler rule's instructions without its two leading jumps (see [`emit_rules`]).
fn rule_code(r: &SeccompRule) -> Vec<libc::sock_filter> {
    let code: seccompiler::BpfProgram = r.clone().into();
    let mut code: Vec<libc::sock_filter> = code
        .into_iter()
        .map(|i| libc::sock_filter {
            code: i.code,
            jt: i.jt,
            jf: i.jf,
            k: i.k,
        })
        .collect();
    let entry_exit = code.len() > 2
        && (code[0].code, code[0].k) == (BPF_JMP_JA, 1)
        && code[1].code == BPF_JMP_JA;
    if entry_exit {
        code.drain(..2);
    }
    code
}

/// `(offset, value)` when `code` is exactly `LD [offset]; JEQ value, 0, 1` (a one-condition
/// rule: an argument's word equals a value).
fn one_value(code: &[libc::sock_filter]) -> Option<(u32, u32)> {
    match code {
        [ld, eq] if ld.code == BPF_LD_W_ABS && (eq.code, eq.jt, eq.jf) == (BPF_JMP_JEQ_K, 0, 1) => {
            Some((ld.k, eq.k))
        }
        _ => None,
    }
}

/// seccompiler's layout of [`emit_rules`]: each rule as it compiles it, then `RET on_match`.
/// The reference the shorter layout is tested against.
#[cfg(test)]
fn emit_rules_plain(rules: &[SeccompRule], on_match: u32, out: &mut Vec<libc::sock_filter>) {
    for r in rules {
        let code: seccompiler::BpfProgram = r.clone().into();
        out.extend(code.into_iter().map(|i| libc::sock_filter {
            code: i.code,
            jt: i.jt,
            jf: i.jf,
            k: i.k,
        }));
        out.push(stmt(BPF_RET_K, on_match));
    }
}

/// Stacked on the guest's filter under `limits.disk`: `sendmsg` and `sendmmsg` fail with
/// EPERM. A descriptor sent over the guest's own socket pair (`SCM_RIGHTS`) and closed keeps
/// its file alive in the message in flight, where no sample of the disk account can see it;
/// a filter cannot read a message's control data, so under `limits.disk` the guest sends with
/// `send`/`sendto` only. Not reported (the guest's filter allowed the call; the stricter
/// answer of the two wins). Other architectures pass here: the guest's filter refuses them.
pub fn no_send_fds() -> Vec<libc::sock_filter> {
    vec![
        stmt(BPF_LD_W_ABS, 4), // seccomp_data.arch
        jump(BPF_JMP_JEQ_K, AUDIT_ARCH_X86_64, 0, 3),
        stmt(BPF_LD_W_ABS, 0), // seccomp_data.nr
        jump(BPF_JMP_JEQ_K, libc::SYS_sendmsg as u32, 2, 0),
        jump(BPF_JMP_JEQ_K, libc::SYS_sendmmsg as u32, 1, 0),
        stmt(BPF_RET_K, RET_ALLOW),
        stmt(BPF_RET_K, RET_ERRNO | libc::EPERM as u32),
    ]
}

/// A classic-BPF interpreter for the subset this compiler emits; used by tests to check the
/// program's decisions without installing it.
pub fn evaluate(prog: &[libc::sock_filter], arch: u32, nr: u32, args: [u64; 6]) -> u32 {
    let mut data = [0u8; 64];
    data[0..4].copy_from_slice(&nr.to_ne_bytes());
    data[4..8].copy_from_slice(&arch.to_ne_bytes());
    for (i, a) in args.iter().enumerate() {
        data[16 + i * 8..24 + i * 8].copy_from_slice(&a.to_ne_bytes());
    }
    let mut acc: u32 = 0;
    let mut pc = 0usize;
    while pc < prog.len() {
        let i = prog[pc];
        match i.code {
            BPF_LD_W_ABS => {
                let o = i.k as usize;
                acc = u32::from_ne_bytes(data[o..o + 4].try_into().unwrap());
            }
            0x54 => acc &= i.k, // ALU AND K
            BPF_JMP_JA => {
                pc += i.k as usize;
            }
            BPF_JMP_JEQ_K | 0x25 | BPF_JMP_JGE_K | 0x45 => {
                let taken = match i.code {
                    BPF_JMP_JEQ_K => acc == i.k,
                    0x25 => acc > i.k,
                    BPF_JMP_JGE_K => acc >= i.k,
                    _ => acc & i.k != 0,
                };
                pc += if taken { i.jt } else { i.jf } as usize;
            }
            BPF_RET_K => return i.k,
            other => panic!("unsupported BPF opcode {other:#x} at {pc}"),
        }
        pc += 1;
    }
    panic!("program fell off the end")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{self, ClockMode};

    fn run(prog: &[libc::sock_filter], name: &str, args: [u64; 6]) -> u32 {
        evaluate(prog, AUDIT_ARCH_X86_64, nr(name), args)
    }

    #[test]
    fn under_the_virtual_clock_only_the_callers_own_cpu_clocks_stay_in_the_kernel() {
        let mut p = policy::load("strict").unwrap();
        p.time.clock = ClockMode::Virtual;
        let prog = compile(&p, Mode::Notify, None, false, false).unwrap();
        let clock = |id: i64| {
            run(
                &prog,
                "clock_gettime",
                [id as u32 as u64, 0x1000, 0, 0, 0, 0],
            )
        };
        // CLOCK_PROCESS_CPUTIME_ID, _THREAD_; pid 0's process clocks; thread clocks.
        for own in [2, 3, -8, -7, -6, -12, -11, -10, (!1234 << 3) | 6] {
            assert_eq!(clock(own), RET_ALLOW, "clockid {own}");
        }
        // Wall and monotonic clocks; pid 1's and pid 1234's process clocks; a descriptor's.
        for other in [0, 1, 7, 11, (!1 << 3) | 2, (!1234 << 3), (!3 << 3) | 3] {
            assert_eq!(clock(other), RET_USER_NOTIF, "clockid {other}");
        }
    }

    #[test]
    fn no_send_fds_refuses_sendmsg_and_sendmmsg_only() {
        let prog = no_send_fds();
        let eperm = RET_ERRNO | libc::EPERM as u32;
        assert_eq!(run(&prog, "sendmsg", [0; 6]), eperm);
        assert_eq!(run(&prog, "sendmmsg", [0; 6]), eperm);
        for other in ["sendto", "write", "recvmsg"] {
            assert_eq!(run(&prog, other, [0; 6]), RET_ALLOW, "{other}");
        }
        // Another architecture passes: the guest's own filter refuses it.
        let sendmsg = libc::SYS_sendmsg as u32;
        assert_eq!(evaluate(&prog, 0x4000_0003, sendmsg, [0; 6]), RET_ALLOW);
    }

    #[test]
    #[allow(clippy::unnecessary_cast)] // libc's ioctl numbers: c_ulong on glibc, c_int on musl
    fn default_policy_decisions() {
        let p = policy::load("default").unwrap();
        let prog = compile(&p, Mode::Notify, None, false, false).unwrap();
        // (613 with the same-page merging opt-in refused in prctl and madvise.)
        assert!(prog.len() < 640, "program has {} instructions", prog.len());
        assert_eq!(run(&prog, "read", [0; 6]), RET_ALLOW);
        assert_eq!(run(&prog, "openat", [0; 6]), RET_ALLOW);
        assert_eq!(run(&prog, "socket", [2, 1, 0, 0, 0, 0]), RET_USER_NOTIF);
        assert_eq!(run(&prog, "connect", [3, 0, 0, 0, 0, 0]), RET_USER_NOTIF);
        assert_eq!(run(&prog, "execve", [0; 6]), RET_USER_NOTIF);
        assert_eq!(
            run(&prog, "clone", [libc::CLONE_THREAD as u64, 0, 0, 0, 0, 0]),
            RET_USER_NOTIF
        );
        assert_eq!(
            run(&prog, "clone3", [0; 6]),
            RET_ERRNO | libc::ENOSYS as u32
        );
        assert_eq!(run(&prog, "bpf", [0; 6]), RET_USER_NOTIF);
        assert_eq!(run(&prog, "nanosleep", [0; 6]), RET_ALLOW);
        assert_eq!(run(&prog, "getrandom", [0; 6]), RET_ALLOW);
        // socketpair: AF_UNIX stream (with CLOEXEC) allowed, datagram not.
        let unix = libc::AF_UNIX as u64;
        let stream_cloexec = (libc::SOCK_STREAM | libc::SOCK_CLOEXEC) as u64;
        assert_eq!(
            run(&prog, "socketpair", [unix, stream_cloexec, 0, 0, 0, 0]),
            RET_ALLOW
        );
        assert_eq!(
            run(
                &prog,
                "socketpair",
                [unix, libc::SOCK_DGRAM as u64, 0, 0, 0, 0]
            ),
            RET_USER_NOTIF
        );
        assert_eq!(
            run(&prog, "socketpair", [libc::AF_INET as u64, 1, 0, 0, 0, 0]),
            RET_USER_NOTIF
        );
        // sendto: only without a destination.
        assert_eq!(run(&prog, "sendto", [3, 0x1000, 10, 0, 0, 0]), RET_ALLOW);
        assert_eq!(
            run(&prog, "sendto", [3, 0x1000, 10, 0, 0x7fff_0000_1000, 16]),
            RET_USER_NOTIF
        );
        // ioctl: TIOCSTI is not allowed.
        assert_eq!(
            run(&prog, "ioctl", [0, libc::TCGETS as u64, 0, 0, 0, 0]),
            RET_ALLOW
        );
        assert_eq!(
            run(&prog, "ioctl", [0, libc::TIOCSTI as u64, 0, 0, 0, 0]),
            RET_USER_NOTIF
        );
        // seccomp: no listener.
        assert_eq!(run(&prog, "seccomp", [1, 0, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(run(&prog, "seccomp", [1, 8, 0, 0, 0, 0]), RET_USER_NOTIF);
        // prlimit64 on itself only.
        assert_eq!(run(&prog, "prlimit64", [0, 7, 0x1000, 0, 0, 0]), RET_ALLOW);
        assert_eq!(
            run(&prog, "prlimit64", [1234, 7, 0x1000, 0, 0, 0]),
            RET_USER_NOTIF
        );
        // Opens: read-only stays in the kernel, write intent goes to the supervisor.
        let rdonly = libc::O_RDONLY as u64 | libc::O_CLOEXEC as u64;
        let wr = (libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC) as u64;
        assert_eq!(
            run(&prog, "openat", [0, 0x1000, rdonly, 0, 0, 0]),
            RET_ALLOW
        );
        assert_eq!(
            run(&prog, "openat", [0, 0x1000, wr, 0o644, 0, 0]),
            RET_USER_NOTIF
        );
        assert_eq!(
            run(&prog, "open", [0x1000, libc::O_RDWR as u64, 0, 0, 0, 0]),
            RET_USER_NOTIF
        );
        assert_eq!(
            run(&prog, "unlink", [0x1000, 0, 0, 0, 0, 0]),
            RET_USER_NOTIF
        );
        let fallback = compile(&p, Mode::Fallback, None, false, false).unwrap();
        assert_eq!(
            run(&fallback, "openat", [0, 0x1000, wr, 0o644, 0, 0]),
            RET_ALLOW
        );
        assert_eq!(run(&fallback, "unlink", [0x1000, 0, 0, 0, 0, 0]), RET_ALLOW);
        // Foreign architecture and x32.
        assert_eq!(evaluate(&prog, 0x4000_0003, 0, [0; 6]), RET_USER_NOTIF);
        assert_eq!(
            evaluate(&prog, AUDIT_ARCH_X86_64, X32_SYSCALL_BIT | 41, [0; 6]),
            RET_USER_NOTIF
        );
        assert_eq!(
            evaluate(&prog, AUDIT_ARCH_X86_64, 10_000, [0; 6]),
            RET_USER_NOTIF
        );
    }

    #[test]
    fn no_policy_lets_a_guest_opt_into_same_page_merging() {
        let eperm = RET_ERRNO | libc::EPERM as u32;
        for name in ["default", "strict", "permissive", "temporal-python"] {
            let p = policy::load(name).unwrap();
            for zygote in [false, true] {
                let notify = compile(&p, Mode::Notify, None, zygote, false).unwrap();
                let fallback = compile(&p, Mode::Fallback, None, zygote, false).unwrap();
                for (prog, refused) in [(&notify, RET_USER_NOTIF), (&fallback, eperm)] {
                    let case = format!("{name} zygote={zygote} refused={refused:#x}");
                    // PR_SET_MEMORY_MERGE, 1 (or any non-zero value, high bits included).
                    for on in [1, 2, 1 << 32] {
                        assert_eq!(run(prog, "prctl", [67, on, 0, 0, 0, 0]), refused, "{case}");
                    }
                    // The option is an int: high bits do not hide it.
                    assert_eq!(
                        run(prog, "prctl", [(1 << 32) | 67, 1, 0, 0, 0, 0]),
                        refused,
                        "{case}"
                    );
                    assert_eq!(run(prog, "madvise", [0x1000, 4096, 12, 0, 0, 0]), refused);
                    assert_eq!(
                        run(prog, "madvise", [0x1000, 4096, (1 << 32) | 12, 0, 0, 0]),
                        refused
                    );
                    // Opting out, asking, and every other option or advice run.
                    assert_eq!(run(prog, "prctl", [67, 0, 0, 0, 0, 0]), RET_ALLOW);
                    assert_eq!(run(prog, "prctl", [68, 0, 0, 0, 0, 0]), RET_ALLOW);
                    assert_eq!(run(prog, "prctl", [15, 0x1000, 0, 0, 0, 0]), RET_ALLOW);
                    for advice in [4, 13, 14, 25] {
                        assert_eq!(
                            run(prog, "madvise", [0x1000, 4096, advice, 0, 0, 0]),
                            RET_ALLOW,
                            "{case} advice {advice}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn every_number_is_decided_like_the_table() {
        let p = policy::load("default").unwrap();
        let d = leaves(&p, Mode::Notify, None, false, false).unwrap();
        let prog = compile(&p, Mode::Notify, None, false, false).unwrap();
        for n in 0..600u32 {
            let got = evaluate(&prog, AUDIT_ARCH_X86_64, n, [0; 6]);
            let want = match d.get(&n) {
                Some(Leaf::Allow) => RET_ALLOW,
                Some(Leaf::Enosys) => RET_ERRNO | libc::ENOSYS as u32,
                Some(
                    Leaf::AllowIf(_)
                    | Leaf::EnosysIf(_)
                    | Leaf::AllowIfElseWatch(_)
                    | Leaf::AllowElseSupervise { .. },
                ) => continue, // by arguments: tested above
                Some(Leaf::Violation | Leaf::Watch) | None => RET_USER_NOTIF,
            };
            assert_eq!(got, want, "syscall {n} ({:?})", syscalls::name(n));
        }
    }

    /// The shorter layout of argument rules ([`emit_rules`]) decides every call as
    /// seccompiler's own ([`emit_rules_plain`]) does: every built-in policy, both modes, plain
    /// and prefork, every syscall number (and the x32 and foreign-ABI paths), and for the
    /// numbers with argument rules each argument set to each constant either program compares
    /// with (as is, in the high word, with bits around it) plus mixed vectors of them.
    #[test]
    fn the_shorter_rule_layout_decides_every_call_as_seccompilers() {
        let mut shorter = 0;
        for &(name, _) in policy::BUILTINS {
            let p = policy::load(name).unwrap();
            for (mode, zygote, watch) in [
                (Mode::Notify, false, false),
                (Mode::Notify, true, false),
                (Mode::Notify, true, true),
                (Mode::Fallback, false, false),
                (Mode::Fallback, true, false),
            ] {
                let exec = (mode == Mode::Fallback).then_some(0x7f00_1234_5678);
                let new = compile(&p, mode, exec, zygote, watch).unwrap();
                let plain = compile_with(&p, mode, exec, zygote, watch, emit_rules_plain).unwrap();
                assert!(new.len() <= plain.len(), "{name} {mode:?}");
                if mode == Mode::Notify && !zygote {
                    shorter += plain.len() - new.len();
                }
                let mut values: Vec<u64> = vec![0, 1, u64::MAX, 0xffff_ffff, 1 << 32];
                for i in new.iter().chain(&plain) {
                    let k = u64::from(i.k);
                    values.extend([k, k << 32, k | 1 << 32, k ^ 1, k | 0x80, !k & 0xffff_ffff]);
                }
                if let Some(p) = exec {
                    values.extend([p, p ^ 1, p & 0xffff_ffff, p >> 32]);
                }
                values.sort_unstable();
                values.dedup();
                let ruled = leaves(&p, mode, exec, zygote, watch).unwrap();
                let decide = |arch: u32, nr: u32, args: [u64; 6]| {
                    let (a, b) = (
                        evaluate(&new, arch, nr, args),
                        evaluate(&plain, arch, nr, args),
                    );
                    assert_eq!(a, b, "{name} {mode:?} zygote {zygote}: nr {nr} {args:x?}");
                };
                decide(0x4000_0003, 1, [0; 6]); // i386
                decide(AUDIT_ARCH_X86_64, X32_SYSCALL_BIT | 1, [0; 6]);
                let mut seed = 0x9e37_79b9_7f4a_7c15u64;
                for nr in 0..600u32 {
                    decide(AUDIT_ARCH_X86_64, nr, [0; 6]);
                    let with_rules = !matches!(
                        ruled.get(&nr),
                        None | Some(Leaf::Allow | Leaf::Enosys | Leaf::Violation | Leaf::Watch)
                    );
                    if !with_rules {
                        continue;
                    }
                    for arg in 0..6 {
                        for &v in &values {
                            let mut args = [0; 6];
                            args[arg] = v;
                            decide(AUDIT_ARCH_X86_64, nr, args);
                        }
                    }
                    for _ in 0..256 {
                        let mut args = [0; 6];
                        for a in &mut args {
                            seed ^= seed << 13;
                            seed ^= seed >> 7;
                            seed ^= seed << 17;
                            *a = values[(seed % values.len() as u64) as usize];
                        }
                        decide(AUDIT_ARCH_X86_64, nr, args);
                    }
                }
            }
        }
        assert!(shorter > 0, "the shorter layout saves nothing");
    }

    #[test]
    fn fallback_tree_with_long_jumps_decides_every_number() {
        // In fallback mode each denied syscall is its own range: the tree is big enough that
        // the root's left subtree needs an unconditional jump.
        let p = policy::load("default").unwrap();
        let d = leaves(&p, Mode::Fallback, None, false, false).unwrap();
        let prog = compile(&p, Mode::Fallback, None, false, false).unwrap();
        assert!(
            prog.iter().any(|i| i.code == BPF_JMP_JA),
            "a long jump was needed"
        );
        for n in 0..600u32 {
            let got = evaluate(&prog, AUDIT_ARCH_X86_64, n, [0; 6]);
            match d.get(&n) {
                Some(Leaf::Allow | Leaf::Watch) => assert_eq!(got, RET_ALLOW, "syscall {n}"),
                Some(Leaf::Enosys) => {
                    assert_eq!(got, RET_ERRNO | libc::ENOSYS as u32, "syscall {n}")
                }
                Some(
                    Leaf::AllowIf(_)
                    | Leaf::EnosysIf(_)
                    | Leaf::AllowIfElseWatch(_)
                    | Leaf::AllowElseSupervise { .. },
                ) => {}
                Some(Leaf::Violation) | None => {
                    assert_ne!(got, RET_ALLOW, "syscall {n} ({:?})", syscalls::name(n))
                }
            }
        }
    }

    #[test]
    fn strict_and_fallback() {
        let p = policy::load("strict").unwrap();
        let prog = compile(&p, Mode::Fallback, Some(0xdead_beef_0000), false, false).unwrap();
        let eperm = RET_ERRNO | libc::EPERM as u32;
        assert_eq!(run(&prog, "nanosleep", [0; 6]), eperm);
        assert_eq!(run(&prog, "getrandom", [0x1000, 16, 0, 0, 0, 0]), eperm);
        let nonblock = libc::GRND_NONBLOCK as u64;
        assert_eq!(
            run(&prog, "getrandom", [0x1000, 8, nonblock, 0, 0, 0]),
            RET_ERRNO | libc::ENOSYS as u32
        );
        assert_eq!(
            run(&prog, "getrandom", [0x1000, 2496, nonblock, 0, 0, 0]),
            eperm
        );
        assert_eq!(
            run(&prog, "execve", [0xdead_beef_0000, 0, 0, 0, 0, 0]),
            RET_ALLOW
        );
        assert_eq!(
            run(&prog, "execve", [0xdead_beef_0008, 0, 0, 0, 0, 0]),
            eperm
        );
        assert_eq!(evaluate(&prog, 0x4000_0003, 0, [0; 6]), eperm);
        let mut killing = p.clone();
        killing.on_violation = OnViolation::Kill;
        let prog = compile(&killing, Mode::Fallback, None, false, false).unwrap();
        assert_eq!(run(&prog, "socket", [0; 6]), RET_KILL_PROCESS);
        assert_eq!(run(&prog, "read", [0; 6]), RET_ALLOW);
    }

    #[test]
    fn permissive_warns_but_denies_privileged_calls_in_fallback() {
        let p = policy::load("permissive").unwrap();
        let prog = compile(&p, Mode::Fallback, None, false, false).unwrap();
        assert_eq!(run(&prog, "socket", [0; 6]), RET_LOG);
        assert_eq!(run(&prog, "bpf", [0; 6]), RET_ERRNO | libc::EPERM as u32);
    }

    #[test]
    fn knobs() {
        let mut p = policy::load("default").unwrap();
        p.process.threads = Toggle::Allow;
        let prog = compile(&p, Mode::Notify, None, false, false).unwrap();
        let t = libc::CLONE_THREAD as u64 | libc::CLONE_VM as u64;
        assert_eq!(run(&prog, "clone", [t, 0, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(
            run(&prog, "clone", [libc::SIGCHLD as u64, 0, 0, 0, 0, 0]),
            RET_USER_NOTIF
        );
    }

    const EPERM: u32 = RET_ERRNO | libc::EPERM as u32;

    #[test]
    #[allow(clippy::unnecessary_cast)] // libc's ioctl numbers: c_ulong on glibc, c_int on musl
    fn ioctl_is_an_allowlist() {
        let p = policy::load("default").unwrap();
        for mode in [Mode::Notify, Mode::Fallback] {
            let prog = compile(&p, mode, None, false, false).unwrap();
            let denied = if mode == Mode::Notify {
                RET_USER_NOTIF
            } else {
                EPERM
            };
            for &(req, name) in syscalls::IOCTL_ALLOWED {
                assert_eq!(
                    run(&prog, "ioctl", [1, req, 0, 0, 0, 0]),
                    RET_ALLOW,
                    "{name}"
                );
                // The kernel reads an unsigned int: high bits do not change the request.
                assert_eq!(
                    run(&prog, "ioctl", [1, req | 0xffff_ffff_0000_0000, 0, 0, 0, 0]),
                    RET_ALLOW,
                    "{name} with high bits"
                );
            }
            for req in [
                libc::TIOCSTI as u64,
                libc::TCSETS as u64,
                libc::FIOASYNC as u64,
                0x4008_6602, // FS_IOC_SETFLAGS
                0x401c_5820, // FS_IOC_FSSETXATTR
                0x8008_6601, // FS_IOC_GETFLAGS
                libc::SIOCGIFCONF as u64,
                0x4004_9409, // FICLONE
            ] {
                assert_eq!(
                    run(&prog, "ioctl", [1, req, 0, 0, 0, 0]),
                    denied,
                    "{req:#x}"
                );
            }
        }
        // The table agrees with the C headers where libc has them.
        for (v, n) in [
            (libc::TCGETS as u64, "TCGETS"),
            (libc::TCGETS2 as u64, "TCGETS2"),
            (libc::TIOCGPGRP as u64, "TIOCGPGRP"),
            (libc::TIOCGWINSZ as u64, "TIOCGWINSZ"),
            (libc::FIONREAD as u64, "FIONREAD"),
            (libc::FIONBIO as u64, "FIONBIO"),
            (libc::FIONCLEX as u64, "FIONCLEX"),
            (libc::FIOCLEX as u64, "FIOCLEX"),
            (libc::TIOCSTI as u64, "TIOCSTI"),
            (libc::FIOASYNC as u64, "FIOASYNC"),
            (libc::SIOCGIFCONF as u64, "SIOCGIFCONF"),
            (libc::TIOCSPGRP as u64, "TIOCSPGRP"),
        ] {
            assert_eq!(syscalls::ioctl_name(v), Some(n));
        }
    }

    #[test]
    fn fcntl_is_an_allowlist_and_locks_are_supervised() {
        let p = policy::load("default").unwrap();
        let notify = compile(&p, Mode::Notify, None, false, false).unwrap();
        let fallback = compile(&p, Mode::Fallback, None, false, false).unwrap();
        for &(cmd, name) in syscalls::FCNTL_ALLOWED {
            assert_eq!(
                run(&notify, "fcntl", [3, cmd, 0, 0, 0, 0]),
                RET_ALLOW,
                "{name}"
            );
            assert_eq!(
                run(&fallback, "fcntl", [3, cmd, 0, 0, 0, 0]),
                RET_ALLOW,
                "{name}"
            );
        }
        for &(cmd, name) in syscalls::FCNTL_LOCKS {
            assert_eq!(
                run(&notify, "fcntl", [3, cmd, 0x1000, 0, 0, 0]),
                RET_USER_NOTIF,
                "{name} goes to the supervisor"
            );
            assert_eq!(
                run(&fallback, "fcntl", [3, cmd, 0x1000, 0, 0, 0]),
                EPERM,
                "{name} is denied without one"
            );
        }
        for cmd in [
            libc::F_SETLEASE,
            libc::F_NOTIFY,
            libc::F_SETPIPE_SZ,
            libc::F_SETOWN,
            15, // F_SETOWN_EX
            10, // F_SETSIG
            libc::F_ADD_SEALS,
        ] {
            assert_eq!(
                run(&notify, "fcntl", [3, cmd as u64, 0, 0, 0, 0]),
                RET_USER_NOTIF
            );
            assert_eq!(run(&fallback, "fcntl", [3, cmd as u64, 0, 0, 0, 0]), EPERM);
        }
        // flock: unlocking stays in the kernel, locking is supervised (denied in fallback).
        let (un, ex, nb) = (
            libc::LOCK_UN as u64,
            libc::LOCK_EX as u64,
            libc::LOCK_NB as u64,
        );
        for prog in [&notify, &fallback] {
            assert_eq!(run(prog, "flock", [3, un, 0, 0, 0, 0]), RET_ALLOW);
            assert_eq!(run(prog, "flock", [3, un | nb, 0, 0, 0, 0]), RET_ALLOW);
        }
        assert_eq!(
            run(&notify, "flock", [3, ex | nb, 0, 0, 0, 0]),
            RET_USER_NOTIF
        );
        assert_eq!(run(&fallback, "flock", [3, ex, 0, 0, 0, 0]), EPERM);
        // Even under warn, a fallback program does not let a lease or a notify through.
        let warn = policy::load("permissive").unwrap();
        let prog = compile(&warn, Mode::Fallback, None, false, false).unwrap();
        assert_eq!(
            run(&prog, "fcntl", [3, libc::F_SETLEASE as u64, 1, 0, 0, 0]),
            EPERM
        );
        assert_eq!(run(&prog, "ioctl", [3, 0x4008_6602, 0, 0, 0, 0]), EPERM);
    }

    #[test]
    fn memfd_and_sysv_ipc_are_denied() {
        let p = policy::load("default").unwrap();
        let prog = compile(&p, Mode::Notify, None, true, false).unwrap();
        for name in [
            "memfd_create",
            "shmget",
            "shmat",
            "msgget",
            "semget",
            "mq_open",
            "memfd_secret",
        ] {
            assert_eq!(run(&prog, name, [0; 6]), RET_USER_NOTIF, "{name}");
        }
    }

    #[test]
    fn shared_anonymous_memory_is_refused_in_a_zygote_only() {
        let p = policy::load("default").unwrap();
        let anon = libc::MAP_ANONYMOUS as u64;
        let (shared, private) = (libc::MAP_SHARED as u64, libc::MAP_PRIVATE as u64);
        let validate = libc::MAP_SHARED_VALIDATE as u64;
        let rw = (libc::PROT_READ | libc::PROT_WRITE) as u64;
        let mmap = |flags: u64, fd: u64| [0, 4096, rw, flags, fd, 0];
        let zygote = compile(&p, Mode::Notify, None, true, false).unwrap();
        let zygote_fb = compile(&p, Mode::Fallback, None, true, false).unwrap();
        let run_prog = compile(&p, Mode::Notify, None, false, false).unwrap();
        for flags in [shared | anon, validate | anon] {
            // mmap.mmap(-1, 4096): MAP_SHARED|MAP_ANONYMOUS, fd -1.
            assert_eq!(run(&zygote, "mmap", mmap(flags, u64::MAX)), RET_USER_NOTIF);
            assert_eq!(run(&zygote_fb, "mmap", mmap(flags, u64::MAX)), EPERM);
            assert_eq!(run(&run_prog, "mmap", mmap(flags, u64::MAX)), RET_ALLOW);
        }
        for (flags, fd) in [
            (private | anon, u64::MAX),
            (private | anon | libc::MAP_NORESERVE as u64, u64::MAX),
            (private, 3),
            (shared, 3), // a file: shared through the file anyway
        ] {
            assert_eq!(
                run(&zygote, "mmap", mmap(flags, fd)),
                RET_ALLOW,
                "{flags:#x}"
            );
        }
    }

    #[test]
    fn large_private_mappings_are_evidence_for_the_memory_limit() {
        let p = policy::load("default").unwrap(); // memory = 1GiB: a sixteenth is 64 MiB
        let anon = libc::MAP_ANONYMOUS as u64;
        let (shared, private) = (libc::MAP_SHARED as u64, libc::MAP_PRIVATE as u64);
        let mmap = |len: u64, flags: u64| [0, len, 3, flags, u64::MAX, 0];
        let notify = compile(&p, Mode::Notify, None, false, false).unwrap();
        let fallback = compile(&p, Mode::Fallback, None, false, false).unwrap();
        let zygote = compile(&p, Mode::Notify, None, true, false).unwrap();
        let big = 512 << 20;
        assert_eq!(
            run(&notify, "mmap", mmap(big, private | anon)),
            RET_USER_NOTIF
        );
        assert_eq!(run(&notify, "mmap", mmap(4096, private | anon)), RET_ALLOW);
        assert_eq!(run(&notify, "mmap", mmap(big, shared | anon)), RET_ALLOW);
        assert_eq!(
            run(&notify, "mremap", [0, 4096, big, 1, 0, 0]),
            RET_USER_NOTIF
        );
        assert_eq!(run(&notify, "mremap", [0, 4096, 8192, 1, 0, 0]), RET_ALLOW);
        assert_eq!(run(&fallback, "mmap", mmap(big, private | anon)), RET_ALLOW);
        assert_eq!(run(&zygote, "mmap", mmap(big, private | anon)), RET_ALLOW);
        // The guest's failing end, where its peak is read: sent only where mappings are.
        // A status of 0 (the argument's low byte) is a success: no evidence is needed.
        let exit = |status: u64| [status, 0, 0, 0, 0, 0];
        assert_eq!(run(&notify, "exit_group", exit(1)), RET_USER_NOTIF);
        assert_eq!(run(&notify, "exit_group", exit(0x1ff)), RET_USER_NOTIF);
        assert_eq!(run(&notify, "exit_group", exit(0)), RET_ALLOW);
        assert_eq!(run(&notify, "exit_group", exit(0x100)), RET_ALLOW);
        assert_eq!(
            run(&notify, "exit_group", exit(0xffff_ffff_0000_0000)),
            RET_ALLOW,
            "an int: the upper half of the register is not the status"
        );
        assert_eq!(run(&fallback, "exit_group", exit(1)), RET_ALLOW);
        assert_eq!(run(&zygote, "exit_group", exit(1)), RET_ALLOW);
        let mut unlimited = p.clone();
        unlimited.limits.memory = None;
        let plain = compile(&unlimited, Mode::Notify, None, false, false).unwrap();
        assert_eq!(run(&plain, "exit_group", exit(1)), RET_ALLOW);
    }
}
