//! `wfjail run`: plan, spawn, supervise, report.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::OFlag;

use crate::plan::{self, ExtraGrant, PlanRequest};
use crate::policy::Policy;
use crate::process;
use crate::protocol::guest::{PROTOCOL_FDS, frame_cap, protocol_env};
use crate::report::Report;
use crate::supervise::assemble::{self, Applied, LayersBase, applied_rlimit};
use crate::supervise::verdict;
use crate::supervise::{self, Config, GuestPipes, ProtocolPipes, Sinks};

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
    crate::timing::mark("plan: the rest (rule set, limits)");
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
    // While the child confines itself (on the other CPU): what the report will say of an
    // outer seccomp filter (a /proc read, once per process), instead of after the guest ended.
    let _ = crate::sys::refused_by_outer_filter();
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
        stop_signals,
        seed: opts.seed,
        clock: opts.clock,
        vdso: plan.rules.vdso,
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
    let outcome = supervise::supervise(
        spawned,
        pipes,
        policy,
        &cfg,
        supervise::guest::Judge::of(&plan, opts.learn),
        sinks,
    );
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
    let mut report = assemble::from_outcome(&plan, layers_base, outcome, timeout);
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
