//! Exec mode: the session embeds its guest's supervisor (supervise/guest.rs: the start-up,
//! the guest's own seccomp notifications, its pidfd), whose notification state is the
//! session's shared one, and records what it reports the session's way.

use std::sync::Arc;

use nix::poll::PollFlags;

use crate::notify::{self, Handled, Rules};
use crate::supervise::guest::{Answering, Progress, Token};
use crate::supervise::memory_evidence::MemoryEvidence;
use crate::sys;

use super::super::SessionShared;
use super::super::launch::Child;
use super::Session;

/// A session's notification state is shared (the zygote router and the report read it): on
/// the session's own thread these locks are uncontended.
impl Answering for Arc<SessionShared> {
    fn charge(
        &mut self,
        listener: std::os::fd::BorrowedFd<'_>,
        n: &sys::Notif,
        kill: &dyn Fn(),
    ) -> bool {
        notify::charge(&mut self.budget.lock().unwrap(), listener, n, kill)
    }

    fn answer(
        &mut self,
        listener: std::os::fd::BorrowedFd<'_>,
        n: &sys::Notif,
        rules: Rules<'_>,
        kill: &dyn Fn(),
    ) -> Handled {
        let mut v = self.violations.lock().unwrap();
        let mut det = self.determinism.lock().unwrap();
        let det = &mut *det;
        let state = notify::State {
            violations: &mut v,
            entropy: det.entropy.as_mut(),
            clock: det.clock,
            monotonic: &mut det.monotonic,
            inodes: &mut det.inodes,
            learned: None,
        };
        notify::handle(listener, n, rules, state, kill)
    }
}

impl Session {
    /// Exec mode: the supervisor's descriptor `token` was ready with `rev`.
    pub(super) fn on_exec(&mut self, token: Token, rev: PollFlags) {
        let Child::Exec(e) = &mut self.child else {
            return;
        };
        match e.sup.on_ready(token, rev) {
            Progress::Nothing => {}
            Progress::Exited => {
                if e.reaped.is_none() {
                    e.reaped = sys::wait4(e.sup.pid()).ok();
                }
            }
            // A child that broke the set-up protocol: wfjail's own kill.
            Progress::SetupBroken => self.killed = true,
            Progress::ExecStopFailed(err) => eprintln!("wfjail: session {}: {err}", self.id),
            Progress::OverBudget | Progress::KilledForViolation => self.shared.mark_killed(),
        }
    }

    /// Kernel evidence for the memory limit: the supervisor's in exec mode (it also reads the
    /// guest's notifications), the session's own in zygote mode.
    pub(super) fn memory(&self) -> &MemoryEvidence {
        match &self.child {
            Child::Exec(e) => &e.sup.memory,
            Child::Zygote { .. } => &self.memory,
        }
    }

    pub(super) fn memory_mut(&mut self) -> &mut MemoryEvidence {
        match &mut self.child {
            Child::Exec(e) => &mut e.sup.memory,
            Child::Zygote { .. } => &mut self.memory,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::policy::OnViolation;
    use crate::supervise::guest::tests::{drive, supervised_with};

    #[test]
    fn a_sessions_supervisor_records_into_the_state_the_session_shares() {
        // The zygote router and the session's report read SessionShared: what the embedded
        // supervisor answered must be there, and the budget charged there.
        let shared = SessionShared::new(1, false).unwrap();
        let mut sup = supervised_with(
            "strict",
            &["/usr/bin/python3", "-c", "import os; os.urandom(8)"],
            |j| j.on_violation = OnViolation::Deny,
            shared.clone(),
        );
        drive(&mut sup, Duration::from_secs(30));
        let _ = sys::wait4(sup.pid());
        let v = shared.violations.lock().unwrap();
        assert!(
            v.list.iter().any(|v| v.syscall == "getrandom"),
            "{:?}",
            v.list
        );
        assert!(shared.budget.lock().unwrap().answered > 0);
    }
}
