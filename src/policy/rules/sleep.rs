//! `[time] sleep`: both halves of its rules. `allow` lets the sleeps run; `deny` refuses them
//! in the filter and sends a wait with a timeout to the supervisor, which reads the timeout
//! (a non-zero one is a `sleep` violation).

use std::collections::BTreeMap;

use seccompiler::{SeccompCmpArgLen as Len, SeccompCmpOp as Op};

use crate::policy::bpf::{BpfError, Leaf, cond, nr, rule};
use crate::policy::decisions::Check;
use crate::policy::syscalls;
use crate::policy::{Policy, Toggle};

/// The rule a report quotes for a refused sleep.
pub const DENY_RULE: &str = "time.sleep = \"deny\"";

/// The rule a report quotes for a wait whose timeout the supervisor found non-zero.
pub const TIMED_WAIT_RULE: &str = "time.sleep = \"deny\": a wait with a timeout sleeps";

pub const TIMED_WAIT_HINT: &str = "a wait with a timeout (select, poll, Event.wait, Lock.acquire(timeout=...)) blocks the worker like time.sleep; use workflow.sleep(), workflow.wait_condition() or asyncio.sleep() (durable timers)";

/// `futex` commands that never wait (`FUTEX_WAKE`, `FUTEX_FD`, `FUTEX_REQUEUE`,
/// `FUTEX_CMP_REQUEUE`, `FUTEX_WAKE_OP`, `FUTEX_UNLOCK_PI`, `FUTEX_TRYLOCK_PI`,
/// `FUTEX_WAKE_BITSET`, `FUTEX_CMP_REQUEUE_PI`), and the mask that takes the command out of
/// the operation (dropping `FUTEX_PRIVATE_FLAG` and `FUTEX_CLOCK_REALTIME`).
const FUTEX_NO_WAIT: [u64; 9] = [1, 2, 3, 4, 5, 7, 8, 10, 12];
const FUTEX_CMD_MASK: u64 = 0x7f;

/// Whether `name` is a wait whose timeout the supervisor judges under this policy.
pub fn judges_timeout(policy: &Policy, name: &str) -> bool {
    policy.time.sleep == Toggle::Deny
        && !policy.syscalls.denies(name)
        && syscalls::timed_wait(name).is_some()
        // With threads, a timed futex wait is how threads wait for each other (CPython's GIL
        // waits 5 ms at a time whenever two threads contend): it is not told apart from
        // `Lock.acquire(timeout=...)`, so it is not judged.
        && !(name.starts_with("futex") && policy.process.threads == Toggle::Allow)
}

/// The supervisor's check of `name` (`None`: not this knob's).
pub fn check(policy: &Policy, name: &str) -> Option<Check> {
    judges_timeout(policy, name).then_some(Check::TimedWait)
}

/// The filter's leaves for the sleeps and the waits with a timeout.
pub fn leaves(policy: &Policy, map: &mut BTreeMap<u32, Leaf>) -> Result<(), BpfError> {
    if policy.time.sleep == Toggle::Allow {
        for n in syscalls::SLEEP {
            map.insert(nr(n), Leaf::Allow);
        }
        return Ok(());
    }
    // Waits with a timeout block like a sleep. Allowed without one (and with a zero
    // one); otherwise the supervisor reads the timeout (`decode.rs`).
    for &(name, timeout) in syscalls::TIMED_WAITS {
        if !judges_timeout(policy, name) {
            continue;
        }
        let mut allow = match timeout {
            // 0, or negative (no timeout).
            syscalls::Timeout::Millis(a) => vec![
                rule(vec![cond(a as u8, Len::Dword, Op::Eq, 0)], name)?,
                rule(
                    vec![cond(
                        a as u8,
                        Len::Dword,
                        Op::MaskedEq(0x8000_0000),
                        0x8000_0000,
                    )],
                    name,
                )?,
            ],
            syscalls::Timeout::Timespec(a) | syscalls::Timeout::Timeval(a) => {
                vec![rule(vec![cond(a as u8, Len::Qword, Op::Eq, 0)], name)?]
            }
        };
        if name == "futex" {
            // Only the wait commands take a timeout worth judging.
            for cmd in FUTEX_NO_WAIT {
                allow.push(rule(
                    vec![cond(1, Len::Dword, Op::MaskedEq(FUTEX_CMD_MASK), cmd)],
                    name,
                )?);
            }
        }
        map.insert(
            nr(name),
            Leaf::AllowElseSupervise {
                allow,
                supervise: None,
            },
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(extra: &str) -> Policy {
        crate::policy::from_source(
            "s.toml",
            &format!("extends = \"strict\"\n[time]\nsleep = \"deny\"\n{extra}"),
        )
        .unwrap()
    }

    #[test]
    fn a_wait_with_a_timeout_is_judged_under_sleep_deny() {
        let p = policy("");
        assert_eq!(check(&p, "poll"), Some(Check::TimedWait));
        assert_eq!(check(&p, "futex"), Some(Check::TimedWait));
        let mut map = BTreeMap::new();
        leaves(&p, &mut map).unwrap();
        assert!(matches!(
            map.get(&nr("poll")),
            Some(Leaf::AllowElseSupervise { .. })
        ));
    }

    #[test]
    fn futex_waits_are_not_judged_where_threads_run() {
        let p = policy("[process]\nthreads = \"allow\"\n");
        assert_eq!(check(&p, "futex"), None);
        let mut map = BTreeMap::new();
        leaves(&p, &mut map).unwrap();
        assert_eq!(map.get(&nr("futex")), None);
    }

    #[test]
    fn a_call_the_policy_denies_is_not_judged() {
        let p = policy("[syscalls]\ndeny = [\"poll\"]\n");
        assert_eq!(check(&p, "poll"), None);
    }
}
