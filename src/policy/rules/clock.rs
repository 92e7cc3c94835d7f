//! `[time] clock`: both halves of its rules. `deny` refuses the wall clock in the filter;
//! `virtual` sends the clocks, resource usage, a descriptor's stat (and, in a zygote, the pid)
//! to the supervisor, which answers them (`answers/`); without a listener `virtual` is `deny`.

use std::collections::BTreeMap;

use seccompiler::{SeccompCmpArgLen as Len, SeccompCmpOp as Op};

use super::Shape;
use crate::policy::bpf::{BpfError, Leaf, Mode, OWN_CPU_CLOCKS, REALTIME_CLOCKS, cond, nr, rule};
use crate::policy::decisions::Check;
use crate::policy::{ClockMode, Policy};

/// The rule a report quotes for a refused wall-clock read.
pub const DENY_RULE: &str = "time.clock = \"deny\"";

/// What `virtual` becomes without a seccomp listener (a report's `degraded`).
pub const DEGRADED: &str = "clock-virtual: no seccomp listener to answer wall-clock reads, so they are denied instead (time.time() and datetime.now() fail); the monotonic and CPU clocks, resource usage, process ids and a descriptor's times are the kernel's";

/// Whether the supervisor answers the clocks (with the workflow time and the virtual
/// monotonic clock).
pub fn answered(policy: &Policy) -> bool {
    policy.time.clock == ClockMode::Virtual
}

/// Whether the guest's vDSO clocks must be patched to make syscalls (the filter then sees
/// every clock read).
pub fn patches_vdso(policy: &Policy) -> bool {
    policy.time.clock != ClockMode::Real
}

/// The supervisor's check of `name` (`None`: not this knob's).
pub fn check(policy: &Policy, shape: Shape, name: &str) -> Option<Check> {
    if !answered(policy) {
        return None;
    }
    match name {
        "clock_gettime" | "gettimeofday" | "time" => Some(Check::Clock),
        "getrusage" | "times" | "sysinfo" => Some(Check::Usage),
        "getpid" | "gettid" if shape.zygote => Some(Check::Pid),
        "fstat" | "newfstatat" | "statx" | "statfs" | "fstatfs" => Some(Check::Stat),
        _ => None,
    }
}

fn own_cpu_clock_rules() -> Result<Vec<seccompiler::SeccompRule>, BpfError> {
    let mut rules = OWN_CPU_CLOCKS
        .iter()
        .map(|&c| rule(vec![cond(0, Len::Dword, Op::Eq, c)], "clock_gettime"))
        .collect::<Result<Vec<_>, _>>()?;
    // A thread clock: negative, bit 2 set (CPUCLOCK_PERTHREAD), type PROF, VIRT or SCHED.
    for kind in [4, 5, 6] {
        rules.push(rule(
            vec![cond(
                0,
                Len::Dword,
                Op::MaskedEq(0x8000_0007),
                0x8000_0000 | kind,
            )],
            "clock_gettime",
        )?);
    }
    Ok(rules)
}

