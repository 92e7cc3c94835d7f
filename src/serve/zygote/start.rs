//! A zygote's start: spawned confined, driven to its exec (startup.rs's driver), its READY
//! checked (versions, preload, a Landlock domain for its sessions, memory wfjail can read),
//! and its control reader and notification router started.

use super::*;

impl Zygote {
    /// Starts zygote `index` under `policy` and waits until it has preloaded. `on_death` is
    /// called (from the reader thread) when it dies.
    pub fn start(
        index: usize,
        policy: Arc<Policy>,
        cfg: &ZygoteConfig,
        on_death: Arc<dyn Fn(usize) + Send + Sync>,
    ) -> Result<Arc<Zygote>, ZygoteError> {
        let mut argv = vec![
            cfg.python.display().to_string(),
            "-m".into(),
            "wfjail.zygote".into(),
        ];
        if !cfg.preload.is_empty() {
            argv.push("--preload".into());
            argv.push(cfg.preload.join(","));
        }
        // Removed once READY has come (`ScratchDir`), and whatever the start's end.
        let scratch = ScratchDir::create(index).map_err(ZygoteError::Scratch)?;
        let mut grants = cfg.grants.clone();
        grants.push(ExtraGrant {
            path: scratch.0.clone(),
            write: true,
        });
        let req = PlanRequest {
            session: false,
            argv,
            grants,
            extra_env: {
                let mut env = vec![
                    ("WFJAIL_ZYGOTE_FD".into(), "3".into()),
                    (
                        "WFJAIL_ZYGOTE_SCRATCH".into(),
                        scratch.0.display().to_string(),
                    ),
                    (
                        "WFJAIL_GETRANDOM".into(),
                        policy.random.getrandom.as_str().into(),
                    ),
                ];
                // Each session child's whole life (the zygote takes none: it lives as long as
                // the server); a call's own budget (limits.cpu) is measured by its session.
                // Same-page merging for the zygote family, not for this server: its pre-exec
                // child opts in (`plan.merge_pages` below); the zygote only says in READY what
                // the kernel tells it (python/wfjail/merging.py).
                if cfg.merge {
                    env.push(("WFJAIL_MERGE_PAGES".into(), "any".into()));
                }
                if let Some(c) = policy.limits.session_cpu {
                    env.push((
                        "WFJAIL_CPU_LIMIT".into(),
                        (c.0.as_secs_f64().ceil() as u64).to_string(),
                    ));
                }
                env
            },
            zygote: true,
            learn: false,
        };
        let mut plan = plan::build(&policy, &req)?;
        // Before the filter, which refuses the call to the guest (`policy::syscalls`).
        plan.merge_pages = cfg.merge;
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(|e| ZygoteError::ControlSocket(e.into()))?;
        let null = std::fs::File::open("/dev/null").map_err(ZygoteError::DevNull)?;
        // The zygote's own stdout and stderr (its children get their session's): a pipe
        // copied to ours, each line behind "[zygote i] ".
        let log = super::super::log_pipe(format!("zygote{index}"), format!("[zygote {index}] "))
            .map_err(ZygoteError::LogPipe)?;
        let targets = [
            (null.as_raw_fd(), 0),
            (log.as_raw_fd(), 1),
            (log.as_raw_fd(), 2),
            (theirs.as_raw_fd(), 3),
        ];
        let spawned = process::spawn(&plan, &targets, None)?;
        drop((null, theirs, log));
        let pid = spawned.pid;
        let base = crate::supervise::assemble::LayersBase::of(&spawned);
        let (listener, mut degraded) = match await_exec(spawned.chan, pid, plan.rules.vdso) {
            Ok(x) => x,
            Err(e) => {
                let _ = sys::pidfd_send_signal(spawned.pidfd.as_fd(), libc::SIGKILL);
                let _ = sys::wait4(pid);
                return Err(e.into());
            }
        };
        // The opt-in's failure is the operator log's (below), not a confinement layer's.
        let merge_refused = degraded
            .iter()
            .find(|(s, _)| *s == crate::process::channel::Step::MemoryMerge)
            .map(|&(_, e)| e);
        degraded.retain(|(s, _)| *s != crate::process::channel::Step::MemoryMerge);
        let layers =
            crate::supervise::assemble::layers(&plan, &base, &degraded, listener.is_some());
        let Spawned { pidfd, .. } = spawned;
        let reader = ours.try_clone().map_err(ZygoteError::ControlSocket)?;
        let (ready_tx, ready_rx) = channel();
        let zygote = Arc::new(Zygote {
            index,
            pid,
            pidfd,
            ctl: Mutex::new(ours),
            layers,
            applied: {
                let mut applied = crate::supervise::assemble::Applied::of(&plan);
                applied.write.retain(|p| p != &scratch.0);
                applied
            },
            pending: Mutex::new(HashMap::new()),
            by_ns_pid: Mutex::new(HashMap::new()),
            by_pid: Mutex::new(HashMap::new()),
            registered: nix::unistd::pipe2(
                nix::fcntl::OFlag::O_NONBLOCK | nix::fcntl::OFlag::O_CLOEXEC,
            )
            .map_err(|e| ZygoteError::Thread(e.into()))?,
            alive: AtomicBool::new(true),
            stopping: AtomicBool::new(false),
            ready: std::sync::OnceLock::new(),
            settled: std::sync::OnceLock::new(),
            settling: Default::default(),
            pid_entries: std::sync::OnceLock::new(),
        });
        {
            let z = zygote.clone();
            std::thread::Builder::new()
                .name(format!("zygote{index}-ctl"))
                .spawn(move || z.read_control(reader, ready_tx, on_death))
                .map_err(ZygoteError::Thread)?;
        }
        if let Some(listener) = listener {
            let z = zygote.clone();
            // The scratch directory is the zygote's alone: a session's writes are judged
            // without it (and by READY it is gone, its Landlock rule on a dead inode).
            let own_grants = Grants::new(&plan.write);
            let session_writes: Vec<PathBuf> = plan
                .write
                .iter()
                .filter(|p| **p != scratch.0)
                .cloned()
                .collect();
            let grants = Grants::new(&session_writes);
            let late = policy.zygote.reads_after_preload == Toggle::Deny;
            let decisions = plan.rules.decisions.clone();
            let on_violation = policy.on_violation;
            std::thread::Builder::new()
                .name(format!("zygote{index}-notify"))
                .spawn(move || {
                    let rules = notify::Rules {
                        decisions: &decisions,
                        grants: &grants,
                        late_reads: late,
                        on_violation,
                        reads: None,
                    };
                    z.route_notifications(listener, rules, &own_grants)
                })
                .map_err(ZygoteError::Thread)?;
        }
        // No session before the scratch directory is gone (a spare forked meanwhile is no
        // session's: the router refuses its writes).
        let ready = zygote
            .check_ready(ready_rx.recv_timeout(READY_TIMEOUT), cfg)
            .and_then(|()| scratch.remove().map_err(ZygoteError::Scratch));
        if let Err(e) = ready {
            zygote.kill();
            return Err(e);
        }
        if cfg.merge || zygote.ready.get().is_some_and(|r| r.merging.is_some()) {
            // Always said (not only without -q): an operator who asked for merging learns
            // whether it is on, and why not, at each zygote's start.
            use crate::merging::OptIn;
            let opt_in = match (cfg.merge, merge_refused) {
                (false, _) => OptIn::NotAsked,
                (true, None) => OptIn::Set,
                (true, Some(e)) => OptIn::Refused(e),
            };
            let took = zygote.ready.get().and_then(|r| r.merging.as_deref());
            let stat = crate::merging::ProcessKsm::of(zygote.pid);
            let (_, text) =
                crate::merging::notice(opt_in, took, stat.as_ref(), &crate::merging::Host::read());
            eprintln!("wfjail: zygote {index}: same-page merging {text}");
        }
        Ok(zygote)
    }

