//! The compiled rule set of a plan: for each determinism knob, one file that writes both
//! halves of its rules — the filter's leaves (`bpf.rs` lays them out) and the supervisor's
//! checks (`decisions.rs`) — with the rule text a report quotes, the vDSO patch it needs and
//! what it becomes without a listener. Adding a knob is one file here plus its answer in
//! `answers/`.
//!
//! The two halves must agree: a call the filter sends to the supervisor for a check has one,
//! and a call with a knob's check is sent (`tests::the_filter_and_the_supervisor_agree_*`,
//! over every syscall number).

pub mod clock;
pub mod cpu_count;
pub mod getrandom;
pub mod memory;
pub mod sleep;

use std::collections::BTreeMap;
use std::sync::Arc;

use super::Policy;
use super::bpf::{BpfError, Leaf, Mode};
use super::decisions::{Check, Decisions};

/// What a plan is for, where the rules of one policy differ between plans.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Shape {
    /// Prefork (a zygote and its sessions): signals are not pinned to one pid, a session's
    /// pid is pinned under the virtual clock, no memory evidence.
    pub zygote: bool,
    /// Every open goes to the supervisor (learn, warn, `reads_after_preload = "deny"`).
    pub watch_reads: bool,
    /// `wfjail learn`: calls that reach outside the guest are refused even under `warn`
    /// (`Decisions::refuse_outside_effects`).
    pub learn: bool,
}

/// What the supervisor patches in a guest's vDSO at its exec stop (and its auxiliary
/// vector's random bytes), `answers/vdso.rs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VdsoPatch {
    /// The wall clock (`clock = "virtual"` or `"deny"`).
    pub clock: bool,
    /// `getrandom` (`getrandom = "seeded"` or `"deny"`); the 16 bytes `AT_RANDOM` points at
    /// are then overwritten with bytes keyed by `seed` (`answers::entropy::at_random`).
    pub random: bool,
    /// The execution's seed (`--seed`, OPEN's `seed`; 0 when there is none, and under
    /// `getrandom = "deny"`).
    pub seed: u64,
}

impl VdsoPatch {
    /// The patch a policy needs, or `None` when its guests may use the vDSO as it is.
    pub fn for_policy(policy: &Policy) -> Option<VdsoPatch> {
        let p = VdsoPatch {
            clock: clock::patches_vdso(policy),
            random: getrandom::patches_vdso(policy),
            seed: 0,
        };
        (p.clock || p.random).then_some(p)
    }

    /// This patch for an execution with `seed` (`None`: 0).
    pub fn seeded(self, seed: Option<u64>) -> VdsoPatch {
        VdsoPatch {
            seed: seed.unwrap_or(0),
            ..self
        }
    }
}

/// The rules of one plan, compiled once from the policy.
#[derive(Debug, Clone)]
pub struct RuleSet {
    /// What the supervisor does with each notification the filter sends.
    pub decisions: Arc<Decisions>,
    /// `getrandom` is answered from the execution's seed.
    pub seeded: bool,
    /// The clocks are answered with the workflow time.
    pub virtual_clock: bool,
    /// The vDSO patch the exec stop applies, if any.
    pub vdso: Option<VdsoPatch>,
    /// What the answered knobs become without a seccomp listener (a report's `degraded`).
    pub without_listener: Vec<&'static str>,
}

impl RuleSet {
    /// The rule set of `policy` for a plan of `shape`.
    pub fn compile(policy: &Policy, shape: Shape) -> RuleSet {
        let seeded = getrandom::answered(policy);
        let virtual_clock = clock::answered(policy);
        let mut without_listener = Vec::new();
        if virtual_clock {
            without_listener.push(clock::DEGRADED);
        }
        if seeded {
            without_listener.push(getrandom::DEGRADED);
        }
        let mut decisions = Decisions::compile(policy, shape);
        if shape.learn {
            // Learning observes network calls and metadata changes without letting them
            // happen.
            decisions.refuse_outside_effects();
        }
        RuleSet {
            decisions: Arc::new(decisions),
            seeded,
            virtual_clock,
            vdso: VdsoPatch::for_policy(policy),
            without_listener,
        }
    }
}

/// Every knob's filter leaves, written over the base allowlist's (`bpf::leaves`; the
/// `limits.memory` evidence comes after the policy's lists, `memory::leaves`). A new knob
/// adds its leaves here and its check to [`knob_check`].
pub fn knob_leaves(
    policy: &Policy,
    mode: Mode,
    shape: Shape,
    map: &mut BTreeMap<u32, Leaf>,
) -> Result<(), BpfError> {
    sleep::leaves(policy, map)?;
    cpu_count::leaves(policy, map);
    clock::leaves(policy, mode, shape, map)?;
    getrandom::leaves(policy, map)
}

