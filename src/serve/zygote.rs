//! The prefork zygote: a confined Python process (`python -m wfjail.zygote`) that preloaded
//! the workflow code and forks one child per session, copy-on-write.
//!
//! Threads per zygote: a control reader (READY, FORKED, EXITED from the zygote) and a
//! notification router. Every task under the zygote's filter notifies the same listener, so
//! the router decides by pid: the zygote's own `clone` (fork) is let through — only the zygote
//! may fork — and a child's notification is judged under the full policy and recorded in its
//! session.
//!
//! Sessions share the zygote's uid, PID namespace and `/proc` (the host's, or the zygote's
//! private one, where siblings are still listed), so each session
//! child enters a Landlock domain of its own right after the fork, nested in the zygote's
//! (python/wfjail/zygote.py): Landlock lets a process pass `ptrace_may_access` — which guards
//! `/proc/PID/fd`, `mem`, `environ`, `process_vm_*`, `pidfd_getfd`, `kcmp` — only towards its
//! own domain or a nested one, so a session cannot reach a sibling or the zygote, and with
//! Landlock ABI >= 6 cannot signal them or reach their abstract unix sockets either. wfjail
//! itself is in no domain (or in an ancestor of theirs): it still inspects every guest, with
//! or without a user namespace and as an unprivileged user. A zygote whose READY says it
//! cannot give its sessions such a domain is refused, and so is one whose memory wfjail cannot
//! read (its sessions' calls could not be judged).

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{
    AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType, sendmsg, socketpair,
};

use crate::plan::{self, ExtraGrant, PlanError, PlanRequest};
use crate::policy::decisions::Check;
use crate::policy::syscalls;
use crate::policy::{Policy, Toggle};
use crate::process::channel as chan;
use crate::process::{self, SpawnError, Spawned};
use crate::report::Layers;
use crate::supervise::notify;
use crate::supervise::paths::WriteGrants;
use crate::supervise::startup::{ChanRead, Driver, Listened, StartupError};
use crate::supervise::violations::Violations;
use crate::sys::{self, NotifBuf};

use super::SessionShared;
use super::control::{
    self, CONTROL_VERSION, Control, ControlError, Exited, Fork, ForkOutcome, NoDomain, Ready,
};

/// How long a zygote may take to preload.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a FORK may wait for its FORKED.
const FORK_WAIT: Duration = Duration::from_secs(30);

/// How to start zygotes.
#[derive(Debug, Clone)]
pub struct ZygoteConfig {
    /// The Python interpreter (with the `wfjail` package importable).
    pub python: PathBuf,
    /// Modules imported before any fork.
    pub preload: Vec<String>,
    pub grants: Vec<ExtraGrant>,
}

/// How a session child ended, as the zygote reported it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChildExit {
    /// The wait status; `None` when the zygote died (and took the child with it).
    pub status: Option<i32>,
    pub cpu_ms: f64,
    pub max_rss_kb: u64,
}

