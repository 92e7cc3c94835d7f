//! The session's report: the facts of how its guest ended, judged as `wfjail run` judges its
//! guest (supervise/assemble.rs).

use crate::report::Report;
use crate::supervise::assemble::{self, Account};
use crate::supervise::verdict::{self, Ending, Facts, SetupFailed};

use super::super::Server;
use super::super::launch::Child;
use super::super::zygote::ChildExit;
use super::*;

impl Session {
    /// The session's report: the facts of how its guest ended, judged by
    /// [`verdict::classify`] as `wfjail run` judges its guest.
    pub(super) fn report(&mut self) -> Report {
        let (status_word, cpu_ms, max_rss_kb, layers, zygote_died) = match &self.child {
            Child::Zygote { zygote, .. } => {
                let exit = self.shared.exit().unwrap_or(ChildExit {
                    status: None,
                    cpu_ms: 0.0,
                    max_rss_kb: 0,
                });
                (
                    exit.status,
                    exit.cpu_ms,
                    exit.max_rss_kb,
                    zygote.layers.clone(),
                    exit.status.is_none(),
                )
            }
            Child::Exec(e) => {
                let layers = assemble::layers(
                    &e.plan,
                    &e.base,
                    e.sup.start().startup().degraded(),
                    e.sup.start().startup().has_listener(),
                );
                let (cpu, rss) = e.reaped.map_or((0.0, 0), |r| (r.cpu_ms(), r.max_rss_kb()));
                (e.reaped.map(|r| r.status), cpu, rss, layers, false)
            }
        };
        let violations = self.shared.violations.lock().unwrap();
        let enforced = violations.any_enforced();
        let list = violations.list.clone();
        drop(violations);
        let fatal = match &self.child {
            Child::Exec(e) => e
                .sup
                .start()
                .startup()
                .fatal()
                .map(|(step, errno)| SetupFailed {
                    step,
                    errno,
                    command: e.plan.command.display().to_string(),
                }),
            Child::Zygote { .. } => None,
        };
        let errored = self.phases.guest_error().is_some();
        // Kernel evidence for RLIMIT_FSIZE, looked for only when the guest failed.
        let file_at_limit = verdict::guest_failed(status_word, errored)
            && self
                .applied
                .file_at_limit(std::time::SystemTime::now() - self.started.elapsed())
                .is_some();
        let channel_error = match &self.child {
            Child::Exec(e) => e.sup.start().startup().channel_error(),
            Child::Zygote { .. } => None,
        };
        let facts = Facts {
            fatal,
            channel_error,
            wait_status: status_word,
            zygote_died,
            violation_enforced: enforced,
            // A guest that did not exit within its grace after the close was killed: its
            // report says so as a timeout, not as a crash with no words.
            timed_out: self.phases.timed_out() || self.phases.exit_overdue(),
            timeout_words: self
                .phases
                .exit_overdue()
                .then(|| match self.phases.displaced_at() {
                    Some(n) => format!(
                        "the session was closed, but its guest had not exited when a newer \
                         closed guest needed its place ({n} lingered, as many as \
                         --max-executions): killed before its {} s exit grace ended",
                        crate::serve::phases::EXIT_GRACE.as_secs()
                    ),
                    None => format!(
                        "the session was closed, but its guest did not exit within {} s of \
                         its input ending (an atexit handler, a thread, a finalizer that does \
                         not return): killed",
                        crate::serve::phases::EXIT_GRACE.as_secs()
                    ),
                }),
            protocol_error: self.phases.protocol_error(),
            output_exceeded: self.output_exceeded,
            notifications_exceeded: self.shared.budget.lock().unwrap().exceeded,
            call_cpu_exceeded: self.call_cpu_exceeded,
            // Killed by the session, or by the router for a violation.
            killed_by_supervisor: self.killed || self.shared.killed(),
            cpu_ms,
            // The kernel's CPU limit in a session is its whole life's (RLIMIT_CPU); a call's
            // own budget is measured here (`call_cpu_exceeded`).
            cpu_limit: self.server.policy.limits.session_cpu.map(|c| c.0),
            memory_limit: self.applied.memory,
            vm_peak: self.memory().vm_peak,
            memory_refused: self.memory().refused.is_some(),
            file_at_limit,
            errored,
            ending: Ending::Session(self.phases.end()),
            stopped: self.phases.failure().map(ToString::to_string),
            ..Facts::default()
        };
        // One lock, taken apart from the account: a struct literal keeps its temporaries.
        let (seed, clock) = {
            let det = self.shared.determinism.lock().unwrap();
            (det.seed, det.clock)
        };
        let account = Account {
            policy: self.server.policy.name.clone(),
            command: self.command.clone(),
            layers,
            violations: list,
            duration: self.started.elapsed(),
            max_rss_kb,
            guest_error: self.phases.guest_error().cloned(),
            seed,
            clock,
            ..Account::default()
        };
        assemble::report(&facts, account)
    }
}

/// A report for a session that never got a guest.
pub(super) fn failure_report(server: &Server, command: Vec<String>, message: String) -> Report {
    Report::launch_error(&server.policy.name, &command, message, 125)
}
