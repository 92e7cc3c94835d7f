//! Phase timestamps for profiling one run: `WFJAIL_TIMING=1 wfjail run ...` prints where the
//! time went (used to write docs/benchmarks.md). Off by default: a relaxed atomic check.

use std::cell::RefCell;
use std::sync::OnceLock;
use std::time::Instant;

fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("WFJAIL_TIMING").is_some())
}

thread_local! {
    static MARKS: RefCell<Vec<(&'static str, Instant)>> = const { RefCell::new(Vec::new()) };
}

/// Records that `phase` ended now.
pub fn mark(phase: &'static str) {
    if enabled() {
        MARKS.with(|m| m.borrow_mut().push((phase, Instant::now())));
    }
}

/// Prints the recorded phases (durations since the previous mark) to stderr.
pub fn print(start: Instant) {
    if !enabled() {
        return;
    }
    MARKS.with(|m| {
        let mut prev = start;
        for (phase, t) in m.borrow().iter() {
            eprintln!(
                "wfjail timing: {:>8.3} ms  {phase}",
                (*t - prev).as_secs_f64() * 1000.0
            );
            prev = *t;
        }
        eprintln!(
            "wfjail timing: {:>8.3} ms  total",
            (prev - start).as_secs_f64() * 1000.0
        );
    });
}
