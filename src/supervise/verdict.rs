//! How a guest ended, classified: the facts of its end in, one verdict out (status, limit,
//! error). `wfjail run` gives the facts of the guest it reaped; a `serve` session those of
//! its guest, reaped by the session (exec mode) or reported by its zygote (EXITED). One
//! ladder for both, in the order of precedence of docs/architecture.md.
//!
//! Limits come from kernel evidence only (docs/security.md): the wait status, the CPU time
//! of the rusage, the peak address space, a mapping the supervisor saw go beyond the room
//! left, a file at exactly the size limit. The guest's own words (what it printed, an ERROR
//! frame) only say that it failed, never why.

use std::time::Duration;

use nix::errno::Errno;

use crate::process::channel::Step;
use crate::report::Status;

/// A required set-up step that failed in the child (it exited without running the guest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetupFailed {
    pub step: Step,
    pub errno: Errno,
    /// The program that was to be executed (named when its exec failed).
    pub command: String,
}

/// What the guest owed on its conversation when it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Ending {
    /// A raw run: no conversation, its exit status says how it went.
    #[default]
    Raw,
    /// A framed run's one call; `answered`: with a RESULT or an ERROR frame. An ERROR fails
    /// the run.
    Call { answered: bool },
    /// A `serve` session. The ERROR answers of its calls went to the worker: they fail no
    /// session (they are still evidence that the guest failed, for a limit).
    Session(SessionEnd),
}

/// How a session's conversation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEnd {
    /// The worker closed it (CLOSE, then end-of-file to the guest).
    Closed,
    /// The guest ended before the worker closed the session.
    EndedEarly,
    /// The guest answered its start with ERROR instead of HELLO (no such handler, no
    /// Landlock domain of its own, a version it does not speak).
    RefusedStart,
}

/// The facts of how one guest ended. Each is what the kernel, the set-up channel or the
/// supervisor saw; none is the guest's account of itself.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// A required set-up step failed in the child.
    pub fatal: Option<SetupFailed>,
    /// The child broke the set-up protocol (a malformed record).
    pub channel_error: Option<String>,
    /// wfjail was stopped by this signal while the guest ran (and killed it).
    pub interrupted: Option<i32>,
    /// The child was never exec'd and was never reaped: it ended without saying why.
    pub never_execed: bool,
    /// The guest's wait status; `None` when it was not reaped (or died with its zygote).
    pub wait_status: Option<i32>,
    /// The guest's zygote died, taking the guest with it.
    pub zygote_died: bool,
    /// A call was denied or killed (not merely warned about).
    pub violation_enforced: bool,
    /// The deadline passed and wfjail killed the guest.
    pub timed_out: bool,
    /// The guest broke the protocol (wfjail then stopped it).
    pub protocol_error: bool,
    /// The guest's output and frames went beyond `limits.output` (wfjail then killed it).
    pub output_exceeded: bool,
    /// The guest added more than `limits.disk` under its write grants (wfjail killed it).
    pub disk_exceeded: bool,
    /// The guest asked the supervisor for more answers than its budget (`notify::Budget`):
    /// wfjail killed it.
    pub notifications_exceeded: bool,
    /// wfjail sent the guest SIGKILL itself, for whatever reason: a SIGKILL it did not send
    /// is the kernel's (RLIMIT_CPU's hard limit).
    pub killed_by_supervisor: bool,
    /// User plus system CPU time of the guest (rusage), in milliseconds.
    pub cpu_ms: f64,
    /// `limits.cpu`.
    pub cpu_limit: Option<Duration>,
    /// wfjail killed the guest because one call used more than `limits.cpu` (serve sessions
    /// measure each call's CPU time).
    pub call_cpu_exceeded: bool,
    /// RLIMIT_AS as applied to the guest, in bytes.
    pub memory_limit: Option<u64>,
    /// The largest peak address space (`VmPeak`) read while the guest ran, in bytes.
    pub vm_peak: Option<u64>,
    /// A private mapping asked for more address space than RLIMIT_AS left (the supervisor
    /// saw it before the kernel refused it).
    pub memory_refused: bool,
    /// A file under the write grants, written since the guest started, is exactly at
    /// RLIMIT_FSIZE (a write past it failed with EFBIG).
    pub file_at_limit: bool,
    /// The guest answered a call with an ERROR frame.
    pub errored: bool,
    pub ending: Ending,
    /// What wfjail said when it stopped the guest (`run`: the broken conversation; `serve`:
    /// the session's failure): the report's error unless a rule below has words of its own.
    pub stopped: Option<String>,
    /// What the error says when the deadline ended the guest; `stopped` without it.
    pub timeout_words: Option<String>,
}

