//! The waits on a session's path that ended on their timeout instead of the event they wait
//! for. Each such wait is a backstop that fired: under a correct server none does, so they are
//! counted (STATUS's `waits_timed_out`, `wfjail_waits_timed_out_total` in `--metrics`) for a
//! test and an operator to see. One server per process: the counters are the process's.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// A wait on a session's path with a timeout as its backstop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// The router held a call of a child not known yet for its FORKED.
    ForkedBeforeCall,
    /// A FORK waited for the zygote's FORKED.
    Forked,
    /// A session waited for its guest to stop after SIGSTOP.
    GuestStop,
}

const ALL: [Wait; 3] = [Wait::ForkedBeforeCall, Wait::Forked, Wait::GuestStop];

static COUNTS: [AtomicU64; ALL.len()] = [const { AtomicU64::new(0) }; ALL.len()];

impl Wait {
    /// Its name in STATUS and the metrics' `wait` label.
    pub fn name(self) -> &'static str {
        match self {
            Wait::ForkedBeforeCall => "forked_before_call",
            Wait::Forked => "forked",
            Wait::GuestStop => "guest_stop",
        }
    }
}

/// `wait` ended on its timeout.
pub fn timed_out(wait: Wait) {
    COUNTS[wait as usize].fetch_add(1, Ordering::Relaxed);
}

/// Every wait's count of timeouts so far, by name (all of them, zeros too).
pub fn counts() -> BTreeMap<String, u64> {
    ALL.iter()
        .map(|w| {
            (
                w.name().to_string(),
                COUNTS[*w as usize].load(Ordering::Relaxed),
            )
        })
        .collect()
}
