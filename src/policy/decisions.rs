//! What the supervisor does with a notification of each syscall, compiled once from the
//! policy beside the filter that sends it (`bpf.rs`), and kept in the plan.
//!
//! For every syscall of the table: how a notification of it is checked ([`Check`]), and, if
//! it turns out to be a violation, its category, the rule the report quotes, the hint, and
//! whether it is denied whatever `on_violation` says. The supervisor's decoder
//! (`notify/decode.rs`) looks these up; it only refines what depends on the arguments
//! (`clone` with or without `CLONE_THREAD`, the `ioctl` request, the `fcntl` command).

use std::collections::HashMap;
use std::sync::Arc;

use super::rules::{self, Shape};
use super::syscall_table::X86_64;
use super::syscalls::{self, Args, Category};
use super::{NetworkMode, Policy, Toggle};

/// How the supervisor checks a notification of one syscall.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// A violation (the filter sends only what the policy does not allow outright).
    Violation,
    /// A write-intent file-system call: its paths ([`watched_paths`]) are judged against
    /// `filesystem.write`; a read-only open is a violation only in a prefork child after
    /// preload.
    Writes,
    /// `flock`: allowed on files under `filesystem.write`.
    Lock,
    /// `fcntl`: a record-lock command is judged like [`Check::Lock`], any other one the filter
    /// sent is a violation.
    Fcntl,
    /// `mmap`/`mremap`: a large private mapping is evidence for `limits.memory` and runs; a
    /// shared one (sent in prefork plans only) is a violation.
    Mapping,
    /// `exit_group` under `limits.memory`: the guest's peak address space is read before the
    /// kernel frees it (evidence for the memory limit), then it runs.
    Exit,
    /// `getrandom` under `getrandom = "seeded"`: answered with the execution's stream.
    Seeded,
    /// A clock read under `clock = "virtual"`: the wall clock answered with the execution's
    /// time, the monotonic clocks with its virtual monotonic clock.
    Clock,
    /// `getrusage`, `times`, `sysinfo` under `clock = "virtual"`: answered with pinned values
    /// (no CPU time, no load, a virtual uptime; `notify/mod.rs`).
    Usage,
    /// A descriptor's stat (`fstat`, `newfstatat`/`statx` with `AT_EMPTY_PATH`) under
    /// `clock = "virtual"`: a pipe's, socket's, device's or `/proc` file's times read the
    /// workflow time (`answers/filetimes.rs`).
    Stat,
    /// `getpid`, `gettid` under `clock = "virtual"`, sent by prefork plans only: a session reads a
    /// fixed pid (`serve/zygote.rs`); elsewhere the call runs (the guest is pid 1 of its own
    /// PID namespace).
    Pid,
    /// A signal in a prefork plan, where the filter cannot pin the caller's pid: one to the
    /// caller itself is sent for it by the zygote's router (`serve/route.rs`), any other is a
    /// violation.
    Signal,
    /// `sched_getaffinity` under `[process] cpu_count = N`: answered with N CPUs.
    CpuCount(u32),
    /// A wait under `sleep = "deny"` (`syscalls::TIMED_WAITS`): its timeout is read; a
    /// non-zero one makes it a `sleep` violation.
    TimedWait,
}

/// The compiled decision for one syscall.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub name: &'static str,
    pub check: Check,
    /// The category of a violation of it (arguments may refine it).
    pub category: Category,
    /// The rule a report quotes for a violation of it.
    pub rule: String,
    /// A hint more precise than the category's.
    pub hint: Option<&'static str>,
    /// Denied whatever `on_violation` says (privileged calls).
    pub always_deny: bool,
    /// The policy's own `[syscalls] deny` lists it (its rule then names that list).
    pub policy_denies: bool,
    /// How its arguments are shown (`syscalls::args`; the raw values when the policy's own
    /// deny list refuses a call that is otherwise allowed with checks).
    pub args: Args,
}

/// The decisions of one plan, by syscall number. Compiled at the first look-up, not with
/// the plan: a guest that makes no call the filter sends (most runs of a small program, whose
/// only notification is its initial exec, answered by the start-up) never needs them, and a
/// `wfjail run` makes its plan on its critical path (~0.07 ms for the 370 decisions).
#[derive(Debug, Clone, Default)]
pub struct Decisions {
    by_nr: std::sync::OnceLock<HashMap<u32, Decision>>,
    /// What they are compiled from (`None`: none, the empty set of tests).
    source: Option<Arc<(Policy, Shape)>>,
    /// [`Decisions::refuse_outside_effects`] was asked.
    refuse_outside: bool,
}