    /// Whether the zygote that sent `ready` (or none) can serve: it got ready, speaks this
    /// wfjail's control version, preloaded, gives each session a Landlock domain of its own,
    /// and wfjail can see into it.
    pub(super) fn check_ready(
        &self,
        ready: Result<Result<Ready, ControlError>, RecvTimeoutError>,
        cfg: &ZygoteConfig,
    ) -> Result<(), ZygoteError> {
        let python = cfg.python.clone();
        let ready = match ready {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => return Err(ZygoteError::BadReady(e)),
            Err(RecvTimeoutError::Timeout) => return Err(ZygoteError::NotReady { python }),
            Err(RecvTimeoutError::Disconnected) => {
                return Err(ZygoteError::ExitedEarly { python });
            }
        };
        if ready.control != CONTROL_VERSION {
            return Err(ZygoteError::ControlVersion {
                got: ready.control,
                python,
            });
        }
        if let Some(err) = ready.error {
            return Err(ZygoteError::Preload(err));
        }
        // Sessions share a uid and see the host's /proc: only a Landlock domain of each
        // session's own keeps one out of another's (or the zygote's) /proc/PID/fd, mem and
        // environ, and its signals and abstract sockets in.
        ready
            .session_domain()
            .map_err(ZygoteError::NoSessionDomain)?;
        // wfjail must still see into it (resolve a session's paths through /proc/PID/cwd and
        // fd, read its call arguments). The zygote is dumpable and in a domain nested in
        // wfjail's, so this holds as the same user or root; something else (an LSM, Yama's
        // ptrace_scope 3) could still forbid it: then sessions would be judged blind.
        inspectable(self.pid).map_err(ZygoteError::NotInspectable)
    }
}

