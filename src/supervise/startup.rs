//! The start-up of one confined child, from `clone` to its exec: the parent's side of the
//! set-up channel and of the initial `execve` notification, as one I/O-free state machine.
//!
//! `wfjail run`, an exec-mode serve session and a zygote's start all drive this machine from
//! their own loops: they read the channel and the listener, feed what they read here, and do
//! what it answers. What it decides (read top to bottom, this is the specification; the unit
//! tests below follow it rule by rule):
//!
//! 1. A `Degraded` record is kept; the child goes on.
//! 2. A `Fatal` record is kept; the child exits by itself after sending it.
//! 3. A `Listener` record says the seccomp listener came with it.
//! 4. A record that does not decode (length, magic, tag, step) ends the start-up: the caller
//!    kills the child and reports the channel error. A child that breaks the set-up protocol
//!    is not trusted to be confined.
//! 5. Before the child's initial exec, a notification that is that exec (the child's pid,
//!    `execve`, native ABI) is let through — or held, when the caller has a step to take
//!    between the exec's stop and its start ([`Startup::hold_exec`]), then let through with
//!    [`Startup::exec_step_done`]. Any other notification before it is refused (EPERM): the
//!    child's own code makes no watched call after installing the filter but that exec.
//!    After it, every notification is the guest's, for the caller's supervision.
//! 6. End-of-file on the close-on-exec channel: the exec happened (or the child died, which
//!    its pidfd tells). With a `Fatal` record kept, the start-up failed at that step.
//!
//! Room for more: a step that needs the parent first (a parent→child "go" over the channel)
//! would be one more state between `Confining` and `Execing`, fed by a new record.

use nix::errno::Errno;

use crate::process::channel::{ChannelError, ChildMsg, Step};

/// How a start-up ended badly.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StartupError {
    /// A required confinement step failed in the child (it exited).
    #[error("{} failed: {}", .step.describe(), .errno.desc())]
    Fatal { step: Step, errno: Errno },
    /// The child broke the set-up protocol (it must be killed).
    #[error("set-up channel: {0}")]
    Channel(ChannelError),
    /// The driver's own failures (not decisions of the machine): no exec in time,
    #[error("the child did not exec within {0:?}")]
    NoExec(std::time::Duration),
    /// or reading the channel or polling failed.
    #[error("set-up channel: {0}")]
    Io(Errno),
}

/// What the caller does after feeding a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Go on reading.
    Continue,
    /// Kill the child: it broke the set-up protocol ([`Startup::error`] says how).
    Kill,
}

/// How to answer a seccomp notification received during (or after) the start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The initial exec: let it continue.
    AllowExec,
    /// The initial exec, held for the caller's step; call [`Startup::exec_step_done`].
    HoldExec,
    /// Before the initial exec and not it: refuse with EPERM.
    Refuse,
    /// The guest's own call: the caller's supervision answers it.
    Guest,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Set-up records arrive; the exec has not been seen.
    Confining,
    /// The initial exec notification is held for the caller's step.
    ExecHeld,
    /// The initial exec was let through (or there is no listener to see it).
    Execing,
    /// End-of-file: the exec happened or the child died.
    Done,
}

/// The start-up of one child. See the module documentation for the rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Startup {
    state: State,
    hold_exec: bool,
    degraded: Vec<(Step, Errno)>,
    fatal: Option<(Step, Errno)>,
    channel_error: Option<ChannelError>,
    listener: bool,
    exec_seen: bool,
}

impl Default for Startup {
    fn default() -> Self {
        Self::new()
    }
}

impl Startup {
    pub fn new() -> Self {
        Startup {
            state: State::Confining,
            hold_exec: false,
            degraded: Vec::new(),
            fatal: None,
            channel_error: None,
            listener: false,
            exec_seen: false,
        }
    }

    /// Holds the initial exec at its notification until [`Startup::exec_step_done`] (for a
    /// step taken between the exec's stop and its start).
    pub fn hold_exec(mut self) -> Self {
        self.hold_exec = true;
        self
    }