/// The limit a `limit` status names, in the order [`classify`] ranks them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Memory,
    Output,
    Disk,
    Notifications,
    Cpu,
    FileSize,
}

impl Limit {
    /// The report's `limit` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::Memory => "memory",
            Limit::Disk => "disk",
            Limit::Notifications => "notifications",
            Limit::Output => "output",
            Limit::Cpu => "cpu",
            Limit::FileSize => "file_size",
        }
    }
}

/// What the report says of how the guest ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub status: Status,
    pub limit: Option<Limit>,
    pub error: Option<String>,
    /// wfjail's exit status: the status's own, or a launch error's (125, 126, 127) or an
    /// interruption's (128 + the signal).
    pub exit_status: i32,
}

/// Whether a peak address space of `peak` bytes means an allocation met RLIMIT_AS `limit`:
/// within `limit / 16` (at least 1 MiB) of it. An allocation larger than that margin that
/// fails leaves no trace in the peak (see docs/security.md).
pub fn near_memory_limit(peak: u64, limit: u64) -> bool {
    let margin = (limit / 16).max(1 << 20);
    peak.saturating_add(margin) >= limit
}

/// Whether the guest ended badly: it exited with a status other than 0, was killed by a
/// signal, or answered a call with ERROR. Only then can a limit explain its end (and is the
/// evidence of memory and file size looked for).
pub fn guest_failed(wait_status: Option<i32>, errored: bool) -> bool {
    errored
        || wait_status.is_some_and(|st| {
            libc::WIFSIGNALED(st) || (libc::WIFEXITED(st) && libc::WEXITSTATUS(st) != 0)
        })
}