/// A zygote's scratch directory: where what it preloads may write until READY (its
/// `TMPDIR`, unless the policy sets one: `tempfile.gettempdir()` at import then finds a
/// directory it can write, as it did in the worker). The zygote empties it before
/// READY and wfjail removes it once READY has come, before any session: no session child
/// ever writes there (its Landlock rule is left on a dead inode).
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn create(index: usize) -> std::io::Result<ScratchDir> {
        use std::os::unix::fs::DirBuilderExt;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        // Resolved, as the plan records its grants.
        let path = std::fs::canonicalize(std::env::temp_dir())?.join(format!(
            "wfjail-zygote{index}-{}-{nanos:09}",
            std::process::id()
        ));
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        Ok(ScratchDir(path))
    }
}

impl ScratchDir {
    /// Removes it: what the zygote left there, and the directory (which it cannot remove:
    /// that is a write to its parent).
    fn remove(&self) -> std::io::Result<()> {
        std::fs::remove_dir_all(&self.0)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// How long a zygote may take to preload.
pub(super) const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Why a zygote could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ZygoteError {
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("control socket: {0}")]
    ControlSocket(#[source] std::io::Error),
    #[error("/dev/null: {0}")]
    DevNull(#[source] std::io::Error),
    #[error("log pipe: {0}")]
    LogPipe(#[source] std::io::Error),
    #[error("the zygote's scratch directory: {0}")]
    Scratch(#[source] std::io::Error),
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    /// Its set-up failed before or at its exec.
    #[error(transparent)]
    Exec(#[from] StartupError),
    #[error("{0}")]
    Thread(#[source] std::io::Error),
    #[error(
        "the zygote did not get ready within {}s; {}",
        READY_TIMEOUT.as_secs(),
        importable(.python)
    )]
    NotReady { python: PathBuf },
    #[error(
        "the zygote exited before it was ready (its error is above); {}",
        importable(.python)
    )]
    ExitedEarly { python: PathBuf },
    #[error("the zygote sent a bad control message: {0}")]
    BadReady(#[source] ControlError),
    #[error(
        "the zygote's `wfjail` Python package speaks control version {got}, this wfjail \
         {CONTROL_VERSION}: install the package of this wfjail (`pip install ./python` from its \
         source) into the environment of {}",
        .python.display()
    )]
    ControlVersion { got: u64, python: PathBuf },
    #[error("the zygote could not preload: {0}")]
    Preload(String),
    #[error(
        "the zygote cannot give each session a Landlock domain of its own ({0}); sessions \
         would reach each other through /proc/PID/fd, so wfjail refuses to serve. Nesting \
         needs Landlock in the kernel (5.13 or later, with `landlock` in the `lsm=` boot \
         parameter or CONFIG_LSM) and landlock_create_ruleset, landlock_add_rule and \
         landlock_restrict_self allowed by any seccomp filter wfjail runs under (a container \
         profile); use exec mode (no --zygote) otherwise"
    )]
    NoSessionDomain(#[source] NoDomain),
    #[error(
        "wfjail cannot read the zygote's memory ({0}); the session children's calls could \
         not be judged, so wfjail refuses to serve"
    )]
    NotInspectable(#[source] InspectError),
}

