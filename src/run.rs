//! `wfjail run`: plan, spawn, supervise, report.

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::OFlag;

use crate::plan::{self, ExtraGrant, Plan, PlanRequest};
use crate::policy::syscalls::Category;
use crate::policy::{Layer, Policy};
use crate::process::{self, Spawned, channel::Step};
use crate::report::{Action, Layers, Report, Status, Violation, signal_name};
use crate::supervise::{self, Config, GuestPipes, Outcome, Sinks};

/// What `wfjail run` was asked to do, beyond the policy.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    pub argv: Vec<String>,
    pub grants: Vec<ExtraGrant>,
    /// Overrides the policy's `limits.timeout`.
    pub timeout: Option<Duration>,
    /// The guest's stdin (raw mode); `None`: wfjail's own stdin.
    pub input: Option<PathBuf>,
    /// Echo the guest's stderr and a line per violation to wfjail's stderr.
    pub echo: bool,
}

impl RunOptions {
    pub fn raw(argv: Vec<String>) -> Self {
        RunOptions {
            argv,
            ..Default::default()
        }
    }
}

/// Runs one confined execution in raw mode (stdin in, stdout out) and reports on it. The
/// guest's stdout is written to `stdout`.
pub fn run_raw(policy: &Policy, opts: &RunOptions, stdout: &mut dyn Write) -> Report {
    let req = PlanRequest {
        argv: opts.argv.clone(),
        grants: opts.grants.clone(),
        extra_env: vec![],
    };
    let plan = match plan::build(policy, &req) {
        Ok(p) => p,
        Err(e) => {
            return Report::launch_error(&policy.name, &opts.argv, e.to_string(), e.exit_code());
        }
    };
    crate::timing::mark("plan (grants, Landlock ruleset, seccomp programs)");
    let stdin: OwnedFd = match &opts.input {
        Some(path) => match std::fs::File::open(path) {
            Ok(f) => f.into(),
            Err(e) => {
                return Report::launch_error(
                    &policy.name,
                    &opts.argv,
                    format!("--input {}: {e}", path.display()),
                    2,
                );
            }
        },
        None => match std::io::stdin().as_fd_owned() {
            Some(fd) => fd,
            None => match std::fs::File::open("/dev/null") {
                Ok(f) => f.into(),
                Err(e) => {
                    return Report::launch_error(
                        &policy.name,
                        &opts.argv,
                        format!("/dev/null: {e}"),
                        125,
                    );
                }
            },
        },
    };
    let pipe = || nix::unistd::pipe2(OFlag::O_CLOEXEC);
    let ((out_r, out_w), (err_r, err_w)) = match (pipe(), pipe()) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => {
            return Report::launch_error(&policy.name, &opts.argv, format!("pipe: {e}"), 125);
        }
    };
    let targets = [
        (stdin.as_raw_fd(), 0),
        (out_w.as_raw_fd(), 1),
        (err_w.as_raw_fd(), 2),
    ];
    let spawned = match process::spawn(&plan, &targets) {
        Ok(s) => s,
        Err(e) => return Report::launch_error(&policy.name, &opts.argv, e.to_string(), 125),
    };
    crate::timing::mark("spawn (clone)");
    drop((stdin, out_w, err_w));
    let timeout = opts.timeout.or(policy.limits.timeout.map(|d| d.0));
    let cfg = Config {
        timeout,
        output_limit: policy.limits.output.0,
        write_grants: supervise::paths::WriteGrants::new(&plan.write),
    };
    let mut stderr = std::io::stderr();
    let mut echo_err = std::io::stderr();
    let sinks = Sinks {
        stdout: Some(stdout),
        stderr: opts.echo.then_some(&mut stderr as &mut dyn Write),
        violations: opts.echo.then_some(&mut echo_err as &mut dyn Write),
    };
    let layers_base = LayersBase::of(&plan, &spawned);
    let outcome = supervise::supervise(
        spawned,
        GuestPipes {
            stdout: out_r,
            stderr: err_r,
        },
        policy,
        &cfg,
        sinks,
    );
    crate::timing::mark("supervise (child set-up, exec, guest run, exit)");
    let report = build_report(&plan, layers_base, outcome, timeout);
    crate::timing::mark("report");
    report
}

/// Small extension: a duplicate of stdin as an owned descriptor, if stdin is open.
trait StdinFd {
    fn as_fd_owned(&self) -> Option<OwnedFd>;
}

impl StdinFd for std::io::Stdin {
    fn as_fd_owned(&self) -> Option<OwnedFd> {
        use std::os::fd::AsFd;
        self.as_fd().try_clone_to_owned().ok()
    }
}

/// What is known of the layers at spawn time.
pub struct LayersBase {
    user_ns: bool,
    pid_ns: bool,
    clone_degraded: Vec<(Layer, Errno)>,
}

