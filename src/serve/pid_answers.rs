//! How a zygote session's pinned pid was answered: by the router (a `getpid` or `gettid`
//! notification answered with `SESSION_PID`), or in the guest (`answers/guest_pid.rs`: the
//! session's own C library rewritten when the router answered its first). Counted for STATUS
//! (`pid_answers`) and `--metrics` (`wfjail_pid_answers_total`): a test and an operator see
//! whether sessions still pay a round trip per `getpid`. One server per process: the counters
//! are the process's.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::answers::guest_pid::Skip;

static NOTIFIED: AtomicU64 = AtomicU64::new(0);
static IN_GUEST: AtomicU64 = AtomicU64::new(0);
static SKIPPED: [AtomicU64; Skip::ALL.len()] = [const { AtomicU64::new(0) }; Skip::ALL.len()];

/// The router answered a pinned pid.
pub fn notified() {
    NOTIFIED.fetch_add(1, Ordering::Relaxed);
}

/// A session's process answers its pinned pid in the guest from now on.
pub fn in_guest() {
    IN_GUEST.fetch_add(1, Ordering::Relaxed);
}

/// A session's process was left as it was, for `why`.
pub fn skipped(why: Skip) {
    SKIPPED[why as usize].fetch_add(1, Ordering::Relaxed);
}

/// Every count so far, by name (all of them, zeros too): `notified`, `in_guest`, and
/// `skipped_WHY` for each reason a process was left as it was.
pub fn counts() -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    out.insert("notified".to_string(), NOTIFIED.load(Ordering::Relaxed));
    out.insert("in_guest".to_string(), IN_GUEST.load(Ordering::Relaxed));
    for why in Skip::ALL {
        out.insert(
            format!("skipped_{}", why.name()),
            SKIPPED[why as usize].load(Ordering::Relaxed),
        );
    }
    out
}
