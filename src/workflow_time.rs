//! Workflow time for `[time] clock = "virtual"`: the instant the guest's wall clock reads,
//! in nanoseconds since the Unix epoch, and its RFC 3339 text (`wfjail run --clock`, the
//! report's `clock`).
//!
//! The clock is frozen: every read in an execution (or, in `serve`, in a call) returns the
//! same instant, as `workflow.now()` does within one activation.
//!
//! A leaf (it imports nothing of the crate), so that the report can show a workflow time
//! without importing the answers (`answers/` re-exports it beside the other answers); the
//! virtual monotonic clock is `answers/monotonic.rs`.

use std::time::{SystemTime, UNIX_EPOCH};

/// Now, on the host's clock (the default workflow time of a `run` without `--clock`).
pub fn host_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos().min(i64::MAX as u128) as i64)
        .unwrap_or(0)
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

#[cfg(test)]
mod tests {
    use super::*;

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
