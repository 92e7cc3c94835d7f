//! `[process] cpu_count = N`: both halves of its rule. `sched_getaffinity` goes to the
//! supervisor, which answers with N CPUs (`notify::cpu_answer`).

use std::collections::BTreeMap;

use crate::policy::Policy;
use crate::policy::bpf::{Leaf, nr};
use crate::policy::decisions::Check;

fn pinned(policy: &Policy) -> Option<u32> {
    let count = policy.process.cpu_count.as_ref()?;
    (!policy.syscalls.denies("sched_getaffinity")).then_some(count.value as u32)
}

/// The supervisor's check of `name` (`None`: not this knob's).
pub fn check(policy: &Policy, name: &str) -> Option<Check> {
    (name == "sched_getaffinity")
        .then(|| pinned(policy))
        .flatten()
        .map(Check::CpuCount)
}

/// The filter's leaf for `sched_getaffinity`.
pub fn leaves(policy: &Policy, map: &mut BTreeMap<u32, Leaf>) {
    if pinned(policy).is_some() {
        map.insert(
            nr("sched_getaffinity"),
            Leaf::AllowElseSupervise {
                allow: vec![],
                supervise: None,
            },
        );
    }
}
