//! `[limits] memory`: both halves of its evidence rules. In a `wfjail run` plan with a
//! listener, a large private mapping and the guest's `exit_group` go to the supervisor,
//! which records the evidence (room left, peak address space) and lets them run: the
//! kernel applies the limit.

use std::collections::BTreeMap;

use seccompiler::{SeccompCmpArgLen as Len, SeccompCmpOp as Op};

use super::Shape;
use crate::policy::Policy;
use crate::policy::bpf::{BpfError, Leaf, MAP_SHARED_BIT, Mode, cond, nr, rule};
use crate::policy::decisions::Check;

/// Whether the supervisor collects memory evidence (prefork plans keep their own mmap rule:
/// no shared anonymous memory).
fn evidence(policy: &Policy, shape: Shape) -> bool {
    policy.limits.memory.is_some() && !shape.zygote
}

/// The supervisor's check of `name` (`None`: not this knob's).
pub fn check(policy: &Policy, shape: Shape, name: &str) -> Option<Check> {
    (name == "exit_group" && evidence(policy, shape)).then_some(Check::Exit)
}

/// The filter's leaves for `mmap`, `mremap` and `exit_group`.
pub fn leaves(
    policy: &Policy,
    mode: Mode,
    shape: Shape,
    map: &mut BTreeMap<u32, Leaf>,
) -> Result<(), BpfError> {
    let Some(limit) = policy.limits.memory.filter(|_| evidence(policy, shape)) else {
        return Ok(());
    };
    if mode != Mode::Notify {
        return Ok(());
    }
    // Evidence for the memory limit: a private mapping (or a growth) of at least a
    // sixteenth of RLIMIT_AS goes to the supervisor, which compares it with the room left
    // and lets it run (the kernel applies the limit). Small and shared mappings stay in
    // the kernel.
    let big = (limit.0 / 16).max(1 << 20);
    let shared = MAP_SHARED_BIT;
    if !policy.syscalls.denies("mmap") {
        map.insert(
            nr("mmap"),
            Leaf::AllowIfElseWatch(vec![
                rule(vec![cond(1, Len::Qword, Op::Lt, big)], "mmap")?,
                rule(
                    vec![cond(3, Len::Dword, Op::MaskedEq(shared), shared)],
                    "mmap",
                )?,
            ]),
        );
    }
    if !policy.syscalls.denies("mremap") {
        map.insert(
            nr("mremap"),
            Leaf::AllowIfElseWatch(vec![rule(
                vec![cond(2, Len::Qword, Op::Lt, big)],
                "mremap",
            )?]),
        );
    }
    // And the guest's end: its peak address space is read before the kernel frees it,
    // so that a guest that failed and exited between two samples still shows it. Only a
    // failing end: the peak is evidence for a guest that failed (`verdict::guest_failed`),
    // and an `exit_group` whose status is 0 (the low byte of its argument: `exit(256)` is
    // status 0 too) ends in success, so it stays in the kernel, without a round trip.
    if !policy.syscalls.denies("exit_group") {
        map.insert(
            nr("exit_group"),
            Leaf::AllowIfElseWatch(vec![rule(
                vec![cond(0, Len::Dword, Op::MaskedEq(0xff), 0)],
                "exit_group",
            )?]),
        );
    }
    Ok(())
}