    /// Rules 1–4: one record from the channel, or the error decoding it.
    pub fn record(&mut self, rec: Result<ChildMsg, ChannelError>) -> Next {
        if self.state == State::Done || self.channel_error.is_some() {
            return Next::Continue;
        }
        match rec {
            Ok(ChildMsg::Degraded { step, errno }) => self.degraded.push((step, errno)),
            Ok(ChildMsg::Fatal { step, errno }) => self.fatal = Some((step, errno)),
            Ok(ChildMsg::Listener) => self.listener = true,
            Err(e) => {
                self.channel_error = Some(e);
                return Next::Kill;
            }
        }
        Next::Continue
    }

    /// A step the parent takes for the child failed (the exec stop, `vdso.rs`): the start-up
    /// fails at it, as if the child had sent a `Fatal` record; the caller kills the child.
    pub fn parent_failed(&mut self, step: Step, errno: Errno) {
        self.fatal = Some((step, errno));
    }

    /// Rule 6: the channel reached end-of-file.
    pub fn eof(&mut self) {
        self.state = State::Done;
    }

    /// Rule 5: a notification; `initial_exec` says whether it is the child's `execve`
    /// (see [`crate::supervise::is_initial_exec`]).
    pub fn notification(&mut self, initial_exec: bool) -> Route {
        match self.state {
            State::Confining if initial_exec && !self.exec_seen => {
                self.exec_seen = true;
                if self.hold_exec {
                    self.state = State::ExecHeld;
                    Route::HoldExec
                } else {
                    self.state = State::Execing;
                    Route::AllowExec
                }
            }
            State::Confining | State::ExecHeld => Route::Refuse,
            State::Execing | State::Done => Route::Guest,
        }
    }

    /// The caller's step between the exec's stop and its start is done: let the held exec
    /// continue. `None` when no exec is held.
    pub fn exec_step_done(&mut self) -> Option<Route> {
        (self.state == State::ExecHeld).then(|| {
            self.state = State::Execing;
            Route::AllowExec
        })
    }

    /// Whether the channel is still to be read.
    pub fn reading(&self) -> bool {
        self.state != State::Done && self.channel_error.is_none()
    }

    /// Whether the start-up is over (end-of-file, or a broken channel).
    pub fn finished(&self) -> bool {
        !self.reading()
    }

    /// Whether the initial exec has been let through (a zygote's caller stops reading the
    /// listener there and hands it to its router).
    pub fn exec_allowed(&self) -> bool {
        self.exec_seen && self.state != State::ExecHeld
    }

    /// Whether the seccomp listener arrived.
    pub fn has_listener(&self) -> bool {
        self.listener
    }

    /// Best-effort steps that failed, in the child's order.
    pub fn degraded(&self) -> &[(Step, Errno)] {
        &self.degraded
    }

    /// The required step that failed, if any.
    pub fn fatal(&self) -> Option<(Step, Errno)> {
        self.fatal
    }

    /// How the start-up failed, if it did: a broken channel first (the child was killed),
    /// then a fatal step.
    pub fn error(&self) -> Option<StartupError> {
        if let Some(e) = self.channel_error {
            return Some(StartupError::Channel(e));
        }
        self.fatal
            .map(|(step, errno)| StartupError::Fatal { step, errno })
    }

