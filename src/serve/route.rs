//! The zygote's notification router as a pure function: what to do with one notification
//! given what the rule set says of its call ([`Call`]) and who asks ([`Asker`]). The
//! router's loop (`zygote.rs`) gathers those facts, asks [`route`] (and, for a session's
//! call past its budget, [`route_session`]), and carries the answer out; the answers
//! themselves are the one handler's (`notify/`), never a copy.

use crate::policy::decisions::Check;

/// What the router knows of a call before routing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    /// The native ABI (x86_64): only those calls are answered; any other goes to the handler.
    pub native: bool,
    /// The supervisor's check of the call's number, from the rule set.
    pub check: Option<Check>,
    /// `fork`, `vfork`, or `clone` without `CLONE_THREAD`.
    pub forks: bool,
    /// `clone` with `CLONE_THREAD`: a new thread of the caller's process.
    pub spawns_thread: bool,
    /// `nanosleep` or `clock_nanosleep`: a sleep.
    pub sleeps: bool,
    /// `getrandom`: entropy, whatever the policy makes of it (`seeded`: answered from a seed;
    /// `deny`: a violation, or a warning under `warn`; `allow`: never notified).
    pub draws_entropy: bool,
    /// A signal (`kill`, `tkill`, `tgkill`) to the caller's own pid or thread group in the
    /// namespace.
    pub signals_itself: bool,
    /// A signal to the pinned session pid (`SESSION_PID`, for `tgkill` with a thread of the
    /// caller), under a policy that pins it.
    pub signals_session_pid: bool,
}

/// Who asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asker {
    /// The zygote itself (preloading, forking, waiting between sessions): its main thread.
    Zygote,
    /// Another thread of the zygote's process: one a preloaded module started at import (grpc
    /// does). It is the zygote's code, but never forks sessions.
    ZygoteThread,
    /// A session's guest (its budget is charged before [`route_session`]).
    Session,
    /// A spare before it has a session, or a pid the router does not know.
    Unknown,
}

/// What the router does with a notification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routed {
    /// Let it run.
    Continue,
    /// A signal to itself: let it run, charged to the session's budget when a session asks.
    SignalItself,
    /// The zygote's own call: the handler judges it, with violations denied (never killed)
    /// and its clocks read from the preload instant.
    ZygoteHandles,
    /// A spare's `getrandom`: the handler's seeded answer from a stream of seed 0 (the
    /// session reseeds from its own).
    SpareSeeded,
    /// A spare's `sched_getaffinity` under a pinned CPU count.
    SpareCpuCount(u32),
    /// An unknown caller's call: refused with EPERM, and said.
    RefuseUnknown,
    /// A session's call: charge its budget, then [`route_session`].
    Session,
}

/// What the router does with a session's call once its budget is charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionRouted {
    /// Answered with the pinned session pid.
    Pid,
    /// The signal is sent for it (to the caller's real pid).
    SignalForIt,
    /// A draw of its child before the session began ([`crate::serve::Determinism::begun`]):
    /// fixed bytes, as a spare's; a zero-length one says the session begins.
    BeforeSession,
    /// The one handler, with the session's state.
    Handle,
}

/// Routes a notification of `call` from whoever `asker` finds: it is asked only when the
/// call is not a signal to itself (finding a session may wait for it to be registered).
pub fn route(call: Call, asker: impl FnOnce() -> Asker) -> Routed {
    // Signals: each process may signal itself only (its pid in the namespace).
    if call.native && call.signals_itself {
        return Routed::SignalItself;
    }
    match asker() {
        Asker::Zygote if call.native && call.forks => Routed::Continue,
        // The worker imported its modules unconfined, threads and all: the zygote may too.
        // Only the forking thread exists in a child, whose own threads stay the policy's.
        Asker::Zygote | Asker::ZygoteThread if call.native && call.spawns_thread => {
            Routed::Continue
        }
        // While preloading it reads real entropy (the SDK needs randomness at import) under
        // every policy: `getrandom = "seeded"` or `"deny"` is the sessions' rule, not the
        // zygote's, and judged as theirs its draw would be denied and reported as a violation
        // at every start. It waits with a timeout between sessions; sessions get theirs after
        // the fork.
        Asker::Zygote | Asker::ZygoteThread
            if call.native
                && (call.draws_entropy
                    || matches!(
                        call.check,
                        Some(Check::Seeded | Check::Usage | Check::Pid | Check::TimedWait)
                    )) =>
        {
            Routed::Continue
        }
        // Its other threads are the libraries' (a client's background loop), never the
        // workflows': they sleep and read the real clock, as a spare does, whatever the
        // policy says of workflow code (`sleep = "deny"`, `clock = "virtual"`), which would
        // make their waits spin. What they compute is no module's import.
        Asker::ZygoteThread
            if call.native && (call.sleeps || matches!(call.check, Some(Check::Clock))) =>
        {
            Routed::Continue
        }
        // A fork of another thread is judged (and denied, never killed), like any of its calls.
        Asker::Zygote | Asker::ZygoteThread => Routed::ZygoteHandles,
        // Python reseeds `random` in every forked child; a failing getrandom would make
        // CPython give up on it for the life of the process (its session's draws would then
        // never reach the policy: no violation, no warning, only an error). Under every
        // policy, as the zygote's own draw.
        Asker::Unknown if call.native && call.draws_entropy => Routed::SpareSeeded,
        Asker::Unknown if call.native => match call.check {
            Some(Check::Seeded) => Routed::SpareSeeded,
            // The real clock, until its session.
            Some(Check::Clock | Check::Usage | Check::Pid | Check::Stat) => Routed::Continue,
            Some(Check::CpuCount(cpus)) => Routed::SpareCpuCount(cpus),
            _ => Routed::RefuseUnknown,
        },
        Asker::Unknown => Routed::RefuseUnknown,
        Asker::Session => Routed::Session,
    }
}