impl LayersBase {
    pub fn of(_plan: &Plan, s: &Spawned) -> Self {
        LayersBase {
            user_ns: s.user_ns,
            pid_ns: s.pid_ns,
            clone_degraded: s.clone_degraded.clone(),
        }
    }
}

fn step_layer(step: Step) -> &'static str {
    match step {
        Step::NetNs => "net-ns",
        Step::IpcNs => "ipc-ns",
        Step::UtsNs => "uts-ns",
        Step::Hostname => "hostname",
        Step::CapabilityBounding => "capabilities",
        Step::NoNewPrivs => "no-new-privs",
        Step::Landlock => "landlock",
        Step::Seccomp => "seccomp",
        Step::SeccompNotify => "seccomp-notify",
        Step::IdMaps => "user-ns",
        _ => "setup",
    }
}

/// What would enable a degraded layer.
fn enable_hint(layer: &str) -> &'static str {
    match layer {
        "user-ns" | "pid-ns" | "net-ns" | "ipc-ns" | "uts-ns" => {
            "namespaces are refused here (container seccomp profile or sysctl); see `wfjail check`"
        }
        "seccomp-notify" => "needs Linux >= 5.0 and a runtime that allows the seccomp listener",
        "capabilities" => {
            "the bounding set needs CAP_SETPCAP (a user namespace gives it); harmless under no_new_privs"
        }
        _ => "see `wfjail check`",
    }
}

/// The layers actually applied, from the plan, the spawn and the child's records.
fn layers(plan: &Plan, base: &LayersBase, o: &Outcome) -> Layers {
    let degraded_step = |s: Step| o.degraded.iter().any(|(d, _)| *d == s);
    let mut degraded: Vec<String> = Vec::new();
    for (layer, errno) in &base.clone_degraded {
        degraded.push(format!(
            "{}: {} ({})",
            layer.as_str(),
            errno.desc(),
            enable_hint(layer.as_str())
        ));
    }
    for (step, errno) in &o.degraded {
        let l = step_layer(*step);
        degraded.push(format!("{l}: {} ({})", errno.desc(), enable_hint(l)));
    }
    let landlock = match &plan.landlock {
        Some((_, info)) if !degraded_step(Step::Landlock) => {
            if !info.tcp
                && plan.policy.network.mode == crate::policy::NetworkMode::None
                && info.abi < 4
            {
                degraded.push(format!("landlock-net: Landlock ABI {} < 4 (Linux >= 6.7); seccomp still denies sockets", info.abi));
            }
            if !info.scoped {
                degraded.push(format!(
                    "landlock-scope: Landlock ABI {} < 6 (Linux >= 6.12)",
                    info.abi
                ));
            }
            format!("abi-{}", info.abi)
        }
        _ => {
            if let Some(why) = &plan.landlock_missing {
                degraded.push(format!("landlock: {why}"));
            }
            "none".into()
        }
    };
    let seccomp = if o.notify {
        "user-notify"
    } else if degraded_step(Step::Seccomp) {
        "none"
    } else {
        "filter"
    };
    let ns = plan.namespaces;
    let mut namespaces = Vec::new();
    if base.user_ns {
        namespaces.push("user");
    }
    for (want, step, name) in [
        (ns.net, Step::NetNs, "net"),
        (true, Step::Landlock, ""),
        (ns.ipc, Step::IpcNs, "ipc"),
        (ns.uts, Step::UtsNs, "uts"),
    ] {
        if name.is_empty() {
            if base.pid_ns {
                namespaces.push("pid");
            }
            continue;
        }
        if want && !degraded_step(step) {
            namespaces.push(name);
        }
    }
    let capabilities = if degraded_step(Step::CapabilityBounding) {
        "bounding set kept; effective, permitted, inheritable and ambient empty".into()
    } else {
        "none".into()
    };
    Layers {
        landlock,
        seccomp: seccomp.into(),
        namespaces,
        capabilities,
        no_new_privs: !degraded_step(Step::NoNewPrivs),
        degraded,
    }
}

