//! What the session reads of its guest on a timer: the peak address space (kernel evidence
//! for `limits.memory`) and the CPU time of the call in progress (`limits.cpu`).

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use super::super::launch::Child;
use super::super::phases::Failure;
use super::*;

impl Session {
    /// Kernel evidence for the memory limit (`limits.memory` set): the guest's peak address
    /// space (`VmPeak`, a high-water mark the kernel keeps until the guest exits), read when
    /// its `SampleClock` says (as `wfjail run` does), or now (`force`).
    pub(super) fn sample_memory(&mut self, force: bool) {
        if self.applied.memory.is_none() || self.ended() {
            return;
        }
        if !force && !self.samples.due(self.output_since_sample) {
            return;
        }
        if let Child::Exec(e) = &self.child
            && !e.sup.execd()
        {
            return; // not exec'd yet: wfjail's own image
        }
        let Some((pid, pidfd)) = self.guest_process() else {
            return;
        };
        let peak = crate::supervise::memory_evidence::vm_peak(pid);
        // Read after the guest exited, the pid may be another process's (a zygote reaps its
        // children): only a read made while the guest still ran counts.
        let mut fds = [PollFd::new(pidfd, PollFlags::POLLIN)];
        let exited = poll(&mut fds, PollTimeout::ZERO).is_ok_and(|n| n > 0);
        if !exited {
            self.memory_mut().peak(peak);
        }
        self.samples.sampled();
        self.output_since_sample = false;
    }

    /// Whether the guest's memory is sampled on a timer now: it runs (not stopped between
    /// calls) and `limits.memory` is set.
    pub(super) fn sampling(&self) -> bool {
        self.applied.memory.is_some() && !self.stopped && self.guest_process().is_some()
    }

    /// The guest's user + system CPU time in ms (`/proc/PID/stat`), while it runs.
    pub(super) fn guest_cpu_ms(&self) -> Option<f64> {
        let (pid, _) = self.guest_process()?;
        crate::procfs::Stat::of(pid)?.cpu_ms
    }

    /// A call began (or ended): its CPU budget starts from the guest's CPU time now.
    pub(super) fn start_call_cpu(&mut self, calling: bool) {
        self.call_cpu_start = if calling && self.server.policy.limits.cpu.is_some() {
            self.guest_cpu_ms()
        } else {
            None
        };
    }

    /// Checks the current call against `limits.cpu`; over it, the guest is killed.
    pub(super) fn check_call_cpu(&mut self) {
        let (Some(start), Some(limit)) = (self.call_cpu_start, self.server.policy.limits.cpu)
        else {
            return;
        };
        if self.call_cpu_exceeded {
            return;
        }
        if let Some(now) = self.guest_cpu_ms()
            && now - start >= limit.0.as_secs_f64() * 1000.0
        {
            self.call_cpu_exceeded = true;
            self.call_cpu_start = None;
            let acts = self.phases.fail(Failure::CallCpu(limit.0));
            self.act(acts);
        }
    }
}
