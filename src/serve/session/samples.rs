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
        let Some((_, pidfd)) = self.guest_process() else {
            return;
        };
        let peak = self
            .guest_proc(&self.proc_status, "status")
            .and_then(|f| f.status())
            .and_then(|s| s.bytes("VmPeak"));
        // Only a read made while the guest still ran counts (after its exit the kernel has
        // no address space to report).
        if !exited(pidfd) {
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
        self.guest_stat()?.cpu_ms
    }

    /// What `/proc/PID/stat` says of the guest now (`None`: it is gone, or not known yet).
    pub(super) fn guest_stat(&self) -> Option<crate::procfs::Stat> {
        self.guest_proc(&self.proc_stat, "stat")?.stat()
    }

    /// The guest's `/proc/PID/{name}`, opened at the first look (one `pread` a look from
    /// then on). Opened by pid, it is the guest's only if the guest had not exited when the
    /// open returned (until reaped, a pid is its process's): opened later, it is not kept and
    /// the look sees nothing, as the guest is gone. The open file stays bound to the guest:
    /// once the guest is reaped it reads as gone, never as a process that reused the pid.
    fn guest_proc<'a>(
        &self,
        cell: &'a std::cell::OnceCell<Option<crate::procfs::ProcFile>>,
        name: &str,
    ) -> Option<&'a crate::procfs::ProcFile> {
        if let Some(f) = cell.get() {
            return f.as_ref();
        }
        let (pid, pidfd) = self.guest_process()?;
        let file = crate::procfs::ProcFile::open(pid, name)?;
        if exited(pidfd) {
            return None;
        }
        cell.get_or_init(|| Some(file)).as_ref()
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

/// Whether the process behind `pidfd` has exited (its pidfd reads ready).
fn exited(pidfd: std::os::fd::BorrowedFd<'_>) -> bool {
    let mut fds = [PollFd::new(pidfd, PollFlags::POLLIN)];
    poll(&mut fds, PollTimeout::ZERO).is_ok_and(|n| n > 0)
}
