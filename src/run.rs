//! `wfjail run`: plan, spawn, supervise, report.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::OFlag;

use crate::plan::{self, ExtraGrant, Plan, PlanRequest};
use crate::policy::syscalls::Category;
use crate::policy::{Layer, Policy};
use crate::process::{self, Spawned, channel::Step};
use crate::report::{Action, Layers, Report, Violation, signal_name};
use crate::supervise::verdict::{self, Ending, Facts, SetupFailed};
use crate::supervise::{self, Config, GuestPipes, Outcome, ProtocolPipes, Sinks};

/// What `wfjail run` was asked to do, beyond the policy.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    pub argv: Vec<String>,
    pub grants: Vec<ExtraGrant>,
    /// Overrides the policy's `limits.timeout`.
    pub timeout: Option<Duration>,
    /// The request: a file, or `None` for wfjail's own stdin.
    pub input: Option<PathBuf>,
    /// The guest does not speak the protocol: the request is its stdin, the result its stdout.
    pub raw: bool,
    /// Echo the guest's stderr and a line per violation to wfjail's stderr.
    pub echo: bool,
    /// The seed of `[random] getrandom = "seeded"` (default 0).
    pub seed: Option<u64>,
    /// The workflow time of `[time] clock = "virtual"`, nanoseconds since the epoch (default:
    /// the host's time at start).
    pub clock: Option<i64>,
    /// `wfjail learn`: every open and every violation is recorded (`Report::learned`).
    pub learn: bool,
}

impl RunOptions {
    /// Options for a raw run of `argv` (stdin in, stdout out).
    pub fn raw(argv: Vec<String>) -> Self {
        RunOptions {
            argv,
            raw: true,
            ..Default::default()
        }
    }
}

/// The guest's descriptor numbers for the protocol pipes (docs/protocol.md).
pub const PROTOCOL_FDS: (i32, i32) = (3, 4);

