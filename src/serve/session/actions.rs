//! Carrying out the phase machine's actions (phases.rs): what each does to the guest, the
//! worker and the session's own state.

use std::os::fd::AsRawFd;
use std::time::Instant;

use nix::sys::socket::{Shutdown, shutdown};
use serde_json::json;

use crate::echo::escape_guest_text;
use crate::protocol::guest as gp;
use crate::protocol::worker::{self, Opened};
use crate::protocol::{Kind, MAX_FRAME, encode};
use crate::supervise::level_name;
use crate::sys;

use super::super::launch::Child;
use super::super::phases::{Action, Failure};
use super::*;

impl Session {
    /// Carries out the phase machine's actions, in order. Returns false when one could not
    /// be carried out (the guest's outbox was full: the session failed) and the rest were
    /// dropped.
    pub(super) fn act(&mut self, actions: Vec<Action>) -> bool {
        for action in actions {
            match action {
                Action::SetClock(t) => {
                    let mut det = self.shared.determinism.lock().unwrap();
                    if det.clock.is_some() {
                        det.clock = Some(t); // a TIME under a real clock changes nothing
                    }
                }
                Action::Request(request) => {
                    if let Err(e) = self.guest_out.push(&encode(Kind::Request, &request)) {
                        let acts = self.phases.request_unsent(e);
                        self.act(acts);
                        return false;
                    }
                    self.conv.begin_call();
                    self.call_started = Some(Instant::now());
                    self.start_call_cpu(true);
                    self.counts_at_call = self
                        .shared
                        .violations
                        .lock()
                        .unwrap()
                        .list
                        .iter()
                        .map(|v| v.count)
                        .collect();
                    self.flush_guest();
                }
                Action::Resume => self.resume_guest(),
                Action::Stop => {
                    if let Err(why) = self.stop_guest() {
                        let acts = self.phases.fail(why);
                        self.act(acts);
                    }
                }
                Action::EndInput => {
                    // End-of-file on its input tells the guest there is no further call.
                    let _ = shutdown(self.guest.as_raw_fd(), Shutdown::Write);
                    self.linger();
                }
                Action::Opened => {
                    // The guest said HELLO: from now on its randomness is the session's
                    // stream (a forked child drew before, at fork and while starting; those
                    // draws depend on whether a spare was ready, so they get fixed bytes).
                    self.shared.determinism.lock().unwrap().armed = true;
                    self.server.metrics.session_opened();
                    let mode = if matches!(self.child, Child::Zygote { .. }) {
                        "zygote"
                    } else {
                        "exec"
                    };
                    let opened = Opened {
                        session: self.id,
                        mode: mode.into(),
                        pid: self.guest_process().map(|(pid, _)| pid),
                    };
                    let doc = serde_json::to_vec(&opened).unwrap_or_default();
                    self.client.send(worker::OPENED, &doc);
                }
                Action::Result(bytes) => {
                    self.start_call_cpu(false);
                    if let Some(t) = self.call_started.take() {
                        self.server.metrics.call(t.elapsed(), false);
                    }
                    // A call that succeeded may still have been denied something (code that
                    // swallowed the error): the worker hears of it before the result.
                    let during = self.call_violations();
                    if !during.is_empty() {
                        let doc = serde_json::to_vec(&during).unwrap_or_default();
                        self.client.send(worker::VIOLATIONS, &doc);
                    }
                    self.client.send(worker::RESULT, &bytes)
                }
                Action::CallError(e) => {
                    self.start_call_cpu(false);
                    if let Some(t) = self.call_started.take() {
                        self.server.metrics.call(t.elapsed(), true);
                    }
                    // The violations of this call only: a guest's ERROR typed
                    // `wfjail.Violation` cannot borrow one from an earlier call.
                    let during = self.call_violations();
                    let doc = json!({
                        "type": e.kind, "message": e.message, "traceback": e.traceback,
                        "violations": during,
                    });
                    self.client.send(worker::ERROR, doc.to_string().as_bytes());
                }
                Action::AnswerQuery => {
                    let list = self.shared.violations.lock().unwrap().take_since_query();
                    if let Err(e) = self.guest_out.push(&gp::violations_frame(&list, MAX_FRAME)) {
                        let acts = self.phases.fail(Failure::QueryUnread(e));
                        self.act(acts);
                        return false;
                    }
                    self.flush_guest();
                }
                Action::Log { level, text } => {
                    if self.relay_logs {
                        let doc = json!({"level": level, "text": text});
                        self.client.send(worker::LOG, doc.to_string().as_bytes());
                    } else if self.server.echo {
                        // Escaped: a guest's text cannot start a line of its own.
                        eprintln!(
                            "[session {}] log ({}): {}",
                            self.id,
                            level_name(level),
                            escape_guest_text(text.as_bytes())
                        );
                    }
                }
                Action::Upcall(bytes) => self.client.send(worker::UPCALL, &bytes),
                Action::Interrupt => {
                    if let Some((_, pidfd)) = self.guest_process() {
                        let _ = sys::pidfd_send_signal(pidfd, libc::SIGUSR2);
                    }
                }
                Action::Reply(payload) => {
                    if let Err(e) = self.guest_out.push(&encode(Kind::Reply, &payload)) {
                        let acts = self.phases.fail(Failure::RequestUnsent(e));
                        self.act(acts);
                        return false;
                    }
                    self.flush_guest();
                }
                Action::SampleMemory => self.sample_memory(true),
                Action::Kill => self.kill(),
            }
        }
        true
    }

    /// The session is closed (its guest's input ended): its slot is freed for the next OPEN
    /// while the guest has its exit grace, lingering (`Slots`).
    fn linger(&mut self) {
        if let Some(slot) = self.slot.as_mut() {
            slot.linger(&self.shared);
        }
    }

    /// Kills the lingering guest a newer one displaced (checked every turn of the loop).
    pub(super) fn check_displaced(&mut self) {
        if let Some(n) = self.shared.displaced()
            && self.phases.displaced_at().is_none()
        {
            let acts = self.phases.linger_displaced(n);
            if !acts.is_empty() {
                self.server.metrics.linger_displaced();
            }
            self.act(acts);
        }
    }

    /// The violations recorded during the current call: the new entries, and those counted
    /// again since it began.
    pub(super) fn call_violations(&self) -> Vec<crate::report::Violation> {
        let v = self.shared.violations.lock().unwrap();
        v.list
            .iter()
            .enumerate()
            .filter(|(i, v)| self.counts_at_call.get(*i).is_none_or(|&c| v.count > c))
            .map(|(_, v)| v.clone())
            .collect()
    }
}
