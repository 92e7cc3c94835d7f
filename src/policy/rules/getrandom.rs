//! `[random] getrandom`: both halves of its rules. `allow` lets it run; `deny` refuses it in
//! the filter (glibc's malloc key aside); `seeded` sends every call to the supervisor, which
//! answers from the execution's seed (`answers/entropy.rs`); without a listener, `seeded` is
//! `deny`.

use std::collections::BTreeMap;

use seccompiler::{SeccompCmpArgLen as Len, SeccompCmpOp as Op};

use crate::policy::bpf::{BpfError, Leaf, cond, nr, rule};
use crate::policy::decisions::Check;
use crate::policy::syscalls;
use crate::policy::{Policy, RandomMode};

/// The rule a report quotes for a refused `getrandom`.
pub const DENY_RULE: &str = "random.getrandom = \"deny\"";

/// What `seeded` becomes without a seccomp listener (a report's `degraded`).
pub const DEGRADED: &str = "getrandom-seeded: no seccomp listener to answer getrandom, so it is denied instead (the guest gets no randomness, seeded or real)";

/// Whether the supervisor answers `getrandom` from a seed.
pub fn answered(policy: &Policy) -> bool {
    policy.random.getrandom == RandomMode::Seeded
}

/// Whether the guest gets no entropy of the host's (`deny`, `seeded`): no grant may then
/// cover `/dev/random` or `/dev/urandom`.
pub fn withholds_entropy(policy: &Policy) -> bool {
    policy.random.getrandom != RandomMode::Allow
}

/// Whether the guest's vDSO `getrandom` must be patched to make the syscall (and its
/// `AT_RANDOM` bytes replaced).
pub fn patches_vdso(policy: &Policy) -> bool {
    withholds_entropy(policy)
}

/// The supervisor's check of `name` (`None`: not this knob's).
pub fn check(policy: &Policy, name: &str) -> Option<Check> {
    (name == "getrandom" && answered(policy)).then_some(Check::Seeded)
}

/// The filter's leaves for `getrandom`.
pub fn leaves(policy: &Policy, map: &mut BTreeMap<u32, Leaf>) -> Result<(), BpfError> {
    match policy.random.getrandom {
        RandomMode::Allow => {
            for n in syscalls::RANDOM {
                map.insert(nr(n), Leaf::Allow);
            }
        }
        RandomMode::Seeded => {
            // Every getrandom is answered by the supervisor from the execution's seed (glibc's
            // malloc key included); without a listener to answer, none gets real entropy.
            map.insert(
                nr("getrandom"),
                Leaf::AllowElseSupervise {
                    allow: vec![],
                    supervise: None,
                },
            );
        }
        RandomMode::Deny => {
            // glibc >= 2.26 asks for 8 bytes with GRND_NONBLOCK once, to key its malloc
            // double-free check, and falls back to a clock-derived key when that fails.
            // Answer it ENOSYS without a report: it is the C library's, not the workflow's,
            // randomness. Every other getrandom (os.urandom, random's seeding) is a violation.
            map.insert(
                nr("getrandom"),
                Leaf::EnosysIf(vec![rule(
                    vec![
                        cond(1, Len::Qword, Op::Eq, 8),
                        cond(2, Len::Dword, Op::Eq, libc::GRND_NONBLOCK as u64),
                    ],
                    "getrandom",
                )?]),
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::bpf::{Mode, leaves};

    fn policy(mode: &str) -> Policy {
        crate::policy::from_source(
            "r.toml",
            &format!("extends = \"strict\"\n[random]\ngetrandom = \"{mode}\"\n"),
        )
        .unwrap()
    }

    #[test]
    fn seeded_sends_every_getrandom_and_answers_it() {
        let p = policy("seeded");
        let map = leaves(&p, Mode::Notify, None, false, false).unwrap();
        assert_eq!(
            map.get(&nr("getrandom")),
            Some(&Leaf::AllowElseSupervise {
                allow: vec![],
                supervise: None
            })
        );
        assert_eq!(check(&p, "getrandom"), Some(Check::Seeded));
        assert!(answered(&p) && patches_vdso(&p));
    }

    #[test]
    fn deny_answers_only_glibcs_malloc_key_with_enosys() {
        let p = policy("deny");
        let map = leaves(&p, Mode::Notify, None, false, false).unwrap();
        assert!(matches!(map.get(&nr("getrandom")), Some(Leaf::EnosysIf(_))));
        assert_eq!(check(&p, "getrandom"), None);
        assert!(!answered(&p) && withholds_entropy(&p));
    }

    #[test]
    fn allow_lets_it_run_and_patches_nothing() {
        let p = policy("allow");
        let map = leaves(&p, Mode::Notify, None, false, false).unwrap();
        assert_eq!(map.get(&nr("getrandom")), Some(&Leaf::Allow));
        assert!(!withholds_entropy(&p) && !patches_vdso(&p));
    }
}