    /// End-of-file without a failure: the exec happened (unless the pidfd says the child died).
    pub fn exec_confirmed(&self) -> bool {
        self.state == State::Done && self.error().is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn degraded(step: Step) -> Result<ChildMsg, ChannelError> {
        Ok(ChildMsg::Degraded {
            step,
            errno: Errno::EPERM,
        })
    }

    #[test]
    fn rule_1_degraded_steps_are_kept_in_order_and_the_child_goes_on() {
        let mut s = Startup::new();
        assert_eq!(s.record(degraded(Step::NetNs)), Next::Continue);
        assert_eq!(s.record(degraded(Step::UtsNs)), Next::Continue);
        assert_eq!(
            s.degraded(),
            &[(Step::NetNs, Errno::EPERM), (Step::UtsNs, Errno::EPERM)]
        );
        assert!(s.reading() && s.error().is_none());
    }

    #[test]
    fn rule_2_a_fatal_step_fails_the_start_up_at_end_of_file() {
        let mut s = Startup::new();
        let fatal = ChildMsg::Fatal {
            step: Step::Exec,
            errno: Errno::ENOENT,
        };
        assert_eq!(s.record(Ok(fatal)), Next::Continue);
        s.eof();
        assert!(s.finished() && !s.exec_confirmed());
        assert_eq!(
            s.error(),
            Some(StartupError::Fatal {
                step: Step::Exec,
                errno: Errno::ENOENT
            })
        );
        assert_eq!(
            s.error().unwrap().to_string(),
            "executing the command failed: No such file or directory"
        );
    }

    #[test]
    fn rule_3_the_listener_record_is_noted() {
        let mut s = Startup::new();
        assert!(!s.has_listener());
        s.record(Ok(ChildMsg::Listener));
        assert!(s.has_listener());
    }

    #[test]
    fn rule_4_a_record_that_does_not_decode_kills_the_child_and_ends_the_start_up() {
        let mut s = Startup::new();
        s.record(degraded(Step::NetNs));
        let bad = ChildMsg::decode(&[0xf7, 9, 0, 0, 0, 0, 0, 0]);
        assert_eq!(s.record(bad), Next::Kill);
        assert!(s.finished() && !s.exec_confirmed());
        assert_eq!(s.error(), Some(StartupError::Channel(ChannelError::Tag(9))));
        // Nothing read after it changes the verdict, not even end-of-file.
        s.record(Ok(ChildMsg::Fatal {
            step: Step::Landlock,
            errno: Errno::EPERM,
        }));
        s.eof();
        assert_eq!(s.error(), Some(StartupError::Channel(ChannelError::Tag(9))));
    }

    #[test]
    fn rule_5_the_initial_exec_passes_once_other_calls_before_it_are_refused() {
        let mut s = Startup::new();
        assert_eq!(s.notification(false), Route::Refuse);
        assert!(!s.exec_allowed());
        assert_eq!(s.notification(true), Route::AllowExec);
        assert!(s.exec_allowed());
        // After it, everything is the guest's, a second execve included.
        assert_eq!(s.notification(true), Route::Guest);
        assert_eq!(s.notification(false), Route::Guest);
        s.eof();
        assert_eq!(s.notification(true), Route::Guest);
    }

    #[test]
    fn rule_5_a_held_exec_waits_for_the_callers_step() {
        let mut s = Startup::new().hold_exec();
        assert_eq!(s.exec_step_done(), None, "nothing held yet");
        assert_eq!(s.notification(true), Route::HoldExec);
        assert!(!s.exec_allowed());
        // While it is held, nothing else of the child's is let through.
        assert_eq!(s.notification(false), Route::Refuse);
        assert_eq!(s.exec_step_done(), Some(Route::AllowExec));
        assert!(s.exec_allowed());
        assert_eq!(s.exec_step_done(), None, "let through once");
        assert_eq!(s.notification(false), Route::Guest);
    }

    #[test]
    fn rule_6_end_of_file_without_a_failure_confirms_the_exec() {
        let mut s = Startup::new();
        s.record(Ok(ChildMsg::Listener));
        assert_eq!(s.notification(true), Route::AllowExec);
        assert!(!s.exec_confirmed(), "not before end-of-file");
        s.eof();
        assert!(s.finished() && s.exec_confirmed() && s.error().is_none());
        // Without a listener (the fall-back filter) no exec notification comes: end-of-file
        // alone confirms it.
        let mut s = Startup::new();
        s.eof();
        assert!(s.exec_confirmed());
    }
}
