//! Workflow time for `[time] clock = "virtual"`: the instant the guest's wall clock reads,
//! in nanoseconds since the Unix epoch, and its RFC 3339 text (`wfjail run --clock`, the
//! report's `clock`).
//!
//! The clock is frozen: every read in an execution (or, in `serve`, in a call) returns the
//! same instant, as `workflow.now()` does within one activation.
//!
//! The monotonic clocks (`CLOCK_MONOTONIC`, `_RAW`, `_COARSE`, `CLOCK_BOOTTIME`) read a
//! virtual monotonic clock ([`Monotonic`]): it starts at a fixed origin, follows the workflow
//! time forward, and moves one microsecond per read, so that two reads never give the same
//! value (code that divides by an elapsed time keeps working) and the same reads in a replay
//! give the same values.

use std::time::{SystemTime, UNIX_EPOCH};

/// Now, on the host's clock (the default workflow time of a `run` without `--clock`).
pub fn host_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos().min(i64::MAX as u128) as i64)
        .unwrap_or(0)
}

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

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day since 1970-01-01 (`civil_from_days`).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Parses an RFC 3339 instant (`2026-12-01T09:30:00Z`, `2026-12-01T10:30:00.25+01:00`; a
/// space or lower-case `t`/`z` accepted) or `@SECONDS[.FRACTION]` since the epoch, into
/// nanoseconds since the epoch. From 1970 to 2262-04-11 (what 64-bit nanoseconds hold).
pub fn parse(text: &str) -> Result<i64, String> {
    let bad = || {
        format!(
            "{text:?} is not a time: use RFC 3339 (2026-12-01T09:30:00Z, 2026-12-01T10:30:00.5+01:00) or @SECONDS since the epoch"
        )
    };
    if let Some(secs) = text.strip_prefix('@') {
        let (whole, frac) = secs.split_once('.').unwrap_or((secs, ""));
        let whole: i64 = whole.parse().map_err(|_| bad())?;
        if whole < 0 || frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let nanos: i64 = format!("{frac:0<9}").parse().map_err(|_| bad())?;
        return whole
            .checked_mul(1_000_000_000)
            .and_then(|n| n.checked_add(nanos))
            .ok_or_else(bad);
    }
    let b = text.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Result<i64, String> {
        let s = text.get(r).ok_or_else(bad)?;
        if s.bytes().all(|c| c.is_ascii_digit()) {
            s.parse().map_err(|_| bad())
        } else {
            Err(bad())
        }
    };
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return Err(bad());
    }
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, s) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let month_days = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if !(1970..=2262).contains(&y)
        || !(1..=12).contains(&mo)
        || d < 1
        || d > month_days[(mo - 1) as usize]
        || h > 23
        || mi > 59
        || s > 59
    {
        return Err(bad());
    }
    let mut rest = &text[19..];
    let mut nanos = 0i64;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 9 {
            return Err(bad());
        }
        nanos = format!("{:0<9}", &frac[..digits])
            .parse()
            .map_err(|_| bad())?;
        rest = &frac[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ if rest.len() == 6 && matches!(&rest[..1], "+" | "-") && &rest[3..4] == ":" => {
            let oh = num(text.len() - 5..text.len() - 3)?;
            let om = num(text.len() - 2..text.len())?;
            if oh > 23 || om > 59 {
                return Err(bad());
            }
            let o = oh * 3600 + om * 60;
            if rest.starts_with('-') { -o } else { o }
        }
        _ => return Err(bad()),
    };
    let secs = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + s - offset;
    if secs < 0 {
        return Err(bad());
    }
    secs.checked_mul(1_000_000_000)
        .and_then(|n| n.checked_add(nanos))
        .ok_or_else(bad)
}

/// `nanos` since the epoch as RFC 3339 in UTC, with as many fraction digits as it needs
/// (none, 3, 6 or 9), so that [`parse`] gives it back exactly.
pub fn format(nanos: i64) -> String {
    let secs = nanos.div_euclid(1_000_000_000);
    let frac = nanos.rem_euclid(1_000_000_000);
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let t = secs.rem_euclid(86_400);
    let frac = match frac {
        0 => String::new(),
        f if f % 1_000_000 == 0 => format!(".{:03}", f / 1_000_000),
        f if f % 1000 == 0 => format!(".{:06}", f / 1000),
        f => format!(".{f:09}"),
    };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}{frac}Z",
        t / 3600,
        t / 60 % 60,
        t % 60
    )
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
    fn parses_rfc3339_and_epoch_seconds() {
        assert_eq!(parse("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(parse("@0"), Ok(0));
        assert_eq!(parse("2026-12-01T09:30:00Z"), Ok(1_796_117_400_000_000_000));
        assert_eq!(
            parse("2026-12-01T10:30:00.5+01:00"),
            Ok(1_796_117_400_500_000_000)
        );
        assert_eq!(parse("@1796117400.5"), Ok(1_796_117_400_500_000_000));
        assert_eq!(parse("2000-02-29 12:00:00z"), Ok(951_825_600_000_000_000));
    }

    #[test]
    fn refuses_what_is_not_an_instant() {
        for t in [
            "",
            "now",
            "2026-12-01",
            "2026-12-01T09:30:00",
            "2026-13-01T09:30:00Z",
            "2026-02-29T09:30:00Z",
            "2026-12-01T24:00:00Z",
            "2026-12-01T09:30:00.Z",
            "2026-12-01T09:30:00.1234567890Z",
            "1969-12-31T23:59:59Z",
            "2026-12-01T09:30:00+1:00",
            "@-1",
            "2262-12-31T00:00:00Z",
            "9999-12-31T23:59:59Z",
            "@1.x",
        ] {
            assert!(parse(t).is_err(), "{t:?}");
        }
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

    #[test]
    fn formats_what_it_parses() {
        for t in [
            "1970-01-01T00:00:00Z",
            "2026-12-01T09:30:00Z",
            "2026-12-01T09:30:00.250Z",
            "2024-02-29T23:59:59.000001Z",
            "2262-01-01T00:00:00.999999999Z",
        ] {
            assert_eq!(format(parse(t).unwrap()), t);
        }
    }
}