/// The filter's leaves for the clocks.
pub fn leaves(
    policy: &Policy,
    mode: Mode,
    shape: Shape,
    map: &mut BTreeMap<u32, Leaf>,
) -> Result<(), BpfError> {
    if policy.time.clock == ClockMode::Real {
        return Ok(());
    }
    // The clocks (the vDSO is patched to make these syscalls, answers/vdso.rs). Without
    // a supervisor (fall-back mode) `virtual` is `deny`: the wall clock is refused, and
    // the rest is the kernel's (run.rs lists it as degraded).
    if answered(policy) && mode == Mode::Notify {
        // The wall clock reads the workflow time, the monotonic clocks the virtual
        // monotonic clock (answers/monotonic.rs), and resource usage, `times` and
        // `sysinfo` (CPU times, uptime) pinned values; the caller's own CPU-time clocks
        // run (a loop that spends a CPU budget measures it with them). Any other clock
        // reaches the supervisor: a pid-encoded CPU clock of another process (the
        // zygote's, a sibling session's) is EINVAL there (answers/monotonic.rs).
        map.insert(
            nr("clock_gettime"),
            Leaf::AllowElseSupervise {
                allow: own_cpu_clock_rules()?,
                supervise: None,
            },
        );
        // The wall clock, resource usage, a descriptor's stat (a pipe's or a /proc
        // file's times are the clock's, a pipe's inode number the execution's:
        // answers/filetimes.rs) and a file system's free space (all free). No import
        // makes a `statfs`.
        let mut supervised = vec!["gettimeofday", "time", "getrusage", "times", "sysinfo"];
        supervised.extend(["fstat", "statfs", "fstatfs"]);
        if shape.zygote {
            // A session's pid and thread id are pinned (its siblings share the zygote's
            // namespace).
            supervised.extend(["getpid", "gettid"]);
        }
        for n in supervised {
            map.insert(
                nr(n),
                Leaf::AllowElseSupervise {
                    allow: vec![],
                    supervise: None,
                },
            );
        }
        // newfstatat and statx reach the supervisor only for a descriptor
        // (AT_EMPTY_PATH): by path they stay in the kernel.
        let empty_path = libc::AT_EMPTY_PATH as u64;
        for (n, flags) in [("newfstatat", 3u8), ("statx", 2)] {
            map.insert(
                nr(n),
                Leaf::AllowElseSupervise {
                    allow: vec![rule(
                        vec![cond(flags, Len::Dword, Op::MaskedEq(empty_path), 0)],
                        n,
                    )?],
                    supervise: None,
                },
            );
        }
    } else {
        // Deny (or virtual without a supervisor): a wall-clock read (`clock_gettime` of a
        // realtime clock, `gettimeofday`, `time`) is a violation; the monotonic and CPU
        // clocks run.
        let not_realtime = rule(
            REALTIME_CLOCKS
                .iter()
                .map(|&c| cond(0, Len::Dword, Op::Ne, c))
                .collect(),
            "clock_gettime",
        )?;
        map.insert(nr("clock_gettime"), Leaf::AllowIf(vec![not_realtime]));
        map.remove(&nr("gettimeofday"));
        map.remove(&nr("time"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::bpf::leaves;

    fn policy(clock: &str) -> Policy {
        crate::policy::from_source(
            "c.toml",
            &format!("extends = \"strict\"\n[time]\nclock = \"{clock}\"\n"),
        )
        .unwrap()
    }

    #[test]
    fn virtual_sends_the_clocks_to_the_supervisor_which_answers_them() {
        let p = policy("virtual");
        let map = leaves(&p, Mode::Notify, None, false, false).unwrap();
        for name in ["gettimeofday", "time", "getrusage", "sysinfo", "fstat"] {
            assert!(
                matches!(map.get(&nr(name)), Some(Leaf::AllowElseSupervise { .. })),
                "{name}"
            );
        }
        assert_eq!(check(&p, Shape::default(), "time"), Some(Check::Clock));
        assert_eq!(check(&p, Shape::default(), "times"), Some(Check::Usage));
        assert_eq!(check(&p, Shape::default(), "statx"), Some(Check::Stat));
        assert!(answered(&p) && patches_vdso(&p));
    }

    #[test]
    fn a_sessions_pid_is_pinned_only_in_a_zygote() {
        let p = policy("virtual");
        let zygote = Shape {
            zygote: true,
            ..Shape::default()
        };
        assert_eq!(check(&p, zygote, "getpid"), Some(Check::Pid));
        assert_eq!(check(&p, Shape::default(), "getpid"), None);
        let map = leaves(&p, Mode::Notify, None, false, false).unwrap();
        assert!(!matches!(
            map.get(&nr("getpid")),
            Some(Leaf::AllowElseSupervise { .. })
        ));
    }

    #[test]
    fn virtual_without_a_listener_is_deny() {
        let virt = leaves(&policy("virtual"), Mode::Fallback, None, false, false).unwrap();
        let deny = leaves(&policy("deny"), Mode::Fallback, None, false, false).unwrap();
        for name in ["clock_gettime", "gettimeofday", "time", "getrusage"] {
            assert_eq!(virt.get(&nr(name)), deny.get(&nr(name)), "{name}");
        }
        assert_eq!(virt.get(&nr("gettimeofday")), None, "a violation");
    }

    #[test]
    fn real_leaves_the_clocks_to_the_kernel() {
        let p = policy("real");
        assert!(!answered(&p) && !patches_vdso(&p));
        assert_eq!(check(&p, Shape::default(), "clock_gettime"), None);
    }
}