impl From<Exited> for ChildExit {
    fn from(e: Exited) -> Self {
        ChildExit {
            status: Some(e.status),
            cpu_ms: e.cpu_ms,
            max_rss_kb: e.max_rss_kb,
        }
    }
}

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
fn importable(python: &std::path::Path) -> String {
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

/// Why a FORK gave no child.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ForkError {
    #[error("the zygote is restarting")]
    Restarting,
    #[error("asking the zygote to fork: {0}")]
    Send(#[source] Errno),
    #[error("the zygote did not answer FORK")]
    NoAnswer,
    #[error("the zygote died")]
    Died,
    /// The zygote's own reason (FORKED with an error).
    #[error("{0}")]
    Refused(String),
}

type ForkReply = Result<i32, ForkError>;
/// A FORK waiting for its FORKED: the session, and where to send the answer.
type PendingFork = (Arc<SessionShared>, Sender<ForkReply>);
/// What a guest's exec left: its listener (if any) and the steps that degraded.
type Execed = (Option<OwnedFd>, Vec<(chan::Step, Errno)>);

/// One running zygote.
pub struct Zygote {
    pub index: usize,
    /// Global pid (the zygote is PID 1 of its own namespace).
    pub pid: libc::pid_t,
    pidfd: OwnedFd,
    ctl: Mutex<OwnedFd>,
    /// The layers applied to the zygote, and so to every session child.
    pub layers: Layers,
    /// The zygote's rlimits and write grants, every session child's too: what a child's end
    /// is judged against.
    pub applied: crate::supervise::assemble::Applied,
    pending: Mutex<HashMap<u64, PendingFork>>,
    by_ns_pid: Mutex<HashMap<i32, Arc<SessionShared>>>,
    by_pid: Mutex<HashMap<u32, Arc<SessionShared>>>,
    alive: AtomicBool,
    /// The server is stopping it: its death is expected, not restarted.
    stopping: AtomicBool,
    /// What the zygote reported when ready (preloaded modules, Python version).
    pub ready: std::sync::OnceLock<Ready>,
}

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
        let req = PlanRequest {
            session: false,
            argv,
            grants: cfg.grants.clone(),
            extra_env: {
                let mut env = vec![
                    ("WFJAIL_ZYGOTE_FD".into(), "3".into()),
                    (
                        "WFJAIL_GETRANDOM".into(),
                        policy.random.getrandom.as_str().into(),
                    ),
                ];
                // Each session child's whole life (the zygote takes none: it lives as long as
                // the server); a call's own budget (limits.cpu) is measured by its session.
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
        let plan = plan::build(&policy, &req)?;
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
        let log = super::log_pipe(format!("zygote{index}"), format!("[zygote {index}] "))
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
        let (listener, degraded) = match await_exec(spawned.chan, pid, plan.vdso) {
            Ok(x) => x,
            Err(e) => {
                let _ = sys::pidfd_send_signal(spawned.pidfd.as_fd(), libc::SIGKILL);
                let _ = sys::wait4(pid);
                return Err(e.into());
            }
        };
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
            applied: crate::supervise::assemble::Applied::of(&plan),
            pending: Mutex::new(HashMap::new()),
            by_ns_pid: Mutex::new(HashMap::new()),
            by_pid: Mutex::new(HashMap::new()),
            alive: AtomicBool::new(true),
            stopping: AtomicBool::new(false),
            ready: std::sync::OnceLock::new(),
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
            let grants = WriteGrants::new(&plan.write);
            let late = policy.zygote.reads_after_preload == Toggle::Deny;
            let decisions = plan.decisions.clone();
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
                    z.route_notifications(listener, rules)
                })
                .map_err(ZygoteError::Thread)?;
        }
        if let Err(e) = zygote.check_ready(ready_rx.recv_timeout(READY_TIMEOUT), cfg) {
            zygote.kill();
            return Err(e);
        }
        Ok(zygote)
    }

    /// Whether the zygote that sent `ready` (or none) can serve: it got ready, speaks this
    /// wfjail's control version, preloaded, gives each session a Landlock domain of its own,
    /// and wfjail can see into it.
    fn check_ready(
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

    /// Whether the zygote is still running.
    pub fn alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// Kills the zygote (and, as PID 1 of its namespace, every child).
    pub fn kill(&self) {
        let _ = sys::pidfd_send_signal(self.pidfd.as_fd(), libc::SIGKILL);
    }

    /// Kills the zygote for good (server shutdown): no restart, no death notice.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.kill();
    }

    /// Waits (bounded) until the zygote has exited. The init of a PID namespace exits only
    /// after every process in it is gone, so this also waits for its children.
    pub fn wait_gone(&self, timeout: Duration) {
        let mut fds = [PollFd::new(self.pidfd.as_fd(), PollFlags::POLLIN)];
        let _ = poll(&mut fds, crate::supervise::poll_timeout(timeout));
    }

    /// Asks the zygote to fork a child for `shared`'s session, running `handler` on
    /// `session_end`, with `output` (the session's own pipe) as its stdout and stderr.
    /// Returns the child's pid in the zygote's namespace.
    pub fn fork(
        &self,
        shared: Arc<SessionShared>,
        handler: &str,
        init: Option<&serde_json::Value>,
        session_end: OwnedFd,
        output: OwnedFd,
    ) -> ForkReply {
        if !self.alive() {
            return Err(ForkError::Restarting);
        }
        let (tx, rx) = channel();
        self.pending
            .lock()
            .unwrap()
            .insert(shared.id, (shared.clone(), tx));
        let msg = Fork {
            session: shared.id,
            handler,
            init,
        }
        .to_packet();
        let fds = [session_end.as_raw_fd(), output.as_raw_fd()];
        let sent = {
            let ctl = self.ctl.lock().unwrap();
            let iov = [std::io::IoSlice::new(&msg)];
            sendmsg::<()>(
                ctl.as_raw_fd(),
                &iov,
                &[ControlMessage::ScmRights(&fds)],
                MsgFlags::MSG_NOSIGNAL,
                None,
            )
        };
        drop((session_end, output));
        if let Err(e) = sent {
            self.pending.lock().unwrap().remove(&shared.id);
            return Err(ForkError::Send(e));
        }
        rx.recv_timeout(FORK_WAIT)
            .unwrap_or(Err(ForkError::NoAnswer))
    }

    /// Forgets a finished session.
    pub fn forget(&self, shared: &SessionShared) {
        self.by_ns_pid
            .lock()
            .unwrap()
            .retain(|_, s| s.id != shared.id);
        self.by_pid.lock().unwrap().retain(|_, s| s.id != shared.id);
        self.pending.lock().unwrap().remove(&shared.id);
    }

    /// The global pid of the child with namespace pid `ns_pid`, from the zygote's children.
    pub fn find_child(&self, ns_pid: i32) -> Option<libc::pid_t> {
        let list =
            std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", self.pid)).ok()?;
        list.split_whitespace()
            .filter_map(|p| p.parse::<libc::pid_t>().ok())
            .find(|&p| crate::procfs::ns_pid(p as u32) == Some(ns_pid))
    }

    fn read_control(
        self: Arc<Self>,
        ctl: OwnedFd,
        ready: Sender<Result<Ready, ControlError>>,
        on_death: Arc<dyn Fn(usize) + Send + Sync>,
    ) {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match nix::sys::socket::recv(ctl.as_raw_fd(), &mut buf, MsgFlags::empty()) {
                Ok(0) => break,
                Ok(n) => n,
                Err(Errno::EINTR) => continue,
                Err(_) => break,
            };
            match control::parse(&buf[..n]) {
                Ok(Control::Ready(doc)) => {
                    // A zygote that could not preload exits next: that death is not a restart.
                    if doc.error.is_none() {
                        let _ = self.ready.set(doc.clone());
                    }
                    let _ = ready.send(Ok(doc));
                }
                Ok(Control::Forked(forked)) => {
                    // The child is known by its pid before its FORK stops being in flight:
                    // the router takes "no FORK in flight and no session" to mean a spare
                    // (`await_session`).
                    let mut pending = self.pending.lock().unwrap();
                    let Some((shared, tx)) = pending.remove(&forked.session) else {
                        continue;
                    };
                    let reply = match forked.child {
                        ForkOutcome::Pid { pid } => {
                            self.by_ns_pid.lock().unwrap().insert(pid, shared);
                            Ok(pid)
                        }
                        ForkOutcome::Error { error } => Err(ForkError::Refused(error)),
                    };
                    drop(pending);
                    let _ = tx.send(reply);
                }
                Ok(Control::Exited(exited)) => {
                    let Some(shared) = self.by_ns_pid.lock().unwrap().remove(&exited.pid) else {
                        continue;
                    };
                    self.by_pid.lock().unwrap().retain(|_, s| s.id != shared.id);
                    shared.set_exit(exited.into());
                }
                // Start-up waits for READY: a malformed one fails it at once.
                Err(e) if e.kind() == Some(control::READY) && self.ready.get().is_none() => {
                    let _ = ready.send(Err(e));
                }
                // The zygote runs trusted code only (preload code, wfjail's package): a bad
                // packet is a bug there, said and skipped.
                Err(e) => eprintln!("wfjail: zygote {}: {e}; ignored", self.index),
            }
        }
        // The zygote is gone: so are its children.
        self.alive.store(false, Ordering::SeqCst);
        let status = sys::wait4(self.pid).map(|r| r.status).ok();
        let expected = self.stopping.load(Ordering::SeqCst) || self.ready.get().is_none();
        if !expected {
            eprintln!(
                "wfjail: zygote {} (pid {}) died ({}); its sessions fail and it is restarted",
                self.index,
                self.pid,
                status.map_or("status unknown".into(), describe_status)
            );
        }
        let gone = ChildExit {
            status: None,
            cpu_ms: 0.0,
            max_rss_kb: 0,
        };
        for (_, s) in self.by_ns_pid.lock().unwrap().drain() {
            s.set_exit(gone);
        }
        for (_, (_, tx)) in self.pending.lock().unwrap().drain() {
            let _ = tx.send(Err(ForkError::Died));
        }
        if !expected {
            on_death(self.index);
        }
    }

    /// A child that started its session before the zygote's FORKED reached us: wait for it
    /// (briefly: the zygote sends FORKED right after the hand-over), holding its call.
    fn await_session(&self, pid: u32) -> Option<Arc<SessionShared>> {
        let deadline = Instant::now() + Duration::from_millis(500);
        while Instant::now() < deadline && self.alive() {
            // No FORK in flight: the caller is no session's child (a spare, not handed a
            // session yet), and waiting would not make it one.
            let in_flight = !self.pending.lock().unwrap().is_empty();
            std::thread::sleep(Duration::from_micros(200));
            if let Some(s) = self.session_for(pid) {
                return Some(s);
            }
            if !in_flight {
                return None;
            }
        }
        None
    }

    fn session_for(&self, pid: u32) -> Option<Arc<SessionShared>> {
        if let Some(s) = self.by_pid.lock().unwrap().get(&pid) {
            return Some(s.clone());
        }
        // A session's thread is its process's: the process id (`NStgid`), not the thread's;
        // and a process a session forked (a policy allowing subprocesses) is the session's:
        // up its parents until a session's process, or the zygote.
        let mut task = pid;
        for _ in 0..MAX_SESSION_DEPTH {
            let (ns, parent) = ns_tgid_and_parent(task)?;
            if ns == 1 {
                // The zygote itself (or a thread of it): no session's, and its parent is
                // outside the namespace, where pids are not the sessions'.
                return None;
            }
            if let Some(s) = self.by_ns_pid.lock().unwrap().get(&ns).cloned() {
                self.by_pid.lock().unwrap().insert(pid, s.clone());
                return Some(s);
            }
            if parent == self.pid as u32 || parent <= 1 {
                return None;
            }
            task = parent;
        }
        None
    }

    fn route_notifications(self: Arc<Self>, listener: OwnedFd, rules: notify::Rules<'_>) {
        // The zygote's own virtual monotonic clock (`clock = "virtual"`).
        let mut own_clock = crate::supervise::clock::Monotonic::default();
        // Whether the policy pins a session's pid (`getpid` then reaches the router).
        let pid_pinned = syscalls::number("getpid")
            .and_then(|nr| rules.decisions.get(nr))
            .is_some_and(|d| d.check == Check::Pid);
        let Ok(mut buf) = NotifBuf::new() else { return };
        let mut own = Violations::new(Some(format!("wfjail: zygote {}: ", self.index)));
        loop {
            let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) => {}
                Err(Errno::EINTR) => continue,
                Err(_) => return,
            }
            let rev = fds[0].revents().unwrap_or(PollFlags::empty());
            if !rev.contains(PollFlags::POLLIN) {
                return; // every task under the filter is gone
            }
            let Some(n) = notify::receive(listener.as_fd(), &mut buf) else {
                continue;
            };
            let name = syscalls::name(n.nr as u32).unwrap_or("");
            // Signals: each process may signal itself only (its pid in the namespace).
            if matches!(name, "kill" | "tkill" | "tgkill")
                && n.arch == crate::policy::bpf::AUDIT_ARCH_X86_64
                && (crate::procfs::ns_pid(n.pid) == Some(n.args[0] as i32)
                    || crate::procfs::ns_tgid(n.pid) == Some(n.args[0] as i32))
            {
                // A session's signal to itself costs the router like any answer: a loop of
                // them is a flood its budget stops (the zygote and spares have none).
                if let Some(session) = self.session_for(n.pid)
                    && !session.budget.lock().unwrap().take()
                {
                    notify::over_budget(listener.as_fd(), &n, || {
                        // The task waits on this notification: its pid cannot have been reused.
                        let _ = sys::kill_pid(n.pid as libc::pid_t, libc::SIGKILL);
                    });
                    session.mark_killed();
                    continue;
                }
                notify::allow(listener.as_fd(), &n);
                continue;
            }
            if n.pid == self.pid as u32 {
                // The zygote itself: it forks (only it may), and reads while preloading.
                let fork = matches!(name, "fork" | "vfork")
                    || (name == "clone" && n.args[0] & libc::CLONE_THREAD as u64 == 0);
                if fork && n.arch == crate::policy::bpf::AUDIT_ARCH_X86_64 {
                    notify::allow(listener.as_fd(), &n);
                } else {
                    // Never kill the zygote for its own violation: deny it and say so.
                    let rules = notify::Rules {
                        on_violation: crate::policy::OnViolation::Deny,
                        late_reads: false,
                        ..rules
                    };
                    // While preloading it reads real entropy (the SDK needs randomness at
                    // import), and it waits with a timeout between sessions; sessions get
                    // theirs after the fork. Its clocks read a fixed instant (below).
                    let check = rules.decisions.get(n.nr as u32).map(|d| d.check);
                    if n.arch == crate::policy::bpf::AUDIT_ARCH_X86_64
                        && matches!(
                            check,
                            Some(Check::Seeded | Check::Usage | Check::Pid | Check::TimedWait)
                        )
                    {
                        notify::allow(listener.as_fd(), &n);
                        continue;
                    }
                    // Under `clock = "virtual"` what preloading reads of the wall clock is
                    // [`PRELOAD_INSTANT`], and its monotonic clock is a virtual one of its
                    // own: a module-level `time.time()` in preloaded code gives the same
                    // value in every zygote, as a replay needs.
                    let state = notify::State {
                        violations: &mut own,
                        entropy: None,
                        clock: Some(PRELOAD_INSTANT),
                        monotonic: &mut own_clock,
                        learned: None,
                    };
                    notify::handle(listener.as_fd(), &n, rules, state, || {});
                }
                continue;
            }
            let Some(session) = self
                .session_for(n.pid)
                .or_else(|| self.await_session(n.pid))
            else {
                // A spare, before it has a session: Python reseeds `random` in every forked
                // child. It gets fixed bytes (its session reseeds from its own seed, `_child`
                // in zygote.py) and the real clock; a failing getrandom would make CPython
                // give up on it for the life of the process.
                let check = rules.decisions.get(n.nr as u32).map(|d| d.check);
                if n.arch == crate::policy::bpf::AUDIT_ARCH_X86_64 {
                    if check == Some(Check::Seeded) && !notify::getrandom_flags_valid(n.args[2]) {
                        notify::refuse(listener.as_fd(), &n, libc::EINVAL);
                        continue;
                    }
                    if check == Some(Check::Seeded) {
                        let bytes =
                            crate::supervise::entropy::Entropy::new(0).take(n.args[1] as usize);
                        let ret = bytes.len() as i64;
                        let writes = if ret > 0 {
                            vec![(n.args[0], bytes)]
                        } else {
                            vec![]
                        };
                        notify::respond(
                            listener.as_fd(),
                            &n,
                            notify::Answer::Value { ret, writes },
                        );
                        continue;
                    }
                    if matches!(
                        check,
                        Some(Check::Clock | Check::Usage | Check::Pid | Check::Stat)
                    ) {
                        notify::allow(listener.as_fd(), &n);
                        continue;
                    }
                    if let Some(Check::CpuCount(cpus)) = check {
                        notify::respond(listener.as_fd(), &n, notify::cpu_answer(&n.args, cpus));
                        continue;
                    }
                }
                eprintln!(
                    "wfjail: zygote {}: call from unknown pid {} refused",
                    self.index, n.pid
                );
                notify::refuse(listener.as_fd(), &n, libc::EPERM);
                continue;
            };
            // The router's work for a session is bounded (notify::Budget): a flooding session
            // is killed before it starves its siblings.
            if !session.budget.lock().unwrap().take() {
                notify::over_budget(listener.as_fd(), &n, || {
                    // The task waits on this notification: its pid cannot have been reused.
                    let _ = sys::kill_pid(n.pid as libc::pid_t, libc::SIGKILL);
                });
                session.mark_killed();
                continue;
            }
            let mut v = session.violations.lock().unwrap();
            let mut det = session.determinism.lock().unwrap();
            // Its pid, once it runs its session: the same in every session (`getpid` reaches
            // the supervisor only when the policy pins it), and a signal to that pid is a
            // signal to itself, sent for it.
            let native = n.arch == crate::policy::bpf::AUDIT_ARCH_X86_64;
            let check = rules.decisions.get(n.nr as u32).map(|d| d.check);
            if native && det.armed && check == Some(Check::Pid) {
                drop((v, det));
                let answer = notify::Answer::Value {
                    ret: SESSION_PID as i64,
                    writes: vec![],
                };
                notify::respond(listener.as_fd(), &n, answer);
                continue;
            }
            if native
                && det.armed
                && matches!(name, "kill" | "tkill" | "tgkill")
                && pid_pinned
                && n.args[0] as i32 == SESSION_PID
                && (name != "tgkill"
                    || n.args[1] as i32 == SESSION_PID
                    || crate::procfs::ns_pid(n.pid) == Some(n.args[1] as i32))
            {
                drop((v, det));
                let sig = if name == "tgkill" {
                    n.args[2]
                } else {
                    n.args[1]
                };
                // The caller waits on this notification: its pid cannot have been reused.
                let answer = match sys::kill_pid(n.pid as libc::pid_t, sig as i32) {
                    Ok(()) => notify::Answer::Value {
                        ret: 0,
                        writes: vec![],
                    },
                    Err(e) => notify::Answer::Errno(e.raw_os_error().unwrap_or(libc::EINVAL)),
                };
                notify::respond(listener.as_fd(), &n, answer);
                continue;
            }
            let det_now = &mut *det;
            let clock = det_now.clock;
            let mut unarmed = crate::supervise::entropy::Entropy::new(0);
            // Before HELLO a spare's clock reads do not move its session's monotonic clock.
            let mut unarmed_clock = crate::supervise::clock::Monotonic::default();
            let (entropy, monotonic) = if det_now.armed {
                (det_now.entropy.as_mut(), &mut det_now.monotonic)
            } else {
                (
                    det_now.entropy.as_mut().map(|_| &mut unarmed),
                    &mut unarmed_clock,
                )
            };
            let state = notify::State {
                violations: &mut v,
                entropy,
                clock,
                monotonic,
                learned: None,
            };
            let killed = notify::handle(listener.as_fd(), &n, rules, state, || {
                // The task waits on this notification: its pid cannot have been reused.
                let _ = sys::kill_pid(n.pid as libc::pid_t, libc::SIGKILL);
            });
            drop((v, det));
            if killed == notify::Handled::Killed {
                session.mark_killed();
            }
        }
    }
}

