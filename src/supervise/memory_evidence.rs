//! Kernel evidence for the memory limit (`limits.memory`, RLIMIT_AS), gathered by the one
//! supervisor of an exec'd guest (`wfjail run` and exec-mode sessions alike): the guest's
//! peak address space, sampled while it runs and read at its `exit_group`, and a mapping
//! seen asking for more address space than RLIMIT_AS left. `verdict.rs` judges it.

use std::os::fd::BorrowedFd;
use std::time::Instant;

use crate::policy::Policy;
use crate::policy::decisions::Decisions;
use crate::sys;

use super::{VM_SAMPLE_AFTER_OUTPUT, VM_SAMPLE_EVERY};

/// What was seen of the guest's memory, against `limit` (`None`: no memory limit, nothing
/// is gathered).
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryEvidence {
    pub limit: Option<u64>,
    /// The largest `VmPeak` (bytes) read while the guest ran.
    pub vm_peak: Option<u64>,
    /// The address space (bytes) a mapping asked for beyond what RLIMIT_AS left.
    pub refused: Option<u64>,
    /// The policy denies `mmap` / `mremap`: such a call is a violation, not evidence.
    denied: [bool; 2],
}

impl MemoryEvidence {
    pub fn new(limit: Option<u64>) -> Self {
        MemoryEvidence {
            limit,
            ..Default::default()
        }
    }

    /// Evidence against `limit` for a guest under `policy` (which mapping calls it denies).
    pub fn for_policy(limit: Option<u64>, policy: &Policy) -> Self {
        MemoryEvidence {
            denied: ["mmap", "mremap"].map(|c| policy.syscalls.denies(c)),
            ..Self::new(limit)
        }
    }

    /// Whether evidence is gathered (a memory limit is set).
    pub fn wanted(&self) -> bool {
        self.limit.is_some()
    }

    /// A peak read while the guest ran.
    pub fn peak(&mut self, peak: Option<u64>) {
        self.vm_peak = self.vm_peak.max(peak);
    }

    /// Samples the peak of guest `pid` now (when a limit is set).
    pub fn sample(&mut self, pid: libc::pid_t) {
        if self.wanted() {
            self.peak(vm_peak(pid));
        }
    }

    /// The guest's own notification `n` (guest `pid`), before it is answered: a large
    /// private mapping the filter routed here for its size (`answer` lets it run, the kernel
    /// applies RLIMIT_AS) is noted when it does not fit in what is left, and an
    /// `exit_group` gives the peak while the address space is whole.
    pub fn on_notification(
        &mut self,
        listener: BorrowedFd<'_>,
        n: &sys::Notif,
        pid: libc::pid_t,
        decisions: &Decisions,
    ) {
        let Some(limit) = self.limit else { return };
        let denied = self.denied[usize::from(n.nr == libc::SYS_mremap as i32)];
        if let Some(grow) = mapping_beyond_limit(listener, n, pid, limit, denied) {
            self.refused = Some(grow);
        }
        if let Some(peak) = peak_at_exit(listener, n, pid, decisions) {
            self.peak(Some(peak));
        }
    }
}

/// When the guest's peak address space is sampled next, by `wfjail run` and by sessions
/// alike: every [`VM_SAMPLE_EVERY`], and [`VM_SAMPLE_AFTER_OUTPUT`] after the previous sample
/// when the guest wrote output (a guest whose allocation failed prints why, then exits, and
/// its address space is gone once it has).
#[derive(Debug, Clone, Copy, Default)]
pub struct SampleClock {
    last: Option<Instant>,
}

impl SampleClock {
    /// A clock whose first sample is due an interval from now: a guest that has just been
    /// started, whose address space is its fresh image's, far from any limit until it runs
    /// (one that fails sooner shows its peak at its `exit_group`).
    pub fn starting_now() -> Self {
        SampleClock {
            last: Some(Instant::now()),
        }
    }

    /// Whether a sample is due now (`after_output`: the guest wrote output since).
    pub fn due(&self, after_output: bool) -> bool {
        self.due_at(Instant::now(), after_output)
    }

    fn due_at(&self, now: Instant, after_output: bool) -> bool {
        let every = if after_output {
            VM_SAMPLE_AFTER_OUTPUT
        } else {
            VM_SAMPLE_EVERY
        };
        self.last
            .is_none_or(|t| now.saturating_duration_since(t) >= every)
    }

    /// A sample was taken now.
    pub fn sampled(&mut self) {
        self.last = Some(Instant::now());
    }
}

/// How much address space a native `mmap` or `mremap` notification asks to add (`None` for
/// any other call, and for `MAP_FIXED`, which may replace existing mappings). The arguments
/// are registers, so what is read here is what the kernel will see.
pub fn memory_request(n: &sys::Notif) -> Option<u64> {
    if n.arch != crate::policy::bpf::AUDIT_ARCH_X86_64 {
        return None;
    }
    match n.nr as libc::c_long {
        libc::SYS_mmap if n.args[3] & libc::MAP_FIXED as u64 == 0 => Some(n.args[1]),
        // mremap(old_address, old_size, new_size, flags, ...): the growth.
        libc::SYS_mremap => Some(n.args[2].saturating_sub(n.args[1])),
        _ => None,
    }
}