/// [`Decisions::refuse_outside_effects`] applied to compiled decisions (at the look-up that
/// compiles them, or at once when they were compiled already).
fn refuse_outside(by_nr: &mut HashMap<u32, Decision>) {
    for d in by_nr.values_mut() {
        if d.check == Check::Violation && d.category.reaches_outside() {
            d.always_deny = true;
        }
    }
}

/// The write-intent file-system calls the filter sends for checking, and where their paths
/// are: `(dirfd argument or None for AT_FDCWD, path argument, follows a final symlink)`.
/// A hard link's source is judged too: Landlock refuses (EXDEV) a link that would give a
/// file more rights under its new name.
pub fn watched_paths(name: &str) -> &'static [(Option<usize>, usize, bool)] {
    match name {
        "open" | "creat" | "truncate" => &[(None, 0, true)],
        "openat" | "openat2" => &[(Some(0), 1, true)],
        "mkdir" | "rmdir" | "unlink" => &[(None, 0, false)],
        "mkdirat" | "unlinkat" => &[(Some(0), 1, false)],
        "rename" | "link" => &[(None, 0, false), (None, 1, false)],
        "renameat" | "renameat2" | "linkat" => &[(Some(0), 1, false), (Some(2), 3, false)],
        "symlink" => &[(None, 1, false)],
        "symlinkat" => &[(Some(1), 2, false)],
        _ => &[],
    }
}

const SYSV_IPC: &[&str] = &[
    "shmget",
    "shmat",
    "shmctl",
    "shmdt",
    "msgget",
    "msgsnd",
    "msgrcv",
    "msgctl",
    "semget",
    "semop",
    "semtimedop",
    "semctl",
    "mq_open",
    "mq_unlink",
    "mq_timedsend",
    "mq_timedreceive",
    "mq_notify",
    "mq_getsetattr",
];

const IOCTL_HINT: &str = "only terminal queries (isatty, terminal size), FIONREAD, FIONBIO and FIOCLEX are allowed; other ioctls could change files, terminals or interfaces outside the sandbox";
const ARCH_PRCTL_HINT: &str = "only the thread pointer, CPU feature and shadow-stack codes of arch_prctl are allowed; ARCH_MAP_VDSO would map a fresh vDSO that reads the real clock without a syscall (use workflow.now())";
/// The hint of a refused opt-in to same-page merging (`prctl(PR_SET_MEMORY_MERGE)`,
/// `madvise(MADV_MERGEABLE)`).
pub const MERGE_HINT: &str = "same-page merging is the operator's choice (wfjail serve --merge-pages, JailedWorkflowRunner(merge_pages=True)); a guest cannot opt in: a merged page's copy-on-write timing is a side channel to every other opted-in process on the host";
const MEMFD_HINT: &str = "memory files are not allowed in workflow code (they escape limits.memory); keep data in ordinary objects";
const IPC_HINT: &str =
    "inter-process channels are not allowed in workflow code (prefork sessions would share them)";
const SHARED_MAP_HINT: &str = "shared memory is not allowed in prefork (zygote) mode: a mapping made before a fork would carry one session's data to the next; use ordinary objects";

impl Decisions {
    /// Compiles the decision for every syscall of the table under `policy`, for a plan of
    /// `shape` (`rules::RuleSet::compile` keeps it beside the filter's leaves).
    /// (At the first [`Decisions::get`]: what is kept here is the policy and the shape.)
    pub fn compile(policy: &Policy, shape: Shape) -> Self {
        Decisions {
            by_nr: std::sync::OnceLock::new(),
            source: Some(Arc::new((policy.clone(), shape))),
            refuse_outside: false,
        }
    }

    /// The decision for syscall `nr` (`None`: a number without a name).
    pub fn get(&self, nr: u32) -> Option<&Decision> {
        self.compiled().get(&nr)
    }

    fn compiled(&self) -> &HashMap<u32, Decision> {
        self.by_nr.get_or_init(|| {
            let Some(source) = &self.source else {
                return HashMap::new();
            };
            let (policy, shape) = (&source.0, source.1);
            let mut by_nr: HashMap<u32, Decision> = X86_64
                .iter()
                .map(|&(name, nr)| (nr, decision_for(policy, shape, name)))
                .collect();
            if self.refuse_outside {
                refuse_outside(&mut by_nr);
            }
            by_nr
        })
    }

    /// `wfjail learn`: the calls that would reach outside the guest whatever Landlock says
    /// (network calls; file metadata changes such as `chmod`, `utimensat`, `setxattr`, which
    /// Landlock does not check) are refused and recorded even under `warn`, like privileged
    /// ones: a learning run observes them without letting them happen.
    pub fn refuse_outside_effects(&mut self) {
        self.refuse_outside = true;
        if let Some(by_nr) = self.by_nr.get_mut() {
            refuse_outside(by_nr);
        }
    }
}