/// Whether wfjail can read what it needs of process `pid` (its cwd link, its maps, a byte of
/// its memory), the way it does for a session child's calls.
fn inspectable(pid: libc::pid_t) -> Result<(), InspectError> {
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

/// The wall-clock time a zygote reads while it preloads, under `clock = "virtual"`:
/// 2000-01-01T00:00:00Z. Code imported there runs before any session has a workflow time; a
/// fixed instant makes what it computes at import the same in every zygote and every replay.
pub const PRELOAD_INSTANT: i64 = 946_684_800_000_000_000;

/// The pid a session reads (`getpid`) when the policy pins it (`clock = "virtual"`): the
/// highest pid Linux can give (`PID_MAX_LIMIT - 1`), so that it is no other process's in
/// the namespace the sessions share: a signal to it from a session is a signal to itself,
/// and it shadows no sibling (nor the zygote, pid 1, whose signals stay refused and
/// reported). A `wfjail run` guest and an exec-mode session are pid 1 of their own
/// namespace.
pub const SESSION_PID: i32 = 4_194_303;

/// How many parents up from a caller a session's process is looked for (a session's
/// processes are bounded by `limits.processes`; a deeper chain is no session's).
const MAX_SESSION_DEPTH: usize = 64;

/// The process id of global task `tid` in its own PID namespace (`NStgid`), and the global
/// pid of its parent process (`PPid`).
fn ns_tgid_and_parent(tid: u32) -> Option<(i32, u32)> {
    let status = crate::procfs::Status::of(tid)?;
    Some((
        status.innermost("NStgid")? as i32,
        status.innermost("PPid")? as u32,
    ))
}

/// "exit 1", "killed by SIGKILL".
pub fn describe_status(status: i32) -> String {
    if libc::WIFEXITED(status) {
        format!("exit {}", libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        format!(
            "killed by {}",
            crate::report::signal_name(libc::WTERMSIG(status))
        )
    } else {
        format!("status {status}")
    }
}

/// How long a zygote may take from `clone` to its exec.
const EXEC_WITHIN: Duration = Duration::from_secs(30);

/// Waits until a freshly spawned zygote has exec'd: set-up records, the listener, and the
/// initial exec notification (supervise/startup.rs). Once the exec is let through, the
/// listener is left alone: what comes next is the zygote's, for its router. Returns the
/// listener (if any) and the degraded steps.
pub fn await_exec(
    chan: OwnedFd,
    pid: libc::pid_t,
    vdso: Option<crate::supervise::vdso::Patch>,
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