/// Classifies how a guest ended. Precedence: launch error › interrupted › violation ›
/// timeout › protocol error › limit (memory, output, disk, notifications, cpu, file size) ›
/// the zygote died ›
/// crashed › guest error › ok.
pub fn classify(f: &Facts) -> Verdict {
    let (mut exit_code, mut signal) = (None, None);
    if let Some(st) = f.wait_status {
        if libc::WIFEXITED(st) {
            exit_code = Some(libc::WEXITSTATUS(st));
        } else if libc::WIFSIGNALED(st) {
            signal = Some(libc::WTERMSIG(st));
        }
    }
    let verdict = |status: Status, limit: Option<Limit>, error: Option<String>| Verdict {
        status,
        limit,
        error,
        exit_status: status.exit_code(),
    };
    let launch_error = |code: i32, error: String| Verdict {
        status: Status::LaunchError,
        limit: None,
        error: Some(error),
        exit_status: code,
    };

    // Before the guest ran.
    if let Some(SetupFailed {
        step,
        errno,
        command,
    }) = &f.fatal
    {
        return if *step == Step::Exec {
            let code = if *errno == Errno::ENOENT { 127 } else { 126 };
            launch_error(code, format!("executing {command}: {}", errno.desc()))
        } else {
            launch_error(
                125,
                format!(
                    "{} failed: {}; the policy requires this layer (require = [...]); run `wfjail check`",
                    step.describe(),
                    errno.desc()
                ),
            )
        };
    }
    if let Some(e) = &f.channel_error {
        return launch_error(125, format!("the child broke the set-up protocol: {e}"));
    }
    if let Some(sig) = f.interrupted {
        return Verdict {
            status: Status::Interrupted,
            limit: None,
            error: Some(format!(
                "wfjail was stopped by {} while the guest ran; the guest was killed",
                crate::report::signal_name(sig)
            )),
            exit_status: 128 + sig,
        };
    }
    if f.never_execed {
        return launch_error(125, "the child ended before exec without saying why".into());
    }

    // The guest ran. Limits: RLIMIT_AS makes an allocation fail and RLIMIT_FSIZE a write
    // (EFBIG; SIGXFSZ is ignored by a guest that is PID 1, and by Python), so the guest only
    // fails; the kernel's evidence says which limit it met.
    let stopped = || f.stopped.clone();
    let failed = guest_failed(f.wait_status, f.errored);
    let memory_hit = failed
        && (f.memory_refused
            || f.vm_peak
                .zip(f.memory_limit)
                .is_some_and(|(peak, limit)| near_memory_limit(peak, limit)));
    // A SIGKILL we did not send comes from the kernel's RLIMIT_CPU (a guest that is PID 1
    // ignores the SIGXCPU before it). rusage times are tick-sampled and may read lower than
    // the kernel's precise count, hence the loose lower bound.
    let cpu_hit = f.call_cpu_exceeded
        || f.cpu_limit.is_some_and(|c| {
            signal == Some(libc::SIGXCPU)
                || (signal == Some(libc::SIGKILL)
                    && !f.killed_by_supervisor
                    && f.cpu_ms >= c.as_secs_f64() * 500.0)
        });
    let file_size_hit = signal == Some(libc::SIGXFSZ) || (failed && f.file_at_limit);
    let limit = |l: Limit| verdict(Status::Limit, Some(l), stopped());

    if f.violation_enforced {
        verdict(Status::Violation, None, stopped())
    } else if f.timed_out {
        let words = f.timeout_words.clone().or_else(stopped);
        verdict(Status::Timeout, None, words)
    } else if f.protocol_error || f.ending == Ending::Session(SessionEnd::RefusedStart) {
        verdict(Status::GuestError, None, stopped())
    } else if memory_hit {
        limit(Limit::Memory)
    } else if f.output_exceeded {
        limit(Limit::Output)
    } else if f.disk_exceeded {
        limit(Limit::Disk)
    } else if f.notifications_exceeded {
        let error = format!(
            "the guest asked the supervisor for more than {} answers at once, or {} a second \
             sustained (wall-clock reads under the virtual clock, seeded getrandom, watched \
             calls): killed",
            crate::notify::BUDGET_BURST,
            crate::notify::BUDGET_RATE
        );
        verdict(Status::Limit, Some(Limit::Notifications), Some(error))
    } else if cpu_hit {
        limit(Limit::Cpu)
    } else if file_size_hit {
        limit(Limit::FileSize)
    } else if f.zygote_died {
        let error = "the zygote died (see wfjail's stderr)".to_string();
        verdict(Status::Crashed, None, Some(error))
    } else if signal.is_some() {
        verdict(Status::Crashed, None, stopped())
    } else if exit_code.is_some_and(|c| c != 0)
        || (f.errored && matches!(f.ending, Ending::Call { .. }))
    {
        verdict(Status::GuestError, None, stopped())
    } else if f.ending == (Ending::Call { answered: false }) {
        let error = "the guest exited without a RESULT or ERROR frame: is it a protocol guest? \
                     (plain programs run with --raw)";
        verdict(Status::GuestError, None, Some(error.into()))
    } else if f.ending == Ending::Session(SessionEnd::EndedEarly) {
        let error = stopped()
            .unwrap_or_else(|| "the guest ended the session before it was closed".to_string());
        verdict(Status::GuestError, None, Some(error))
    } else {
        verdict(Status::Ok, None, stopped())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Wait statuses: exited 0, exited 1.
    const EXIT_0: i32 = 0;
    const EXIT_1: i32 = 1 << 8;
    const MIB: u64 = 1 << 20;

    /// The wait status of a guest killed by `sig`.
    fn killed_by(sig: i32) -> i32 {
        sig
    }

    /// A guest that exited with `status` and did nothing else of note.
    fn ended(status: i32) -> Facts {
        Facts {
            wait_status: Some(status),
            ..Facts::default()
        }
    }

    fn status_and_limit(f: &Facts) -> (Status, Option<&'static str>) {
        let v = classify(f);
        (v.status, v.limit.map(Limit::as_str))
    }

    #[test]
    fn a_guest_that_exits_0_is_ok_and_one_that_exits_otherwise_a_guest_error() {
        assert_eq!(status_and_limit(&ended(EXIT_0)), (Status::Ok, None));
        let v = classify(&ended(EXIT_1));
        assert_eq!(
            (v.status, v.exit_status, v.error),
            (Status::GuestError, 1, None)
        );
    }

    #[test]
    fn a_failed_exec_is_126_or_127_and_a_failed_required_layer_125() {
        let fatal = |step, errno| Facts {
            fatal: Some(SetupFailed {
                step,
                errno,
                command: "/bin/x".into(),
            }),
            wait_status: Some(125 << 8),
            ..Facts::default()
        };
        let v = classify(&fatal(Step::Exec, Errno::ENOENT));
        assert_eq!((v.status, v.exit_status), (Status::LaunchError, 127));
        assert_eq!(
            v.error.unwrap(),
            "executing /bin/x: No such file or directory"
        );
        assert_eq!(classify(&fatal(Step::Exec, Errno::EACCES)).exit_status, 126);
        let v = classify(&fatal(Step::Landlock, Errno::EOPNOTSUPP));
        assert_eq!((v.status, v.exit_status), (Status::LaunchError, 125));
        assert!(v.error.unwrap().contains("require = [...]"));
    }

    #[test]
    fn a_broken_set_up_channel_and_a_child_that_never_execed_are_launch_errors() {
        let broken = Facts {
            channel_error: Some("bad record".into()),
            ..ended(killed_by(libc::SIGKILL))
        };
        let v = classify(&broken);
        assert_eq!((v.status, v.exit_status), (Status::LaunchError, 125));
        assert_eq!(
            v.error.unwrap(),
            "the child broke the set-up protocol: bad record"
        );
        let never = Facts {
            never_execed: true,
            ..Facts::default()
        };
        assert_eq!(classify(&never).status, Status::LaunchError);
    }

    #[test]
    fn interrupted_is_128_plus_the_signal_and_outranks_what_the_guest_did() {
        let f = Facts {
            interrupted: Some(libc::SIGINT),
            violation_enforced: true,
            ..ended(killed_by(libc::SIGKILL))
        };
        let v = classify(&f);
        assert_eq!((v.status, v.exit_status), (Status::Interrupted, 130));
        assert!(v.error.unwrap().contains("SIGINT"));
    }

    #[test]
    fn a_launch_error_outranks_an_interruption() {
        let f = Facts {
            channel_error: Some("x".into()),
            interrupted: Some(libc::SIGTERM),
            ..Facts::default()
        };
        assert_eq!(classify(&f).status, Status::LaunchError);
    }

    #[test]
    fn an_enforced_violation_outranks_the_timeout_and_every_limit() {
        let f = Facts {
            violation_enforced: true,
            timed_out: true,
            output_exceeded: true,
            killed_by_supervisor: true,
            ..ended(killed_by(libc::SIGKILL))
        };
        assert_eq!(status_and_limit(&f), (Status::Violation, None));
    }

    #[test]
    fn a_timeout_outranks_a_protocol_error_and_says_the_deadline() {
        let f = Facts {
            timed_out: true,
            protocol_error: true,
            killed_by_supervisor: true,
            stopped: Some("bad frame; the guest was stopped".into()),
            timeout_words: Some("killed after 1s".into()),
            ..ended(killed_by(libc::SIGKILL))
        };
        let v = classify(&f);
        assert_eq!(
            (v.status, v.error.as_deref()),
            (Status::Timeout, Some("killed after 1s"))
        );
        // Without words of its own, the timeout says what the supervisor said.
        let f = Facts {
            timeout_words: None,
            stopped: Some("the call took longer than 3s".into()),
            ..f
        };
        assert_eq!(classify(&f).error.unwrap(), "the call took longer than 3s");
    }

    #[test]
    fn a_protocol_error_outranks_the_limits_and_keeps_its_words_under_any_status() {
        let f = Facts {
            protocol_error: true,
            output_exceeded: true,
            killed_by_supervisor: true,
            stopped: Some("bad frame".into()),
            ..ended(killed_by(libc::SIGKILL))
        };
        let v = classify(&f);
        assert_eq!(
            (v.status, v.error.as_deref()),
            (Status::GuestError, Some("bad frame"))
        );
        let f = Facts {
            violation_enforced: true,
            ..f
        };
        assert_eq!(classify(&f).error.as_deref(), Some("bad frame"));
    }

    #[test]
    fn a_session_guest_that_refused_to_start_is_a_guest_error_before_any_limit() {
        let f = Facts {
            ending: Ending::Session(SessionEnd::RefusedStart),
            output_exceeded: true,
            stopped: Some("the guest could not start: ImportError: x".into()),
            ..ended(EXIT_0)
        };
        let v = classify(&f);
        assert_eq!((v.status, v.limit), (Status::GuestError, None));
        assert_eq!(
            v.error.unwrap(),
            "the guest could not start: ImportError: x"
        );
    }

    #[test]
    fn memory_is_a_limit_when_the_guest_failed_near_rlimit_as_or_past_the_room_left() {
        let near = Facts {
            memory_limit: Some(256 * MIB),
            vm_peak: Some(250 * MIB),
            ..ended(EXIT_1)
        };
        assert_eq!(status_and_limit(&near), (Status::Limit, Some("memory")));
        let refused = Facts {
            memory_refused: true,
            memory_limit: Some(256 * MIB),
            vm_peak: Some(20 * MIB),
            ..ended(EXIT_1)
        };
        assert_eq!(status_and_limit(&refused), (Status::Limit, Some("memory")));
        let far = Facts {
            vm_peak: Some(100 * MIB),
            ..near.clone()
        };
        assert_eq!(status_and_limit(&far), (Status::GuestError, None));
        // A guest that did not fail met no limit, however high its peak.
        let fine = Facts {
            wait_status: Some(EXIT_0),
            ..near.clone()
        };
        assert_eq!(status_and_limit(&fine), (Status::Ok, None));
    }

    #[test]
    fn an_error_frame_is_failure_evidence_for_a_limit_but_never_a_limit_alone() {
        let words_only = Facts {
            errored: true,
            ending: Ending::Call { answered: true },
            ..ended(EXIT_0)
        };
        assert_eq!(status_and_limit(&words_only), (Status::GuestError, None));
        let with_evidence = Facts {
            memory_limit: Some(256 * MIB),
            vm_peak: Some(255 * MIB),
            ..words_only
        };
        assert_eq!(
            status_and_limit(&with_evidence),
            (Status::Limit, Some("memory"))
        );
    }

    #[test]
    fn the_memory_margin_is_a_sixteenth_of_the_limit_and_at_least_1_mib() {
        assert!(near_memory_limit(240 * MIB, 256 * MIB));
        assert!(!near_memory_limit(239 * MIB, 256 * MIB));
        assert!(near_memory_limit(15 * MIB, 16 * MIB));
        assert!(!near_memory_limit(14 * MIB, 16 * MIB));
    }

    #[test]
    fn memory_outranks_output_which_outranks_cpu_which_outranks_file_size() {
        let all = Facts {
            memory_refused: true,
            output_exceeded: true,
            cpu_limit: Some(Duration::from_secs(1)),
            cpu_ms: 1000.0,
            file_at_limit: true,
            ..ended(killed_by(libc::SIGXCPU))
        };
        assert_eq!(status_and_limit(&all).1, Some("memory"));
        let f = Facts {
            memory_refused: false,
            ..all
        };
        assert_eq!(status_and_limit(&f).1, Some("output"));
        let f = Facts {
            output_exceeded: false,
            ..f
        };
        assert_eq!(status_and_limit(&f).1, Some("cpu"));
        let f = Facts {
            cpu_limit: None,
            ..f
        };
        assert_eq!(status_and_limit(&f).1, Some("file_size"));
    }

    #[test]
    fn the_limits_rank_memory_output_disk_notifications_cpu_file_size() {
        let mut f = Facts {
            memory_refused: true,
            output_exceeded: true,
            disk_exceeded: true,
            notifications_exceeded: true,
            cpu_limit: Some(Duration::from_secs(1)),
            cpu_ms: 1000.0,
            file_at_limit: true,
            ..ended(killed_by(libc::SIGXCPU))
        };
        let mut seen = Vec::new();
        for drop in [
            |f: &mut Facts| f.memory_refused = false,
            |f: &mut Facts| f.output_exceeded = false,
            |f: &mut Facts| f.disk_exceeded = false,
            |f: &mut Facts| f.notifications_exceeded = false,
            |f: &mut Facts| f.cpu_limit = None,
        ] {
            seen.push(status_and_limit(&f).1);
            drop(&mut f);
        }
        seen.push(status_and_limit(&f).1);
        let order = [
            "memory",
            "output",
            "disk",
            "notifications",
            "cpu",
            "file_size",
        ];
        assert_eq!(seen, order.map(Some));
    }

    #[test]
    fn output_beyond_the_limit_is_a_limit_though_wfjail_killed_the_guest() {
        let f = Facts {
            output_exceeded: true,
            killed_by_supervisor: true,
            stopped: Some("the guest's output exceeded limits.output".into()),
            ..ended(killed_by(libc::SIGKILL))
        };
        let v = classify(&f);
        assert_eq!(
            (v.status, v.limit, v.exit_status),
            (Status::Limit, Some(Limit::Output), 5)
        );
        assert!(v.error.is_some(), "the session's words stay");
    }

    #[test]
    fn cpu_is_sigxcpu_or_a_sigkill_wfjail_did_not_send_after_half_the_limit() {
        let cpu = |sig, cpu_ms, ours| Facts {
            cpu_limit: Some(Duration::from_secs(1)),
            cpu_ms,
            killed_by_supervisor: ours,
            ..ended(killed_by(sig))
        };
        assert_eq!(
            status_and_limit(&cpu(libc::SIGKILL, 990.0, false)),
            (Status::Limit, Some("cpu"))
        );
        assert_eq!(
            status_and_limit(&cpu(libc::SIGXCPU, 10.0, false)),
            (Status::Limit, Some("cpu"))
        );
        // Killed by wfjail (any reason), or too early for the CPU limit: a crash.
        assert_eq!(
            status_and_limit(&cpu(libc::SIGKILL, 990.0, true)),
            (Status::Crashed, None)
        );
        assert_eq!(
            status_and_limit(&cpu(libc::SIGKILL, 100.0, false)),
            (Status::Crashed, None)
        );
        // Without limits.cpu, a SIGKILL is a crash whatever the time.
        let f = Facts {
            cpu_limit: None,
            ..cpu(libc::SIGKILL, 5000.0, false)
        };
        assert_eq!(status_and_limit(&f), (Status::Crashed, None));
    }

    #[test]
    fn file_size_is_sigxfsz_or_a_failed_guest_with_a_file_at_the_limit() {
        assert_eq!(
            status_and_limit(&ended(killed_by(libc::SIGXFSZ))),
            (Status::Limit, Some("file_size"))
        );
        let at_limit = Facts {
            file_at_limit: true,
            ..ended(EXIT_1)
        };
        assert_eq!(
            status_and_limit(&at_limit),
            (Status::Limit, Some("file_size"))
        );
        let not_failed = Facts {
            wait_status: Some(EXIT_0),
            ..at_limit
        };
        assert_eq!(status_and_limit(&not_failed), (Status::Ok, None));
    }

    #[test]
    fn a_dead_zygote_crashes_its_session_after_the_limits() {
        let f = Facts {
            zygote_died: true,
            wait_status: None,
            ending: Ending::Session(SessionEnd::EndedEarly),
            ..Facts::default()
        };
        let v = classify(&f);
        assert_eq!(v.status, Status::Crashed);
        assert_eq!(v.error.unwrap(), "the zygote died (see wfjail's stderr)");
        let f = Facts {
            output_exceeded: true,
            ..f
        };
        assert_eq!(status_and_limit(&f), (Status::Limit, Some("output")));
    }

    #[test]
    fn a_signal_is_a_crash_and_outranks_the_guests_error() {
        let f = Facts {
            errored: true,
            ending: Ending::Call { answered: true },
            ..ended(killed_by(libc::SIGSEGV))
        };
        assert_eq!(status_and_limit(&f), (Status::Crashed, None));
    }

    #[test]
    fn a_framed_run_must_answer_its_call() {
        let unanswered = Facts {
            ending: Ending::Call { answered: false },
            ..ended(EXIT_0)
        };
        let v = classify(&unanswered);
        assert_eq!(v.status, Status::GuestError);
        assert!(v.error.unwrap().contains("without a RESULT or ERROR frame"));
        let error = Facts {
            errored: true,
            ending: Ending::Call { answered: true },
            ..ended(EXIT_0)
        };
        assert_eq!(
            classify(&error),
            Verdict {
                status: Status::GuestError,
                limit: None,
                error: None,
                exit_status: 1
            }
        );
        let result = Facts {
            ending: Ending::Call { answered: true },
            ..ended(EXIT_0)
        };
        assert_eq!(status_and_limit(&result), (Status::Ok, None));
    }

    #[test]
    fn a_session_must_be_closed_and_its_calls_errors_fail_no_session() {
        let closed = Facts {
            errored: true,
            ending: Ending::Session(SessionEnd::Closed),
            ..ended(EXIT_0)
        };
        assert_eq!(status_and_limit(&closed), (Status::Ok, None));
        let early = Facts {
            ending: Ending::Session(SessionEnd::EndedEarly),
            ..ended(EXIT_0)
        };
        let v = classify(&early);
        assert_eq!(v.status, Status::GuestError);
        assert_eq!(
            v.error.unwrap(),
            "the guest ended the session before it was closed"
        );
        // The session's own words, when it has some, say why.
        let failed = Facts {
            stopped: Some("the guest did not stop within 2s after answering".into()),
            ..early.clone()
        };
        assert_eq!(
            classify(&failed).error.unwrap(),
            "the guest did not stop within 2s after answering"
        );
        let exit_1 = Facts {
            wait_status: Some(EXIT_1),
            ..early
        };
        assert_eq!(classify(&exit_1).error, None);
    }

    #[test]
    fn a_guest_over_its_notification_budget_is_a_notifications_limit_with_words() {
        let f = Facts {
            wait_status: Some(killed_by(libc::SIGKILL)),
            killed_by_supervisor: true,
            notifications_exceeded: true,
            ending: Ending::Raw,
            ..Facts::default()
        };
        let v = classify(&f);
        assert_eq!(
            (v.status, v.limit, v.exit_status),
            (Status::Limit, Some(Limit::Notifications), 5)
        );
        assert!(v.error.unwrap().contains("answers at once"));
        // A violation outranks it.
        let v = classify(&Facts {
            violation_enforced: true,
            ..f
        });
        assert_eq!(v.status, Status::Violation);
    }
}
