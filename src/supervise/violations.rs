//! Answering seccomp notifications and keeping the list of violations.

use std::collections::HashMap;
use std::os::fd::BorrowedFd;

use crate::policy::{OnViolation, Policy};
use crate::report::{Action, Violation};
use crate::sys::{self, Notif, NotifAnswer, NotifBuf};

use super::decode;
use super::paths::WriteGrants;

/// Distinct violations kept in a report; repeats are counted, further kinds are dropped.
const MAX_DISTINCT_VIOLATIONS: usize = 256;

/// The violations of one execution, deduplicated, with a cursor for the guest's QUERY.
#[derive(Debug, Default)]
pub struct Violations {
    pub list: Vec<Violation>,
    index: HashMap<(String, String, &'static str), usize>,
    /// Indices touched since the last QUERY (in order, without repeats).
    since_query: Vec<usize>,
    /// Print a one-line summary of each new violation on stderr, with this prefix.
    echo: Option<String>,
}

impl Violations {
    /// `echo`: print each new violation's summary line on stderr, after this prefix.
    pub fn new(echo: Option<String>) -> Self {
        Violations {
            echo,
            ..Default::default()
        }
    }

    /// Records `v` (or counts it again), printing a summary line the first time.
    pub fn record(&mut self, v: Violation) {
        let key = (v.syscall.clone(), v.args.clone(), v.action.as_str());
        let i = match self.index.get(&key) {
            Some(&i) => {
                self.list[i].count += 1;
                i
            }
            None => {
                if self.list.len() >= MAX_DISTINCT_VIOLATIONS {
                    return;
                }
                if let Some(prefix) = &self.echo {
                    // "wfjail: session 3: violation: ..." rather than a second "wfjail: ".
                    let line = v.summary();
                    eprintln!(
                        "{prefix}{}",
                        if prefix.is_empty() {
                            &line
                        } else {
                            line.trim_start_matches("wfjail: ")
                        }
                    );
                }
                self.index.insert(key, self.list.len());
                self.list.push(v);
                self.list.len() - 1
            }
        };
        if !self.since_query.contains(&i) {
            self.since_query.push(i);
        }
    }

    /// The violations recorded or repeated since the previous call (the answer to QUERY).
    pub fn take_since_query(&mut self) -> Vec<Violation> {
        std::mem::take(&mut self.since_query)
            .into_iter()
            .map(|i| self.list[i].clone())
            .collect()
    }

    /// Whether any call was actually stopped (not merely warned about).
    pub fn any_enforced(&self) -> bool {
        self.list.iter().any(|v| v.action != Action::Warned)
    }
}

/// What handling one notification led to.
#[derive(Debug, PartialEq, Eq)]
pub enum Handled {
    /// Nothing to record (an allowed watched write, a vanished call, the initial exec).
    Quiet,
    /// A violation was recorded.
    Recorded,
    /// A violation was recorded and the guest was killed, as the policy says.
    Killed,
}

/// Receives one notification (`None`: the call vanished, nothing to do).
pub fn receive(listener: BorrowedFd<'_>, buf: &mut NotifBuf) -> Option<Notif> {
    sys::notif_recv(listener, buf).ok()
}

/// Decides notification `n` of a guest under `policy`: lets a granted watched write continue,
/// or records the violation in `violations` and answers per `on_violation` (`kill` runs
/// before the call returns). `late_reads`: read-only opens are violations (prefork child).
pub fn answer(
    listener: BorrowedFd<'_>,
    n: &Notif,
    policy: &Policy,
    grants: &WriteGrants,
    late_reads: bool,
    violations: &mut Violations,
    kill: impl FnOnce(),
) -> Handled {
    let verdict = decode::classify(n, policy, grants, late_reads);
    if !sys::notif_id_valid(listener, n.id) {
        return Handled::Quiet; // what we read may not belong to this call any more
    }
    let Some(d) = verdict else {
        // A watched write inside the grants: Landlock has the last word.
        let _ = sys::notif_send(listener, n.id, NotifAnswer::Continue);
        return Handled::Quiet;
    };
    let (reply, action) = match policy.on_violation {
        OnViolation::Kill => (NotifAnswer::Error(d.errno), Action::Killed),
        OnViolation::Warn if !d.always_deny => (NotifAnswer::Continue, Action::Warned),
        _ => (NotifAnswer::Error(d.errno), Action::Denied),
    };
    // Record before answering: a guest that asks (QUERY) right after its call failed must find it.
    violations.record(Violation {
        hint: d.hint.unwrap_or(d.category.hint()).to_string(),
        category: d.category,
        syscall: d.syscall,
        args: d.args,
        action,
        rule: d.rule,
        count: 1,
    });
    if action == Action::Killed {
        kill();
    }
    let _ = sys::notif_send(listener, n.id, reply);
    if action == Action::Killed {
        Handled::Killed
    } else {
        Handled::Recorded
    }
}

/// Lets the call of notification `n` run (the initial exec, the zygote's own calls).
pub fn allow(listener: BorrowedFd<'_>, n: &Notif) {
    let _ = sys::notif_send(listener, n.id, NotifAnswer::Continue);
}

/// Denies the call of notification `n` with `errno`, without recording it.
pub fn refuse(listener: BorrowedFd<'_>, n: &Notif, errno: i32) {
    let _ = sys::notif_send(listener, n.id, NotifAnswer::Error(errno));
}
