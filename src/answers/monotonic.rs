//! The virtual monotonic clock of `[time] clock = "virtual"`: the monotonic clocks
//! (`CLOCK_MONOTONIC`, `_RAW`, `_COARSE`, `CLOCK_BOOTTIME`) read [`Monotonic`]: it starts at
//! a fixed origin, follows the workflow time forward, and moves one microsecond per read, so
//! that two reads never give the same value (code that divides by an elapsed time keeps
//! working) and the same reads in a replay give the same values. And which CPU-time clocks
//! are another process's (refused as if that pid did not exist).

/// Where the virtual monotonic clock starts: 1,000 s, as on a machine booted a while ago
/// (code that takes 0 for "never" sees a time).
pub const MONOTONIC_ORIGIN: i64 = 1_000_000_000_000;

/// How far the virtual monotonic clock moves at each read: 1 µs.
pub const MONOTONIC_TICK: i64 = 1_000;

/// The virtual monotonic clock of one execution (a `run`, a `serve` session).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Monotonic {
    /// The workflow time of its first read.
    start: Option<i64>,
    /// Its last value.
    last: Option<i64>,
}

impl Monotonic {
    /// The next read while the workflow time is `now` (nanoseconds since the epoch): the
    /// origin plus how far the workflow time moved since the first read, and at least one
    /// tick past the last value (a workflow time that goes back does not take it back).
    pub fn read(&mut self, now: i64) -> i64 {
        let start = *self.start.get_or_insert(now);
        let follows = MONOTONIC_ORIGIN.saturating_add(now.saturating_sub(start).max(0));
        let v = match self.last {
            Some(last) => follows.max(last.saturating_add(MONOTONIC_TICK)),
            None => follows,
        };
        self.last = Some(v);
        v
    }
}

/// Whether `clockid` (as `clock_gettime` takes it) is the CPU-time clock of a process other
/// than the caller's, global pid `caller` (a task that waits on its notification, so its pid
/// is its own): `MAKE_PROCESS_CPUCLOCK(pid, _)` for a pid that is neither 0 nor its own in
/// its namespace. The kernel lets a process read any CPU clock of its PID namespace: a
/// zygote's (which grows with every session it forked) or a sibling session's.
pub fn foreign_cpu_clock(clockid: u64, caller: u32) -> bool {
    let id = clockid as u32 as i32;
    // Negative, not a thread clock (bit 2), not a descriptor's clock (type 3).
    if id >= 0 || id & 4 != 0 || id & 3 == 3 {
        return false;
    }
    let pid = !(id >> 3);
    pid != 0 && Some(pid) != ns_tgid(caller)
}

/// The process id of task `tid` in its own (innermost) PID namespace (`NStgid`).
fn ns_tgid(tid: u32) -> Option<i32> {
    crate::procfs::ns_tgid(tid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_named_other_process_clock_is_foreign() {
        let me = std::process::id();
        let ns = ns_tgid(me).unwrap();
        let process = |pid: i32| ((!pid << 3) | 2) as u32 as u64;
        assert!(foreign_cpu_clock(process(ns + 1), me));
        if ns != 1 {
            assert!(foreign_cpu_clock(process(1), me), "pid 1 (a zygote)");
        }
        assert!(!foreign_cpu_clock(process(ns), me), "its own pid");
        assert!(!foreign_cpu_clock(process(0), me), "pid 0: itself");
        assert!(!foreign_cpu_clock(2, me), "CLOCK_PROCESS_CPUTIME_ID");
        assert!(
            !foreign_cpu_clock(((!5 << 3) | 6) as u32 as u64, me),
            "a thread clock"
        );
        assert!(
            !foreign_cpu_clock(((!5 << 3) | 3) as u32 as u64, me),
            "a descriptor's"
        );
    }

    #[test]
    fn the_monotonic_clock_ticks_per_read_and_follows_the_workflow_time() {
        let mut m = Monotonic::default();
        let t = 1_796_117_400_000_000_000;
        assert_eq!(m.read(t), MONOTONIC_ORIGIN);
        assert_eq!(m.read(t), MONOTONIC_ORIGIN + MONOTONIC_TICK);
        // The next activation, 5 s of workflow time later.
        assert_eq!(m.read(t + 5_000_000_000), MONOTONIC_ORIGIN + 5_000_000_000);
        // A workflow time that goes back: still forward.
        assert_eq!(m.read(t), MONOTONIC_ORIGIN + 5_000_000_000 + MONOTONIC_TICK);
        // Another execution at another workflow time reads the same first values.
        let mut other = Monotonic::default();
        assert_eq!(other.read(42), MONOTONIC_ORIGIN);
    }
}
