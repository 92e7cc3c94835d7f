//! Exec mode: the guest's start-up (its set-up channel and the initial exec, through
//! startup.rs's driver) and its own seccomp notifications.

use std::os::fd::AsFd;

use nix::poll::PollFlags;

use crate::notify::{self, Handled};
use crate::supervise::startup::{ChanRead, Listened};
use crate::sys;

use super::super::launch::Child;
use super::*;

impl Session {
    /// Exec mode: set-up records until end-of-file (the exec happened); a child that breaks
    /// the set-up protocol is killed (supervise/startup.rs).
    pub(super) fn on_chan(&mut self) {
        let Child::Exec(e) = &mut self.child else {
            return;
        };
        if e.start.read_chan() == ChanRead::Kill {
            self.kill(); // recorded as wfjail's own kill
        }
    }

    /// Exec mode: the guest's own seccomp notifications.
    pub(super) fn on_listener(&mut self, rev: PollFlags) {
        let Child::Exec(e) = &mut self.child else {
            return;
        };
        let n = match e.start.on_listener(rev) {
            Listened::Guest(n) => n,
            Listened::Nothing => return,
            Listened::ExecStopFailed(err) => {
                eprintln!("wfjail: session {}: {err}", self.id);
                let _ = sys::pidfd_send_signal(e.pidfd.as_fd(), libc::SIGKILL);
                return;
            }
        };
        let Some(l) = e.start.listener() else { return };
        // The supervisor's work for the session is bounded (notify::Budget).
        let pidfd = e.pidfd.clone();
        let kill = || {
            let _ = sys::pidfd_send_signal(pidfd.as_fd(), libc::SIGKILL);
        };
        if !notify::charge(&mut self.shared.budget.lock().unwrap(), l.as_fd(), &n, kill) {
            self.shared.mark_killed();
            return;
        }
        // Kernel evidence for the memory limit (memory_evidence.rs).
        self.memory
            .on_notification(l, &n, e.pid, &self.server.policy, &e.plan.rules.decisions);
        let mut v = self.shared.violations.lock().unwrap();
        let mut det = self.shared.determinism.lock().unwrap();
        let det = &mut *det;
        let clock = det.clock;
        let state = notify::State {
            violations: &mut v,
            entropy: det.entropy.as_mut(),
            clock,
            monotonic: &mut det.monotonic,
            learned: None,
        };
        let rules = notify::Rules::new(&e.plan, &e.grants);
        let handled = notify::handle(l.as_fd(), &n, rules, state, || {
            let _ = sys::pidfd_send_signal(pidfd.as_fd(), libc::SIGKILL);
        });
        drop((v, det));
        if handled == Handled::Killed {
            self.shared.mark_killed();
        }
    }
}