/// Classifies an outcome into a report.
pub fn build_report(
    plan: &Plan,
    base: LayersBase,
    o: Outcome,
    timeout: Option<Duration>,
) -> Report {
    let layers = layers(plan, &base, &o);
    let (mut exit_code, mut signal, mut cpu_ms, mut max_rss_kb) = (None, None, 0.0, 0);
    let mut sig_num = None;
    if let Some(r) = &o.reaped {
        let st = r.status;
        if libc::WIFEXITED(st) {
            exit_code = Some(libc::WEXITSTATUS(st));
        } else if libc::WIFSIGNALED(st) {
            sig_num = Some(libc::WTERMSIG(st));
            signal = Some(signal_name(libc::WTERMSIG(st)));
        }
        let tv = |t: libc::timeval| t.tv_sec as f64 * 1000.0 + t.tv_usec as f64 / 1000.0;
        cpu_ms = tv(r.rusage.ru_utime) + tv(r.rusage.ru_stime);
        max_rss_kb = r.rusage.ru_maxrss as u64;
    }
    let stderr_tail = String::from_utf8_lossy(&o.stderr_tail).into_owned();
    let mut violations = o.violations;
    let mut error = None;
    let mut limit = None;
    let policy = &plan.policy;

    let mut exit_status = None;
    let status = if let Some((step, errno)) = o.fatal {
        let (code, msg) = if step == Step::Exec {
            let code = if errno == Errno::ENOENT { 127 } else { 126 };
            (
                code,
                format!("executing {}: {}", plan.command.display(), errno.desc()),
            )
        } else {
            (
                125,
                format!(
                    "{} failed: {}; the policy requires this layer (require = [...]); run `wfjail check`",
                    step.describe(),
                    errno.desc()
                ),
            )
        };
        exit_status = Some(code);
        error = Some(msg);
        Status::LaunchError
    } else if let Some(e) = &o.channel_error {
        exit_status = Some(125);
        error = Some(format!("the child broke the set-up protocol: {e}"));
        Status::LaunchError
    } else if !o.exec_confirmed && o.reaped.is_none() {
        exit_status = Some(125);
        error = Some("the child ended before exec without saying why".into());
        Status::LaunchError
    } else {
        // Killed by the in-filter action (no user notification): name what we can.
        if sig_num == Some(libc::SIGSYS) && !o.notify {
            violations.push(Violation {
                category: Category::Other,
                syscall: "unknown".into(),
                args: String::new(),
                action: Action::Killed,
                rule: format!("on_violation = \"kill\" ({})", policy.name),
                hint: "killed by the seccomp filter (SIGSYS); seccomp user notification is unavailable here, so the syscall cannot be named (see `wfjail check`)".into(),
                count: 1,
            });
        }
        let enforced = violations.iter().any(|v| v.action != Action::Warned);
        let cpu_limit_hit = policy.limits.cpu.is_some_and(|c| {
            sig_num == Some(libc::SIGXCPU)
                || (sig_num == Some(libc::SIGKILL)
                    && !o.timed_out
                    && !o.killed_for_violation
                    && !o.output_exceeded
                    && cpu_ms >= c.0.as_secs_f64() * 1000.0 - 50.0)
        });
        if enforced {
            Status::Violation
        } else if o.timed_out {
            Status::Timeout
        } else if o.output_exceeded {
            limit = Some("output".into());
            Status::Limit
        } else if cpu_limit_hit {
            limit = Some("cpu".into());
            Status::Limit
        } else if sig_num == Some(libc::SIGXFSZ) {
            limit = Some("file_size".into());
            Status::Limit
        } else if let Some(which) = (exit_code.is_some_and(|c| c != 0) || sig_num.is_some())
            .then(|| limit_from_stderr(policy, &stderr_tail))
            .flatten()
        {
            limit = Some(which.into());
            Status::Limit
        } else if sig_num.is_some() {
            Status::Crashed
        } else if exit_code.is_some_and(|c| c != 0) {
            Status::GuestError
        } else {
            Status::Ok
        }
    };
    if let (Status::Timeout, Some(t)) = (status, timeout) {
        error = Some(format!(
            "killed after {} (limits.timeout or --timeout)",
            crate::policy::Dur(t)
        ));
    }
    Report {
        status,
        exit_code,
        signal,
        violations,
        duration_ms: o.duration.as_secs_f64() * 1000.0,
        cpu_ms,
        max_rss_kb,
        policy: policy.name.clone(),
        layers,
        stderr_tail,
        limit,
        error,
        guest_error: None,
        command: plan.argv.clone(),
        skipped_paths: plan.skipped.clone(),
        exit_status: exit_status.unwrap_or(status.exit_code()),
    }
}

/// Which limit a failed guest's last words say it hit. RLIMIT_AS makes allocations fail and
/// RLIMIT_FSIZE makes writes fail with EFBIG (the guest is PID 1 of its namespace, so the
/// SIGXFSZ that would kill it elsewhere is ignored): the guest reports either its own way.
fn limit_from_stderr(policy: &Policy, tail: &str) -> Option<&'static str> {
    let last = tail
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    let memory = last.starts_with("MemoryError")
        || last.contains("std::bad_alloc")
        || last.contains("out of memory")
        || last.contains("Cannot allocate memory");
    if memory && policy.limits.memory.is_some() {
        return Some("memory");
    }
    if policy.limits.file_size.is_some() && tail.contains("File too large") {
        return Some("file_size");
    }
    None
}