/// Routes a session's call (its budget charged); `armed`: its guest has said HELLO;
/// `begun`: its child has left the fork (`armed` implies it: a guest that never said so
/// answers HELLO as a session's code, and its draws are judged from then on).
pub fn route_session(call: Call, armed: bool, begun: bool) -> SessionRouted {
    if call.native && call.draws_entropy && !armed && !begun {
        SessionRouted::BeforeSession
    } else if call.native && armed && call.check == Some(Check::Pid) {
        SessionRouted::Pid
    } else if call.native && armed && call.signals_session_pid {
        SessionRouted::SignalForIt
    } else {
        SessionRouted::Handle
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(check: Option<Check>) -> Call {
        Call {
            native: true,
            check,
            forks: false,
            spawns_thread: false,
            sleeps: false,
            draws_entropy: false,
            signals_itself: false,
            signals_session_pid: false,
        }
    }

    #[test]
    fn a_signal_to_itself_runs_whoever_sends_it() {
        let c = Call {
            signals_itself: true,
            ..call(Some(Check::Signal))
        };
        for asker in [Asker::Zygote, Asker::Session, Asker::Unknown] {
            assert_eq!(route(c, || asker), Routed::SignalItself);
        }
        // Who asks is not looked up (a session's look-up may wait).
        assert_eq!(
            route(c, || panic!("who asks was looked up")),
            Routed::SignalItself
        );
        let foreign = Call { native: false, ..c };
        assert_eq!(route(foreign, || Asker::Zygote), Routed::ZygoteHandles);
    }

    #[test]
    fn only_the_zygote_forks() {
        let fork = Call {
            forks: true,
            ..call(Some(Check::Violation))
        };
        assert_eq!(route(fork, || Asker::Zygote), Routed::Continue);
        assert_eq!(route(fork, || Asker::Session), Routed::Session);
        assert_eq!(route(fork, || Asker::Unknown), Routed::RefuseUnknown);
        let foreign = Call {
            native: false,
            ..fork
        };
        assert_eq!(route(foreign, || Asker::Zygote), Routed::ZygoteHandles);
    }

    #[test]
    fn a_thread_of_the_zygote_does_not_fork() {
        let fork = Call {
            forks: true,
            ..call(Some(Check::Violation))
        };
        assert_eq!(route(fork, || Asker::ZygoteThread), Routed::ZygoteHandles);
    }

    #[test]
    fn the_zygote_and_its_threads_start_threads_and_no_one_else_does() {
        let thread = Call {
            spawns_thread: true,
            ..call(Some(Check::Violation))
        };
        for asker in [Asker::Zygote, Asker::ZygoteThread] {
            assert_eq!(route(thread, || asker), Routed::Continue);
        }
        // A session's thread is judged under the full policy (threads = "deny": a violation).
        assert_eq!(route(thread, || Asker::Session), Routed::Session);
        assert_eq!(route(thread, || Asker::Unknown), Routed::RefuseUnknown);
        let foreign = Call {
            native: false,
            ..thread
        };
        assert_eq!(route(foreign, || Asker::Zygote), Routed::ZygoteHandles);
    }

    #[test]
    fn the_zygotes_other_threads_sleep_and_read_the_real_clock_and_its_main_thread_does_not() {
        let sleep = Call {
            sleeps: true,
            ..call(Some(Check::Violation))
        };
        let clock = call(Some(Check::Clock));
        for c in [sleep, clock] {
            assert_eq!(route(c, || Asker::ZygoteThread), Routed::Continue);
            // The main thread's clock is the preload instant; it does not sleep.
            assert_eq!(route(c, || Asker::Zygote), Routed::ZygoteHandles);
            assert_eq!(route(c, || Asker::Session), Routed::Session);
        }
        assert_eq!(route(sleep, || Asker::Unknown), Routed::RefuseUnknown);
    }

    #[test]
    fn the_zygote_reads_real_entropy_usage_and_pid_and_waits() {
        for check in [Check::Seeded, Check::Usage, Check::Pid, Check::TimedWait] {
            for asker in [Asker::Zygote, Asker::ZygoteThread] {
                assert_eq!(route(call(Some(check)), || asker), Routed::Continue);
            }
        }
    }

    #[test]
    fn the_zygote_and_its_threads_draw_real_entropy_under_every_builtin_policy() {
        // What each built-in policy's sessions get for getrandom (seeded, a violation under
        // deny or warn, or nothing to route when it is allowed outright): the zygote's own
        // draw at preload runs, never judged as a session's (a denial, or a violation record
        // under `warn`, at every start).
        use crate::policy::decisions::Decisions;
        use crate::policy::rules::Shape;
        let getrandom = crate::policy::syscalls::number("getrandom").unwrap();
        for (name, _) in crate::policy::BUILTINS {
            let policy = crate::policy::load(name).unwrap();
            let decisions = Decisions::compile(&policy, Shape::default());
            let draw = Call {
                draws_entropy: true,
                ..call(decisions.get(getrandom).map(|d| d.check))
            };
            for asker in [Asker::Zygote, Asker::ZygoteThread] {
                assert_eq!(route(draw, || asker), Routed::Continue, "{name}, {asker:?}");
            }
            // A spare's (Python reseeds at fork) is fixed bytes, never refused; a session's is
            // its policy's, after its budget.
            assert_eq!(
                route(draw, || Asker::Unknown),
                Routed::SpareSeeded,
                "{name}"
            );
            assert_eq!(route(draw, || Asker::Session), Routed::Session, "{name}");
        }
    }

    #[test]
    fn the_zygotes_clock_reads_writes_and_violations_go_to_the_handler() {
        // Its writes are judged against its own grants: the policy's and its scratch
        // directory (`zygote/start.rs`), which no session has.
        for check in [
            Some(Check::Stat),
            Some(Check::Writes),
            Some(Check::Violation),
            None,
        ] {
            for asker in [Asker::Zygote, Asker::ZygoteThread] {
                assert_eq!(route(call(check), || asker), Routed::ZygoteHandles);
            }
        }
        assert_eq!(
            route(call(Some(Check::Clock)), || Asker::Zygote),
            Routed::ZygoteHandles
        );
    }

    #[test]
    fn a_spare_draws_seed_zero_and_reads_the_real_clock() {
        assert_eq!(
            route(call(Some(Check::Seeded)), || Asker::Unknown),
            Routed::SpareSeeded
        );
        for check in [Check::Clock, Check::Usage, Check::Pid, Check::Stat] {
            assert_eq!(
                route(call(Some(check)), || Asker::Unknown),
                Routed::Continue
            );
        }
        assert_eq!(
            route(call(Some(Check::CpuCount(3))), || Asker::Unknown),
            Routed::SpareCpuCount(3)
        );
    }

    #[test]
    fn any_other_call_of_an_unknown_pid_is_refused() {
        for check in [
            Some(Check::Violation),
            Some(Check::Writes),
            Some(Check::TimedWait),
            None,
        ] {
            assert_eq!(route(call(check), || Asker::Unknown), Routed::RefuseUnknown);
        }
        let foreign = Call {
            native: false,
            ..call(Some(Check::Seeded))
        };
        assert_eq!(route(foreign, || Asker::Unknown), Routed::RefuseUnknown);
    }

    #[test]
    fn a_sessions_calls_are_charged_then_routed() {
        for check in [
            Some(Check::Seeded),
            Some(Check::Clock),
            Some(Check::Violation),
            None,
        ] {
            assert_eq!(route(call(check), || Asker::Session), Routed::Session);
        }
    }

    #[test]
    fn an_armed_session_reads_the_pinned_pid_and_signals_it() {
        let pid = call(Some(Check::Pid));
        assert_eq!(route_session(pid, true, true), SessionRouted::Pid);
        assert_eq!(route_session(pid, false, true), SessionRouted::Handle);
        let signal = Call {
            signals_session_pid: true,
            ..call(Some(Check::Signal))
        };
        assert_eq!(
            route_session(signal, true, true),
            SessionRouted::SignalForIt
        );
        assert_eq!(route_session(signal, false, true), SessionRouted::Handle);
        let foreign = Call {
            native: false,
            ..pid
        };
        assert_eq!(route_session(foreign, true, true), SessionRouted::Handle);
    }

    #[test]
    fn a_draw_before_the_session_begins_is_the_forks_under_every_rule() {
        // CPython's reseed at fork runs in the child before its session's code, before or
        // after FORKED registered it: never judged by the session's rule. Once the child said
        // its session begins, or its guest said HELLO, a draw is the policy's.
        for check in [Some(Check::Seeded), Some(Check::Violation), None] {
            let draw = Call {
                draws_entropy: true,
                ..call(check)
            };
            assert_eq!(
                route_session(draw, false, false),
                SessionRouted::BeforeSession
            );
            assert_eq!(route_session(draw, false, true), SessionRouted::Handle);
            assert_eq!(route_session(draw, true, false), SessionRouted::Handle);
            assert_eq!(route_session(draw, true, true), SessionRouted::Handle);
            // Only draws: the child's other calls before its session are judged as today.
            assert_eq!(
                route_session(call(check), false, false),
                SessionRouted::Handle
            );
        }
    }
}