/// The hint of a zygote that never got ready.
pub(super) fn importable(python: &std::path::Path) -> String {
    format!(
        "is the `wfjail` Python package importable by {} under the policy (installed in its \
         environment, or on a PYTHONPATH the policy sets and grants)?",
        python.display()
    )
}

/// Why wfjail cannot inspect a process the way it inspects session children.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error("/proc/{pid}/cwd: {source}")]
    Cwd { pid: i32, source: std::io::Error },
    #[error("/proc/{pid}/maps: {source}")]
    Maps { pid: i32, source: std::io::Error },
    #[error("/proc/{0}/maps lists no readable mapping")]
    NoMapping(i32),
    #[error("process_vm_readv: {0}")]
    Memory(#[source] std::io::Error),
}

/// What a guest's exec left: its listener (if any) and the steps that degraded.
pub(super) type Execed = (Option<OwnedFd>, Vec<(chan::Step, Errno)>);

/// Whether wfjail can read what it needs of process `pid` (its cwd link, its maps, a byte of
/// its memory), the way it does for a session child's calls.
pub(super) fn inspectable(pid: libc::pid_t) -> Result<(), InspectError> {
    std::fs::read_link(format!("/proc/{pid}/cwd"))
        .map_err(|source| InspectError::Cwd { pid, source })?;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .map_err(|source| InspectError::Maps { pid, source })?;
    let addr = maps
        .lines()
        .find(|l| {
            l.split_whitespace()
                .nth(1)
                .is_some_and(|p| p.starts_with('r'))
        })
        .and_then(|l| l.split('-').next())
        .and_then(|a| u64::from_str_radix(a, 16).ok())
        .ok_or(InspectError::NoMapping(pid))?;
    sys::read_process_memory(pid, addr, &mut [0u8; 1])
        .map(|_| ())
        .map_err(InspectError::Memory)
}

/// How long a zygote may take from `clone` to its exec.
pub(super) const EXEC_WITHIN: Duration = Duration::from_secs(30);

/// Waits until a freshly spawned zygote has exec'd: set-up records, the listener, and the
/// initial exec notification (supervise/startup.rs). Once the exec is let through, the
/// listener is left alone: what comes next is the zygote's, for its router. Returns the
/// listener (if any) and the degraded steps.
pub fn await_exec(
    chan: OwnedFd,
    pid: libc::pid_t,
    vdso: Option<crate::answers::vdso::Patch>,
) -> Result<Execed, StartupError> {
    // With the vDSO patched at the exec stop: sessions inherit the patch.
    let mut start = Driver::new(pid, chan, vdso);
    let deadline = Instant::now() + EXEC_WITHIN;
    loop {
        // After the exec the listener is not read here: what comes is the zygote's.
        let watch_listener = !start.startup().exec_allowed();
        let Some(chan_fd) = start.chan() else {
            return Err(StartupError::Io(Errno::EBADF));
        };
        let mut fds = vec![PollFd::new(chan_fd, PollFlags::POLLIN)];
        if let Some(l) = start.listener().filter(|_| watch_listener) {
            fds.push(PollFd::new(l, PollFlags::POLLIN));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(StartupError::NoExec(EXEC_WITHIN));
        }
        match poll(&mut fds, crate::supervise::poll_timeout(left)) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => return Err(StartupError::Io(e)),
        }
        let chan_ready = fds[0].revents().is_some_and(|r| !r.is_empty());
        let notif_ready = fds
            .get(1)
            .and_then(|f| f.revents())
            .is_some_and(|r| r.contains(PollFlags::POLLIN));
        drop(fds);
        if chan_ready {
            if let ChanRead::Failed(e) = start.read_chan() {
                return Err(StartupError::Io(e));
            }
            if start.startup().finished() {
                return match start.startup().error() {
                    Some(e) => Err(e),
                    None => Ok((start.take_listener(), start.startup().degraded().to_vec())),
                };
            }
        }
        if notif_ready && let Listened::ExecStopFailed(e) = start.on_listener(PollFlags::POLLIN) {
            eprintln!("wfjail: zygote: {e}");
            let _ = sys::kill_pid(pid, libc::SIGKILL);
        }
    }
}