/// Runs one confined execution and reports on it. The result (raw: the guest's stdout;
/// framed: the RESULT payload) is written to `stdout`.
pub fn run(policy: &Policy, opts: &RunOptions, stdout: &mut dyn Write) -> Report {
    let fail = |msg: String, code: i32| Report::launch_error(&policy.name, &opts.argv, msg, code);
    let extra_env = if opts.raw {
        vec![]
    } else {
        protocol_env(policy)
    };
    let req = PlanRequest {
        session: false,
        argv: opts.argv.clone(),
        grants: opts.grants.clone(),
        extra_env,
        zygote: false,
        learn: opts.learn,
    };
    let plan = match plan::build(policy, &req) {
        Ok(p) => p,
        Err(e) => return fail(e.to_string(), e.exit_code()),
    };
    crate::timing::mark("plan (grants, Landlock ruleset, seccomp programs)");
    let io = match GuestIo::open(policy, opts) {
        Ok(io) => io,
        Err(e) => return fail(e.to_string(), e.exit_code()),
    };
    let GuestIo {
        stdin,
        stdin_feed,
        out: (out_r, out_w),
        err: (err_r, err_w),
        proto,
    } = io;
    let mut targets = vec![
        (stdin.as_raw_fd(), 0),
        (out_w.as_raw_fd(), 1),
        (err_w.as_raw_fd(), 2),
    ];
    if let Some(p) = &proto {
        targets.push((p.to_guest.0.as_raw_fd(), PROTOCOL_FDS.0));
        targets.push((p.from_guest.1.as_raw_fd(), PROTOCOL_FDS.1));
    }
    // Blocked before the guest exists, so that a SIGTERM from now on ends in a report.
    let stop_signals = supervise::block_stop_signals();
    // limits.disk: the baseline of the write grants, before the guest can write.
    let disk = match policy.limits.disk {
        Some(limit) => match supervise::disk::DiskAccount::new(plan.write.clone(), limit.0) {
            Ok(a) => Some(std::cell::RefCell::new(a)),
            Err(e) => return fail(format!("limits.disk: {e}"), 125),
        },
        None => None,
    };
    // limits.processes for a guest that runs as host root: a pids cgroup (see pids_cgroup).
    let pids_cgroup = process::pids_cgroup::for_policy(policy);
    if let (Some(acct), Some(Ok(cg))) = (&disk, &pids_cgroup) {
        acct.borrow_mut().watch_cgroup(cg.procs());
    }
    let spawned = match process::spawn(
        &plan,
        &targets,
        pids_cgroup.as_ref().and_then(|c| c.as_ref().ok()),
    ) {
        Ok(s) => s,
        Err(e) => return fail(e.to_string(), 125),
    };
    let nproc_bound = process::pids_cgroup::apply(policy, &pids_cgroup);
    crate::timing::mark("spawn (clone)");
    drop((stdin, out_w, err_w));
    if let Some(feed) = stdin_feed {
        feed.start();
    }
    let run_started = std::time::SystemTime::now();
    let protocol = proto.map(|p| {
        let ((to_r, to_w), (from_r, from_w)) = (p.to_guest, p.from_guest);
        drop((to_r, from_w)); // the guest's ends
        ProtocolPipes {
            to_guest: to_w,
            from_guest: from_r,
            request: p.request,
            cap: p.cap,
        }
    });
    let timeout = opts.timeout.or(policy.limits.timeout.map(|d| d.0));
    let cfg = Config {
        timeout,
        output_limit: policy.limits.output.0,
        memory_limit: applied_rlimit(&plan, libc::RLIMIT_AS),
        write_grants: crate::notify::paths::Grants::new(&plan.write),
        stop_signals,
        seed: opts.seed,
        decisions: plan.rules.decisions.clone(),
        clock: opts.clock,
        vdso: plan.rules.vdso,
        learn: opts.learn,
        read_grants: plan
            .warn_files
            .then(|| crate::notify::paths::Grants::new(&plan.read)),
        disk,
    };
    let mut stderr = std::io::stderr();
    let framed = protocol.is_some();
    let sinks = Sinks {
        // Framed, the guest's stdout is a log: the supervisor echoes it with its stderr.
        stdout: (!framed).then_some(&mut *stdout as &mut dyn Write),
        stderr: opts.echo.then_some(&mut stderr as &mut dyn Write),
        // Learning records every open: lines for each would drown the guest's own.
        violations: opts.echo && !opts.learn,
    };
    let mut layers_base = LayersBase::of(&spawned);
    layers_base.nproc_bound = nproc_bound;
    let pipes = GuestPipes {
        stdout: out_r,
        stderr: err_r,
        protocol,
    };
    let outcome = supervise::supervise(spawned, pipes, policy, &cfg, sinks);
    drop(pids_cgroup); // the guest is reaped: its cgroup goes
    let mut outcome = outcome;
    if outcome.exec_confirmed {
        // Once more, now that its cgroup is empty (see supervise::disk_at_end).
        supervise::disk_at_end(&cfg, &mut outcome);
    }
    crate::timing::mark("supervise (child set-up, exec, guest run, exit)");
    if let Some(result) = &outcome.result {
        let _ = stdout.write_all(result);
        let _ = stdout.flush();
    }
    if verdict::guest_failed(
        outcome.reaped.map(|r| r.status),
        outcome.guest_error.is_some(),
    ) {
        outcome.file_at_limit = Applied::of(&plan).file_at_limit(run_started);
    }
    let mut report = build_report(&plan, layers_base, outcome, timeout);
    // A guest that failed after being given a file it may not read (a script, a config): a
    // refused read is Landlock's EACCES, which the supervisor does not see. Say which grant
    // would have let it read it.
    if report.status == crate::report::Status::GuestError
        && report.error.is_none()
        && let Some(path) = plan.unreadable_args.first()
    {
        report.error = Some(format!(
            "the command's argument {} is not readable under policy {}: grant it with --ro {} (or the directory that holds it)",
            path.display(),
            policy.name,
            path.display()
        ));
    }
    crate::timing::mark("report");
    report
}