/// Kernel evidence for the memory limit: whether notification `n` (of guest `pid`) is a
/// private mapping, routed here by the filter for its size, that asks for more address space
/// than RLIMIT_AS `limit` leaves the guest. Returns the bytes asked for. A call the policy
/// denies (`denied`) is a violation, not evidence; the notification is checked valid after
/// reading.
pub fn mapping_beyond_limit(
    listener: std::os::fd::BorrowedFd<'_>,
    n: &sys::Notif,
    pid: libc::pid_t,
    limit: u64,
    denied: bool,
) -> Option<u64> {
    let grow = memory_request(n)?;
    (!denied
        && crate::procfs::vm_size(pid as u32).is_some_and(|s| s.saturating_add(grow) > limit)
        && sys::notif_id_valid(listener, n.id))
    .then_some(grow)
}

/// Kernel evidence for the memory limit: when notification `n` is an `exit_group` the filter
/// sent for `limits.memory`, made by a thread of the guest's process `guest` (not by a
/// process it forked), the guest's peak address space, read while the call waits (its memory
/// is whole until it is let go). A read whose notification is no longer pending may be
/// another process's, and is dropped.
pub fn peak_at_exit(
    listener: std::os::fd::BorrowedFd<'_>,
    n: &sys::Notif,
    guest: libc::pid_t,
    decisions: &crate::policy::decisions::Decisions,
) -> Option<u64> {
    let exit = n.arch == crate::policy::bpf::AUDIT_ARCH_X86_64
        && decisions
            .get(n.nr as u32)
            .is_some_and(|d| d.check == crate::policy::decisions::Check::Exit);
    if !exit {
        return None;
    }
    let status = crate::procfs::Status::of(n.pid)?;
    let tgid = status.number("Tgid")?;
    let peak = status.bytes("VmPeak")?;
    (tgid == guest as u64 && sys::notif_id_valid(listener, n.id)).then_some(peak)
}

/// The guest's peak address space in bytes (`VmPeak` of /proc/PID/status), if readable.
pub fn vm_peak(pid: libc::pid_t) -> Option<u64> {
    crate::procfs::vm_peak(pid as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notif(nr: libc::c_long, args: [u64; 6]) -> sys::Notif {
        sys::Notif {
            id: 1,
            pid: 1,
            nr: nr as i32,
            arch: crate::policy::bpf::AUDIT_ARCH_X86_64,
            instruction_pointer: 0,
            args,
        }
    }

    #[test]
    fn memory_requests_are_read_from_registers() {
        assert_eq!(
            memory_request(&notif(libc::SYS_mmap, [0, 1 << 29, 3, 0x22, 0, 0])),
            Some(1 << 29)
        );
        let fixed = libc::MAP_FIXED as u64 | 0x22;
        assert_eq!(
            memory_request(&notif(libc::SYS_mmap, [0, 1 << 29, 3, fixed, 0, 0])),
            None
        );
        assert_eq!(
            memory_request(&notif(libc::SYS_mremap, [0, 1 << 20, 3 << 20, 1, 0, 0])),
            Some(2 << 20)
        );
        assert_eq!(memory_request(&notif(libc::SYS_openat, [0; 6])), None);
    }

    #[test]
    fn a_clock_started_now_is_not_due_at_once() {
        let c = SampleClock::starting_now();
        let t = c.last.unwrap();
        assert!(!c.due_at(t, false) && !c.due_at(t, true));
        assert!(c.due_at(t + VM_SAMPLE_AFTER_OUTPUT, true));
        assert!(c.due_at(t + VM_SAMPLE_EVERY, false));
    }

    #[test]
    fn a_sample_is_due_at_once_then_every_interval_and_sooner_after_output() {
        let mut c = SampleClock::default();
        assert!(c.due(false), "the first sample is due at once");
        c.sampled();
        let t = c.last.unwrap();
        assert!(
            !c.due_at(t, false) && !c.due_at(t, true),
            "not again at once"
        );
        let soon = t + VM_SAMPLE_AFTER_OUTPUT;
        assert!(c.due_at(soon, true), "after output, sooner");
        assert!(!c.due_at(soon, false), "otherwise every VM_SAMPLE_EVERY");
        assert!(c.due_at(t + VM_SAMPLE_EVERY, false));
    }

    #[test]
    fn without_a_limit_nothing_is_gathered_and_the_peak_is_the_largest_seen() {
        let mut none = MemoryEvidence::new(None);
        none.sample(std::process::id() as libc::pid_t);
        assert_eq!(none.vm_peak, None);
        let mut m = MemoryEvidence::new(Some(1 << 30));
        m.peak(Some(5));
        m.peak(None);
        m.peak(Some(3));
        assert_eq!(m.vm_peak, Some(5));
        m.sample(std::process::id() as libc::pid_t);
        assert!(m.vm_peak.unwrap() > 5, "this process's own VmPeak");
    }
}