fn decision_for(policy: &Policy, shape: Shape, name: &'static str) -> Decision {
    let policy_denies = policy.syscalls.denies(name);
    let mut category = syscalls::category(name);
    let mut always_deny = syscalls::always_denied(name);
    let mut hint = None;
    let net_rule = || {
        let mode = match policy.network.mode {
            NetworkMode::None => "none",
            NetworkMode::Allow => "allow",
        };
        format!("network.mode = \"{mode}\"")
    };
    // Calls whose rule the policy's deny list does not replace (checked before the generic
    // arms, as the decoder refines them).
    let guarded = !policy_denies;
    let rule: String = match name {
        "socket" | "connect" | "bind" | "sendto" | "listen" | "accept" | "accept4" => net_rule(),
        "socketpair" => "only AF_UNIX stream socket pairs are allowed".into(),
        // Refined by CLONE_THREAD in the decoder.
        "clone" => "process.subprocess = \"deny\"".into(),
        "fork" | "vfork" => "process.subprocess = \"deny\"".into(),
        "execve" | "execveat" => "process.exec = \"deny\"".into(),
        "nanosleep" | "clock_nanosleep" | "alarm" => rules::sleep::DENY_RULE.into(),
        "getrandom" => rules::getrandom::DENY_RULE.into(),
        "clock_gettime" | "gettimeofday" | "time" if guarded => rules::clock::DENY_RULE.into(),
        "ioctl" if guarded => {
            always_deny = true;
            hint = Some(IOCTL_HINT);
            "ioctl requests are an allowlist (TCGETS, TIOCGWINSZ, FIONREAD, FIONBIO, FIOCLEX...)"
                .into()
        }
        "seccomp" => {
            always_deny = true;
            category = Category::Privilege;
            "creating a seccomp listener is always denied".into()
        }
        "mount" | "unshare" | "setns" => generic_rule(policy, name, true),
        "kill" | "tgkill" | "tkill" if guarded => {
            category = Category::Privilege;
            always_deny = true;
            "signals only to itself".into()
        }
        "prlimit64" if guarded => {
            category = Category::Privilege;
            always_deny = true;
            "only a process's own limits (pid 0) may be changed".into()
        }
        // Refined by the command in the decoder.
        "fcntl" if guarded => {
            always_deny = true;
            "fcntl commands are an allowlist (descriptor flags, duplication, lock queries; locks under --rw)"
                .into()
        }
        // Refined by the code in the decoder (a vDSO mapping is a clock violation).
        "arch_prctl" if guarded => {
            always_deny = true;
            hint = Some(ARCH_PRCTL_HINT);
            "arch_prctl codes are an allowlist (thread pointer, CPU features, shadow stack; no ARCH_MAP_VDSO)".into()
        }
        // The filter sends only the opt-in (the other options and advice run).
        "prctl" if guarded => {
            always_deny = true;
            hint = Some(MERGE_HINT);
            "a guest cannot opt into same-page merging (prctl(PR_SET_MEMORY_MERGE, 1)): serve --merge-pages opts a zygote in".into()
        }
        "madvise" if guarded => {
            always_deny = true;
            hint = Some(MERGE_HINT);
            "a guest cannot opt into same-page merging (madvise(MADV_MERGEABLE)): serve --merge-pages opts a zygote in".into()
        }
        "memfd_create" if guarded => {
            hint = Some(MEMFD_HINT);
            "memory files are denied: they are not counted by limits.memory".into()
        }
        n if guarded && SYSV_IPC.contains(&n) => {
            hint = Some(IPC_HINT);
            "System V IPC and POSIX message queues are denied".into()
        }
        "mmap" if guarded => {
            always_deny = true;
            hint = Some(SHARED_MAP_HINT);
            "no shared anonymous memory in a zygote".into()
        }
        _ => generic_rule(policy, name, always_deny),
    };
    // The policy's own deny list names the rule, unless the call is denied whatever it says.
    let rule = if policy_denies && !always_deny {
        format!("syscalls.deny = [\"{name}\"]")
    } else {
        rule
    };
    let timed_wait = rules::sleep::judges_timeout(policy, name);
    let (category, rule, hint) = if timed_wait {
        (
            Category::Sleep,
            rules::sleep::TIMED_WAIT_RULE.to_string(),
            Some(rules::sleep::TIMED_WAIT_HINT),
        )
    } else {
        (category, rule, hint)
    };
    let check = if timed_wait {
        Check::TimedWait
    } else if policy_denies {
        Check::Violation
    } else if !watched_paths(name).is_empty() {
        Check::Writes
    } else {
        match name {
            "flock" => Check::Lock,
            "fcntl" => Check::Fcntl,
            "mmap" | "mremap" => Check::Mapping,
            "kill" | "tkill" | "tgkill" if shape.zygote => Check::Signal,
            _ => rules::knob_check(policy, shape, name).unwrap_or(Check::Violation),
        }
    };
    let args = match syscalls::args(name) {
        Args::Ioctl
        | Args::Fcntl
        | Args::Signal { .. }
        | Args::Prlimit
        | Args::Memfd
        | Args::Mmap
        | Args::ArchPrctl
        | Args::Prctl
        | Args::Madvise
            if policy_denies =>
        {
            Args::Hex
        }
        a => a,
    };
    Decision {
        name,
        check,
        category,
        rule,
        hint,
        always_deny,
        policy_denies,
        args,
    }
}