/// A pipe: (read end, write end).
type Pipe = (OwnedFd, OwnedFd);

/// The framed-mode pipes and request.
struct ProtoIo {
    to_guest: Pipe,
    from_guest: Pipe,
    request: Vec<u8>,
    cap: usize,
}

/// The descriptors a guest gets, before they are handed over.
struct GuestIo {
    stdin: OwnedFd,
    /// Raw mode: what copies the input into the guest's stdin pipe.
    stdin_feed: Option<StdinFeed>,
    out: Pipe,
    err: Pipe,
    proto: Option<ProtoIo>,
}

/// Why the guest's descriptors could not be set up.
#[derive(Debug, thiserror::Error)]
enum GuestIoError {
    #[error("pipe: {0}")]
    Pipe(#[source] Errno),
    #[error("/dev/null: {0}")]
    DevNull(#[source] std::io::Error),
    #[error("--input {}: {source}", .path.display())]
    Input {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("reading the request: {0}")]
    Request(#[source] std::io::Error),
    #[error("the request is larger than the {0}-byte frame cap (limits.output)")]
    RequestTooLarge(usize),
}

impl GuestIoError {
    /// wfjail's exit status: 2 for the caller's input, 125 for wfjail's own failures.
    fn exit_code(&self) -> i32 {
        match self {
            GuestIoError::Pipe(_) | GuestIoError::DevNull(_) => 125,
            GuestIoError::Input { .. }
            | GuestIoError::Request(_)
            | GuestIoError::RequestTooLarge(_) => 2,
        }
    }
}

impl GuestIo {
    /// Raw: stdin is the request. Framed: the request is read whole (bounded) and written to
    /// the protocol pipe; stdin is /dev/null.
    fn open(policy: &Policy, opts: &RunOptions) -> Result<GuestIo, GuestIoError> {
        let pipe = || nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(GuestIoError::Pipe);
        let null = || dev_null().map_err(GuestIoError::DevNull);
        let input = match &opts.input {
            Some(path) => std::fs::File::open(path)
                .map(OwnedFd::from)
                .map_err(|source| GuestIoError::Input {
                    path: path.clone(),
                    source,
                })?,
            None => match std::io::stdin().as_fd().try_clone_to_owned() {
                Ok(fd) => fd,
                Err(_) => null()?,
            },
        };
        let (out, err) = (pipe()?, pipe()?);
        if !opts.raw && opts.input.is_none() && std::io::IsTerminal::is_terminal(&std::io::stdin())
        {
            eprintln!(
                "wfjail: reading the request from the terminal (end it with Ctrl-D, or use --input FILE)"
            );
        }
        if opts.raw {
            // Never the caller's own descriptor: a terminal, a socket or a read-write file
            // there would escape the policy. The guest reads a pipe that a thread fills, or
            // a /dev/null of its own when that is all the input is.
            if is_dev_null(&input) {
                return Ok(GuestIo {
                    stdin: null()?,
                    stdin_feed: None,
                    out,
                    err,
                    proto: None,
                });
            }
            let (r, w) = pipe()?;
            return Ok(GuestIo {
                stdin: r,
                stdin_feed: Some(StdinFeed { from: input, to: w }),
                out,
                err,
                proto: None,
            });
        }
        let cap = frame_cap(policy);
        let mut request = Vec::new();
        std::fs::File::from(input)
            .take(cap as u64 + 1)
            .read_to_end(&mut request)
            .map_err(GuestIoError::Request)?;
        if request.len() > cap {
            return Err(GuestIoError::RequestTooLarge(cap));
        }
        let proto = ProtoIo {
            to_guest: pipe()?,
            from_guest: pipe()?,
            request,
            cap,
        };
        Ok(GuestIo {
            stdin: null()?,
            stdin_feed: None,
            out,
            err,
            proto: Some(proto),
        })
    }
}

/// Copies wfjail's input (its stdin or `--input`) into the raw guest's stdin pipe, on a thread
/// with blocking reads and writes and a fixed buffer. It ends at the input's end-of-file
/// (closing the pipe: the guest sees end-of-file) or when the guest closes its end (EPIPE).
struct StdinFeed {
    from: OwnedFd,
    to: OwnedFd,
}

impl StdinFeed {
    fn start(self) {
        let StdinFeed { from, to } = self;
        // Blocking writes: the pipe's capacity is the only buffer besides ours.
        if let Ok(flags) = nix::fcntl::fcntl(&to, nix::fcntl::FcntlArg::F_GETFL) {
            let flags = OFlag::from_bits_truncate(flags) & !OFlag::O_NONBLOCK;
            let _ = nix::fcntl::fcntl(&to, nix::fcntl::FcntlArg::F_SETFL(flags));
        }
        let spawned = std::thread::Builder::new()
            .name("wfjail-stdin".into())
            .spawn(move || {
                let mut from = std::fs::File::from(from);
                let mut to = std::fs::File::from(to);
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    match from.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => {
                            if to.write_all(&buf[..n]).is_err() {
                                break; // the guest closed its stdin
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(_) => break,
                    }
                }
            });
        if spawned.is_err() {
            eprintln!("wfjail: could not start the stdin copier; the guest's stdin is empty");
        }
    }
}

/// The environment that tells a framed guest where its protocol pipes are (docs/protocol.md).
pub fn protocol_env(policy: &Policy) -> Vec<(String, String)> {
    vec![
        (
            "WFJAIL_PROTOCOL".into(),
            crate::protocol::guest::VERSION.to_string(),
        ),
        (
            "WFJAIL_FDS".into(),
            format!("{},{}", PROTOCOL_FDS.0, PROTOCOL_FDS.1),
        ),
        ("WFJAIL_FRAME_CAP".into(), frame_cap(policy).to_string()),
        // Where randomness comes from, so that a zygote's session knows whether it may
        // reseed Python's `random` (python/wfjail/zygote.py).
        (
            "WFJAIL_GETRANDOM".into(),
            policy.random.getrandom.as_str().into(),
        ),
    ]
}

/// The largest frame payload accepted: 16 MiB, or `limits.output` if smaller.
pub fn frame_cap(policy: &Policy) -> usize {
    (policy.limits.output.0 as usize).min(crate::protocol::MAX_FRAME)
}

/// Whether `fd` is the null device (character device 1:3).
fn is_dev_null(fd: &OwnedFd) -> bool {
    nix::sys::stat::fstat(fd).is_ok_and(|st| {
        (st.st_mode & libc::S_IFMT) == libc::S_IFCHR
            && libc::major(st.st_rdev) == 1
            && libc::minor(st.st_rdev) == 3
    })
}

fn dev_null() -> std::io::Result<OwnedFd> {
    std::fs::File::open("/dev/null").map(OwnedFd::from)
}

/// What is known of the layers at spawn time.
pub struct LayersBase {
    user_ns: bool,
    pid_ns: bool,
    clone_degraded: Vec<(Layer, Errno)>,
    /// `limits.processes` through a pids cgroup, when only that can bind it: whether it
    /// does, or why not (`process::pids_cgroup::apply`).
    pub nproc_bound: Option<Result<(), String>>,
}

impl LayersBase {
    pub fn of(s: &Spawned) -> Self {
        LayersBase {
            user_ns: s.user_ns,
            pid_ns: s.pid_ns,
            clone_degraded: s.clone_degraded.clone(),
            nproc_bound: None,
        }
    }
}

fn step_layer(step: Step) -> &'static str {
    match step {
        Step::NetNs => "net-ns",
        Step::IpcNs => "ipc-ns",
        Step::UtsNs => "uts-ns",
        Step::MountNs => "mount-ns",
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
        "mount-ns" => {
            "host pids stay visible in /proc: a private /proc needs the PID namespace, and in a user namespace an unmasked /proc (a container that masks /proc paths refuses it); see `wfjail check`"
        }
        "hostname" => {
            "the container's seccomp profile refuses sethostname (podman's default does): the guest's UTS namespace keeps the container's hostname; see `wfjail check`"
        }
        "seccomp-notify" => "needs Linux >= 5.0 and a runtime that allows the seccomp listener",
        "capabilities" => {
            "the bounding set needs CAP_SETPCAP (a user namespace gives it); harmless under no_new_privs"
        }
        _ => "see `wfjail check`",
    }
}

/// The layers actually applied, from the plan, the spawn and the child's records.
pub fn layers(
    plan: &Plan,
    base: &LayersBase,
    degraded_steps: &[(Step, Errno)],
    notify: bool,
) -> Layers {
    let degraded_step = |s: Step| degraded_steps.iter().any(|(d, _)| *d == s);
    let mut degraded: Vec<String> = Vec::new();
    for (layer, errno) in &base.clone_degraded {
        if *layer == Layer::MountNs && !plan.namespaces.pid {
            degraded.push(
                "mount-ns: a private /proc needs namespaces.pid = true; host pids stay visible"
                    .into(),
            );
            continue;
        }
        degraded.push(format!(
            "{}: {} ({})",
            layer.as_str(),
            errno.desc(),
            enable_hint(layer.as_str())
        ));
    }
    for (step, errno) in degraded_steps {
        let l = step_layer(*step);
        degraded.push(format!("{l}: {} ({})", errno.desc(), enable_hint(l)));
    }
    let landlock = match &plan.landlock {
        Some((_, info)) if !degraded_step(Step::Landlock) => {
            if !info.tcp && plan.network == crate::policy::NetworkMode::None && info.abi < 4 {
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
    if let Some(Err(why)) = &base.nproc_bound {
        // The guest's uid maps to host root, which the kernel exempts from RLIMIT_NPROC, and
        // no pids cgroup could bound it: with fork or threads allowed, nothing bounds its
        // processes. Say so instead of pretending.
        degraded.push(format!(
            "rlimit-nproc: limits.processes does not bind a guest that runs as host root (the kernel exempts uid 0), and no pids cgroup could bound it here ({why}); \
             run wfjail as an unprivileged user, or keep process.subprocess and process.threads denied"
        ));
    }
    if !notify {
        degraded.extend(plan.rules.without_listener.iter().map(|&d| d.to_string()));
    }
    // Calls an outer (container) filter answers before wfjail's: never reported.
    let unseen = crate::sys::refused_by_outer_filter();
    if !unseen.is_empty() {
        degraded.push(format!(
            "container-seccomp: this container's seccomp profile refuses {} itself, before \
             wfjail's filter: a guest's call fails with an errno but no violation is reported \
             (see `wfjail check`)",
            unseen.join(", ")
        ));
    }
    let seccomp = if notify {
        "user-notify"
    } else if degraded_step(Step::Seccomp) {
        "none"
    } else {
        "filter"
    };
    // Made by clone (user, pid) or by unshare in the child (net, ipc, uts, mount), in report
    // order.
    let ns = plan.namespaces;
    let made = |want: bool, step: Step| want && !degraded_step(step);
    let namespaces: Vec<&str> = [
        (base.user_ns, "user"),
        (made(ns.net, Step::NetNs), "net"),
        (base.pid_ns, "pid"),
        (made(ns.ipc, Step::IpcNs), "ipc"),
        (made(ns.uts, Step::UtsNs), "uts"),
        (made(ns.mount && base.pid_ns, Step::MountNs), "mount"),
    ]
    .into_iter()
    .filter_map(|(on, name)| on.then_some(name))
    .collect();
    let capabilities = if degraded_step(Step::CapabilityBounding) {
        "bounding set kept; effective, permitted, inheritable and ambient empty".into()
    } else {
        "none".into()
    };
    let landlock_abi = match &plan.landlock {
        Some((_, info)) if landlock != "none" => Some(crate::report::LandlockAbi {
            kernel: info.kernel_abi,
            enforced: info.abi,
        }),
        _ => None,
    };
    Layers {
        landlock,
        landlock_abi,
        seccomp: seccomp.into(),
        namespaces,
        capabilities,
        no_new_privs: !degraded_step(Step::NoNewPrivs),
        degraded,
    }
}

/// Classifies an outcome into a report (the facts of how the guest ended, judged by
/// [`verdict::classify`]).
pub fn build_report(
    plan: &Plan,
    base: LayersBase,
    o: Outcome,
    timeout: Option<Duration>,
) -> Report {
    let layers = layers(plan, &base, &o.degraded, o.notify);
    let status_word = o.reaped.as_ref().map(|r| r.status);
    let signal = status_word
        .filter(|&st| libc::WIFSIGNALED(st))
        .map(|st| libc::WTERMSIG(st));
    let mut violations = o.violations;
    let launched = o.fatal.is_none() && o.channel_error.is_none() && o.interrupted.is_none();
    // Killed by the in-filter action (no user notification): name what we can.
    if launched && signal == Some(libc::SIGSYS) && !o.notify {
        violations.push(Violation {
            category: Category::Other,
            syscall: "unknown".into(),
            args: String::new(),
            action: Action::Killed,
            rule: format!("on_violation = \"kill\" ({})", plan.policy_name),
            hint: "killed by the seccomp filter (SIGSYS); seccomp user notification is unavailable here, so the syscall cannot be named (see `wfjail check`)".into(),
            count: 1,
        });
    }
    let facts = Facts {
        fatal: o.fatal.map(|(step, errno)| SetupFailed {
            step,
            errno,
            command: plan.command.display().to_string(),
        }),
        channel_error: o.channel_error.clone(),
        interrupted: o.interrupted,
        never_execed: !o.exec_confirmed && o.reaped.is_none(),
        wait_status: status_word,
        zygote_died: false,
        violation_enforced: violations.iter().any(|v| v.action != Action::Warned),
        timed_out: o.timed_out,
        protocol_error: o.protocol_error.is_some(),
        output_exceeded: o.output_exceeded,
        // `run`'s CPU limit is RLIMIT_CPU over the one execution.
        call_cpu_exceeded: false,
        killed_by_supervisor: o.timed_out
            || o.killed_for_violation
            || o.output_exceeded
            || o.protocol_error.is_some()
            || o.interrupted.is_some()
            || o.channel_error.is_some(),
        cpu_ms: o.reaped.as_ref().map_or(0.0, |r| r.cpu_ms()),
        cpu_limit: plan.limits.cpu.map(|c| c.0),
        memory_limit: applied_rlimit(plan, libc::RLIMIT_AS),
        vm_peak: o.vm_peak,
        disk_exceeded: o.disk_exceeded,
        notifications_exceeded: o.notifications_exceeded,
        memory_refused: o.memory_refused.is_some(),
        file_at_limit: o.file_at_limit.is_some(),
        errored: o.guest_error.is_some(),
        ending: if o.framed {
            Ending::Call {
                answered: o.result.is_some() || o.guest_error.is_some(),
            }
        } else {
            Ending::Raw
        },
        // Why the conversation was ended, whatever status outranks it.
        stopped: o
            .protocol_error
            .as_ref()
            .map(|e| format!("{e}; the guest was stopped (docs/protocol.md)"))
            .or_else(|| o.disk_error.clone()),
        timeout_words: timeout.map(|t| {
            format!(
                "killed after {} (limits.timeout or --timeout)",
                crate::policy::Dur(t)
            )
        }),
    };
    let v = verdict::classify(&facts);
    Report {
        status: v.status,
        exit_code: status_word
            .filter(|&st| libc::WIFEXITED(st))
            .map(|st| libc::WEXITSTATUS(st)),
        signal: signal.map(signal_name),
        violations,
        duration_ms: o.duration.as_secs_f64() * 1000.0,
        cpu_ms: facts.cpu_ms,
        max_rss_kb: o.reaped.as_ref().map_or(0, |r| r.max_rss_kb()),
        policy: plan.policy_name.clone(),
        layers,
        stderr_tail: String::from_utf8_lossy(&o.stderr_tail).into_owned(),
        limit: v.limit.map(|l| l.as_str().to_string()),
        error: v.error,
        guest_error: o.guest_error,
        command: plan.argv.clone(),
        seed: o.seed,
        clock: o.clock.map(crate::answers::workflow_time::format),
        skipped_paths: plan.skipped.clone(),
        learned: plan
            .base_grants
            .clone()
            .map(|(read, write)| crate::report::Learned {
                read,
                write,
                violations: o.learned.clone(),
                processes: plan.limits.processes,
            }),
        exit_status: v.exit_status,
    }
}

/// What a guest's end is judged against, besides the policy: the rlimits as applied (the
/// policy's, or lower inherited ones) and where it may write (searched for a file at the
/// size limit).
#[derive(Debug, Clone, Default)]
pub struct Applied {
    /// RLIMIT_AS, in bytes.
    pub memory: Option<u64>,
    /// RLIMIT_FSIZE, in bytes.
    pub file_size: Option<u64>,
    /// The write grants.
    pub write: Vec<PathBuf>,
}

impl Applied {
    pub fn of(plan: &Plan) -> Self {
        Applied {
            memory: applied_rlimit(plan, libc::RLIMIT_AS),
            file_size: applied_rlimit(plan, libc::RLIMIT_FSIZE),
            write: plan.write.clone(),
        }
    }

    /// Kernel evidence for RLIMIT_FSIZE ([`file_at_limit`]) for a guest that started at
    /// `started` (wall clock): whether a file under the write grants is at the limit.
    pub fn file_at_limit(&self, started: std::time::SystemTime) -> Option<String> {
        let limit = self.file_size?;
        file_at_limit(&self.write, limit, started - FILE_TIME_SLACK)
    }
}

/// The value of rlimit `resource` the child applies (the policy's, or a lower inherited one).
fn applied_rlimit(plan: &Plan, resource: u32) -> Option<u64> {
    plan.rlimits
        .iter()
        .find(|(r, _)| *r as u32 == resource)
        .map(|(_, v)| *v)
}

/// How far a file's modification time may lag behind the run's start (the kernel stamps
/// files with a clock that advances once a tick).
const FILE_TIME_SLACK: Duration = Duration::from_millis(100);

/// Entries looked at when searching the write grants for a file at the size limit.
const FILE_SCAN_BUDGET: usize = 10_000;

/// Kernel evidence for RLIMIT_FSIZE: a regular file under the write grants, written since the
/// run started, whose size is exactly the limit (a write past it failed with EFBIG). The
/// search is bounded ([`FILE_SCAN_BUDGET`] entries) and follows no symlink.
fn file_at_limit(roots: &[PathBuf], limit: u64, since: std::time::SystemTime) -> Option<String> {
    let mut budget = FILE_SCAN_BUDGET;
    let mut stack: Vec<PathBuf> = roots.to_vec();
    while let Some(p) = stack.pop() {
        if budget == 0 {
            return None;
        }
        budget -= 1;
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if meta.is_file() {
            let fresh = meta.modified().is_ok_and(|m| m >= since);
            if meta.len() == limit && fresh {
                return Some(p.display().to_string());
            }
        } else if meta.is_dir()
            && let Ok(entries) = std::fs::read_dir(&p)
        {
            for e in entries.flatten().take(budget) {
                stack.push(e.path());
            }
        }
    }
    None
}
