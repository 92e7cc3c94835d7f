//! Answering seccomp notifications and keeping the list of violations.

use std::collections::HashMap;
use std::io::Write;
use std::os::fd::BorrowedFd;

use crate::policy::{OnViolation, Policy};
use crate::report::{Action, Violation};
use crate::sys::{self, NotifAnswer, NotifBuf};

use super::decode;
use super::paths::WriteGrants;

/// Distinct violations kept in a report; repeats are counted, further kinds are dropped.
const MAX_DISTINCT_VIOLATIONS: usize = 256;

/// The violations of one execution, deduplicated, with a cursor for the guest's QUERY.
pub struct Violations<'a> {
    pub list: Vec<Violation>,
    index: HashMap<(String, String, &'static str), usize>,
    /// Indices touched since the last QUERY (in order, without repeats).
    since_query: Vec<usize>,
    echo: Option<&'a mut dyn Write>,
}

impl<'a> Violations<'a> {
    pub fn new(echo: Option<&'a mut dyn Write>) -> Self {
        Violations {
            list: vec![],
            index: HashMap::new(),
            since_query: vec![],
            echo,
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
                if let Some(w) = self.echo.as_mut() {
                    let _ = writeln!(w, "{}", v.summary());
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
    /// A violation was recorded and the policy says kill.
    Kill,
}

/// Receives one notification from `listener` and answers it per `policy`. `is_initial_exec`
/// tells whether a notification is the one exec that starts the guest (allowed once); `kill`
/// ends the guest when the policy says so (before its call returns).
pub fn handle_notification(
    listener: BorrowedFd<'_>,
    buf: &mut NotifBuf,
    policy: &Policy,
    grants: &WriteGrants,
    violations: &mut Violations<'_>,
    mut is_initial_exec: impl FnMut(&sys::Notif) -> bool,
    kill: impl FnOnce(),
) -> Handled {
    let Ok(n) = sys::notif_recv(listener, buf) else {
        return Handled::Quiet; // ENOENT: the task died or the call was interrupted
    };
    if is_initial_exec(&n) {
        let _ = sys::notif_send(listener, n.id, NotifAnswer::Continue);
        return Handled::Quiet;
    }
    let verdict = decode::classify(&n, policy, grants);
    if !sys::notif_id_valid(listener, n.id) {
        return Handled::Quiet; // what we read may not belong to this call any more
    }
    let Some(d) = verdict else {
        // A watched write inside the grants: Landlock has the last word.
        let _ = sys::notif_send(listener, n.id, NotifAnswer::Continue);
        return Handled::Quiet;
    };
    let (answer, action) = match policy.on_violation {
        OnViolation::Kill => (NotifAnswer::Error(d.errno), Action::Killed),
        OnViolation::Warn if !d.always_deny => (NotifAnswer::Continue, Action::Warned),
        _ => (NotifAnswer::Error(d.errno), Action::Denied),
    };
    // Record before answering: a guest that asks (QUERY) right after its call failed must find it.
    violations.record(Violation {
        hint: d.category.hint().to_string(),
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
    let _ = sys::notif_send(listener, n.id, answer);
    if action == Action::Killed {
        Handled::Kill
    } else {
        Handled::Recorded
    }
}