/// The check a knob gives `name` under `policy` (`None`: no knob's; the base decides).
pub fn knob_check(policy: &Policy, shape: Shape, name: &str) -> Option<Check> {
    sleep::check(policy, name)
        .or_else(|| getrandom::check(policy, name))
        .or_else(|| cpu_count::check(policy, name))
        .or_else(|| clock::check(policy, shape, name))
        .or_else(|| memory::check(policy, shape, name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::bpf;
    use crate::policy::syscall_table::X86_64;

    fn policies() -> Vec<(&'static str, Policy)> {
        let src = |name: &str, text: &str| crate::policy::from_source(name, text).unwrap();
        vec![
            ("default", crate::policy::load("default").unwrap()),
            ("strict", crate::policy::load("strict").unwrap()),
            ("permissive", crate::policy::load("permissive").unwrap()),
            (
                "temporal-python",
                crate::policy::load("temporal-python").unwrap(),
            ),
            (
                "seeded/virtual",
                src(
                    "sv.toml",
                    "extends = \"strict\"\n[random]\ngetrandom = \"seeded\"\n[time]\nclock = \"virtual\"\nsleep = \"deny\"\n[process]\ncpu_count = 2\n[limits]\nmemory = \"512M\"\n",
                ),
            ),
            (
                "warn",
                src(
                    "warn.toml",
                    "extends = \"default\"\non_violation = \"warn\"\n",
                ),
            ),
            (
                "deny-listed",
                src(
                    "deny.toml",
                    "extends = \"temporal-python\"\n[syscalls]\ndeny = [\"openat\", \"getrandom\", \"clock_gettime\", \"futex\", \"exit_group\", \"mmap\", \"sched_getaffinity\", \"fstat\"]\n",
                ),
            ),
        ]
    }

    /// The filter sends the call to the supervisor for a check (not only as a violation).
    fn sent_for_check(leaf: Option<&Leaf>) -> bool {
        matches!(
            leaf,
            Some(Leaf::Watch | Leaf::AllowIfElseWatch(_) | Leaf::AllowElseSupervise { .. })
        )
    }

    /// A check that answers or lets the call run, which a knob writes.
    fn knob_owned(check: Check) -> bool {
        matches!(
            check,
            Check::Seeded
                | Check::Clock
                | Check::Usage
                | Check::Stat
                | Check::Pid
                | Check::CpuCount(_)
                | Check::TimedWait
                | Check::Exit
        )
    }

    fn agree(shape: Shape) {
        let highest = X86_64.last().map_or(0, |&(_, n)| n);
        for (name, policy) in policies() {
            let leaves =
                bpf::leaves(&policy, Mode::Notify, None, shape.zygote, shape.watch_reads).unwrap();
            let rules = RuleSet::compile(&policy, shape);
            for nr in 0..=highest {
                let leaf = leaves.get(&nr);
                let Some(d) = rules.decisions.get(nr) else {
                    assert!(
                        !sent_for_check(leaf),
                        "{name} {shape:?}: #{nr} is sent for a check but has no decision"
                    );
                    continue;
                };
                if sent_for_check(leaf) {
                    assert_ne!(
                        d.check,
                        Check::Violation,
                        "{name} {shape:?}: {} is sent for a check the supervisor does not have",
                        d.name
                    );
                }
                if knob_owned(d.check) {
                    assert!(
                        sent_for_check(leaf),
                        "{name} {shape:?}: {} has the check {:?} but the filter does not send it ({leaf:?})",
                        d.name,
                        d.check
                    );
                }
                if leaf.is_none() || leaf == Some(&Leaf::Violation) {
                    assert_eq!(
                        d.check,
                        Check::Violation,
                        "{name} {shape:?}: the filter refuses {} but the supervisor would check it",
                        d.name
                    );
                }
            }
        }
    }

    #[test]
    fn the_filter_and_the_supervisor_agree_on_every_syscall_of_a_run() {
        agree(Shape::default());
    }

    #[test]
    fn the_filter_and_the_supervisor_agree_on_every_syscall_of_a_zygote() {
        agree(Shape {
            zygote: true,
            watch_reads: true,
            learn: false,
        });
        agree(Shape {
            zygote: true,
            ..Shape::default()
        });
    }

    #[test]
    fn the_filter_and_the_supervisor_agree_on_every_syscall_of_a_learning_run() {
        agree(Shape {
            zygote: false,
            watch_reads: true,
            learn: true,
        });
    }

    #[test]
    fn an_answered_knob_says_what_it_becomes_without_a_listener() {
        let (_, sv) = policies().remove(4);
        let rules = RuleSet::compile(&sv, Shape::default());
        assert!(rules.seeded && rules.virtual_clock);
        assert_eq!(
            rules.without_listener,
            [clock::DEGRADED, getrandom::DEGRADED]
        );
        assert_eq!(
            rules.vdso,
            Some(VdsoPatch {
                clock: true,
                random: true,
                seed: 0
            })
        );
        let default = RuleSet::compile(&crate::policy::load("default").unwrap(), Shape::default());
        assert!(default.without_listener.is_empty());
    }
}