/// The rule of a call with no rule of its own.
fn generic_rule(policy: &Policy, name: &str, always_deny: bool) -> String {
    if always_deny {
        "always denied: could weaken the sandbox".into()
    } else if policy.syscalls.denies(name) {
        format!("syscalls.deny = [\"{name}\"]")
    } else if syscalls::SLEEP.contains(&name) && policy.time.sleep == Toggle::Deny {
        rules::sleep::DENY_RULE.into()
    } else {
        "not on the allowlist".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nr(name: &str) -> u32 {
        syscalls::number(name).unwrap()
    }

    #[test]
    fn every_named_syscall_has_a_decision() {
        let d = Decisions::compile(&crate::policy::load("default").unwrap(), Shape::default());
        for &(name, n) in X86_64 {
            assert_eq!(d.get(n).map(|d| d.name), Some(name));
        }
    }

    #[test]
    fn checks_follow_the_policy() {
        let p = crate::policy::load("default").unwrap();
        let d = Decisions::compile(&p, Shape::default());
        assert_eq!(d.get(nr("openat")).unwrap().check, Check::Writes);
        assert_eq!(d.get(nr("flock")).unwrap().check, Check::Lock);
        assert_eq!(d.get(nr("fcntl")).unwrap().check, Check::Fcntl);
        assert_eq!(d.get(nr("mmap")).unwrap().check, Check::Mapping);
        assert_eq!(d.get(nr("getrandom")).unwrap().check, Check::Violation);
        let connect = d.get(nr("connect")).unwrap();
        assert_eq!(
            (connect.category, connect.rule.as_str(), connect.always_deny),
            (Category::Network, "network.mode = \"none\"", false)
        );
        let ptrace = d.get(nr("ptrace")).unwrap();
        assert!(ptrace.always_deny);
        assert_eq!(ptrace.rule, "always denied: could weaken the sandbox");

        // A policy's own deny list: a violation, named by that list.
        let p = crate::policy::from_source(
            "t.toml",
            "extends = \"strict\"\n[syscalls]\ndeny = [\"openat\", \"uname\"]\n[random]\ngetrandom = \"seeded\"\n",
        )
        .unwrap();
        let d = Decisions::compile(&p, Shape::default());
        let openat = d.get(nr("openat")).unwrap();
        assert_eq!(openat.check, Check::Violation);
        assert_eq!(openat.rule, "syscalls.deny = [\"openat\"]");
        assert_eq!(
            d.get(nr("uname")).unwrap().rule,
            "syscalls.deny = [\"uname\"]"
        );
        assert_eq!(d.get(nr("getrandom")).unwrap().check, Check::Seeded);
    }

    #[test]
    fn an_opt_in_to_same_page_merging_is_refused_under_every_on_violation() {
        for name in ["default", "strict", "permissive", "temporal-python"] {
            let p = crate::policy::load(name).unwrap();
            let d = Decisions::compile(&p, Shape::default());
            for call in ["prctl", "madvise"] {
                let got = d.get(nr(call)).unwrap();
                assert_eq!(got.check, Check::Violation, "{name} {call}");
                assert!(got.always_deny, "{name} {call}: denied even under warn");
                assert_eq!(got.category, Category::Privilege);
                assert_eq!(got.hint, Some(MERGE_HINT));
                assert!(got.rule.contains("same-page merging"), "{}", got.rule);
            }
        }
    }

    #[test]
    fn refusing_outside_effects_holds_whether_the_decisions_were_looked_up_before_or_not() {
        let p = crate::policy::load("default").unwrap();
        let mut late = Decisions::compile(&p, Shape::default());
        let mut early = Decisions::compile(&p, Shape::default());
        assert!(
            !early.get(nr("connect")).unwrap().always_deny,
            "compiled now"
        );
        late.refuse_outside_effects();
        early.refuse_outside_effects();
        for &(_, n) in X86_64 {
            assert_eq!(late.get(n), early.get(n), "#{n}");
        }
        assert!(late.get(nr("connect")).unwrap().always_deny);
        assert!(late.get(nr("chmod")).unwrap().always_deny);
    }
}
