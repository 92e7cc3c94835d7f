//! `wfjail serve`: a worker-facing supervisor. It starts the worker command unconfined, serves
//! sessions on a Unix socket (the worker wire, docs/protocol.md), and runs each session's
//! guest confined: forked from a preloaded zygote (`--zygote`), or exec'd fresh (exec mode).
//!
//! Threads: the main thread accepts connections, watches the worker and the signals, and
//! (re)starts zygotes; one thread per session (which also reads its guest's output); three
//! per zygote (control, notifications, the zygote's own output).

pub mod control;
pub mod launch;
pub mod metrics;
pub mod phases;
pub mod pid_answers;
pub mod route;
pub mod session;
pub mod threads;
pub mod waits;
pub mod worker_conn;
pub mod zygote;

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use crate::echo::LineEcho;
use crate::notify::violations::Violations;
use crate::plan::ExtraGrant;
use crate::policy::Policy;
use crate::sys;
use zygote::{ChildExit, Zygote, ZygoteConfig, ZygoteError};

/// What `wfjail serve` was asked to do.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub socket: Option<PathBuf>,
    /// At most this many sessions at once; further OPENs wait for a slot.
    pub max_executions: usize,
    /// Prefork mode, with this many zygotes.
    pub zygote: Option<(ZygoteConfig, usize)>,
    pub grants: Vec<ExtraGrant>,
    /// Per-call wall-clock limit (default: the policy's `limits.timeout`).
    pub timeout: Option<Duration>,
    /// The worker command; empty: serve the socket alone until SIGTERM/SIGINT.
    pub worker: Vec<String>,
    /// End when wfjail's parent process ends.
    pub exit_with_parent: bool,
    /// Print violations and guest logs on stderr.
    pub echo: bool,
    /// Where to keep the counters (Prometheus text), rewritten every second.
    pub metrics: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(
        "no worker command and no --socket: give the worker command after `--`, or serve a \
         socket the worker knows with --socket PATH"
    )]
    NoWorker,
    #[error(
        "policy {0} sets limits.disk, which `wfjail run` enforces but `serve` cannot: its \
         sessions share their write grants, so one session's account would hold its siblings' \
         writes; remove limits.disk from the policy serve uses (or give it a directory on a \
         file system with a size limit, such as a tmpfs with size=)"
    )]
    DiskLimit(String),
    #[error("socket {path}: {source}")]
    Socket {
        path: String,
        source: std::io::Error,
    },
    #[error("starting zygote {index}: {source}")]
    Zygote { index: usize, source: ZygoteError },
    #[error("starting the worker `{cmd}`: {source}")]
    Worker { cmd: String, source: std::io::Error },
    #[error("blocking signals: {0}")]
    BlockSignals(#[source] Errno),
    #[error("signalfd: {0}")]
    SignalFd(#[source] Errno),
    /// The listening socket could not be made non-blocking.
    #[error("{0}")]
    Nonblocking(#[source] std::io::Error),
    #[error("pipe: {0}")]
    Pipe(#[source] Errno),
    #[error("pidfd_open: {0}")]
    WorkerPidfd(#[source] std::io::Error),
    #[error("poll: {0}")]
    Poll(#[source] Errno),
    #[error("waiting for the worker: {0}")]
    WaitWorker(#[source] std::io::Error),
}

impl ServeError {
    /// wfjail's exit status for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            ServeError::NoWorker | ServeError::DiskLimit(_) | ServeError::Socket { .. } => 2,
            ServeError::Worker { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                127
            }
            ServeError::Worker { .. } => 126,
            ServeError::Zygote { .. }
            | ServeError::BlockSignals(_)
            | ServeError::SignalFd(_)
            | ServeError::Nonblocking(_)
            | ServeError::Pipe(_)
            | ServeError::WorkerPidfd(_)
            | ServeError::Poll(_)
            | ServeError::WaitWorker(_) => 125,
        }
    }
}

/// The `--max-executions` session slots. A session takes one from its OPEN until its CLOSE
/// is taken (the guest's input ended); an OPEN that finds none is answered BUSY at once (a
/// worker thread must never hang on it). A closed guest that has not exited yet (it has
/// `EXIT_GRACE`) is no longer a session: it lingers, holding no slot, among at most as many
/// lingering guests as there are slots; a guest closed when that many linger takes the place
/// of the one that has lingered longest, which is killed (honest guests exit within
/// milliseconds of their close: the oldest is the one that does not).
pub struct Slots {
    counts: Arc<Mutex<Counts>>,
    capacity: usize,
}

#[derive(Default)]
struct Counts {
    free: usize,
    /// The lingering guests' sessions, oldest first.
    lingering: std::collections::VecDeque<Arc<SessionShared>>,
}

impl Slots {
    fn new(n: usize) -> Self {
        Slots {
            counts: Arc::new(Mutex::new(Counts {
                free: n.max(1),
                lingering: Default::default(),
            })),
            capacity: n.max(1),
        }
    }

    /// A free slot, released when the guard drops; `None` when every slot is taken.
    pub fn try_acquire(&self) -> Option<SlotGuard> {
        let mut c = self.counts.lock().unwrap();
        if c.free == 0 {
            return None;
        }
        c.free -= 1;
        Some(SlotGuard {
            counts: self.counts.clone(),
            capacity: self.capacity,
            lingering: None,
        })
    }

    /// `--max-executions`.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Sessions holding a slot now.
    pub fn open(&self) -> usize {
        self.capacity - self.counts.lock().unwrap().free
    }

    /// Closed guests not exited yet (at most `capacity`).
    pub fn lingering(&self) -> usize {
        self.counts.lock().unwrap().lingering.len()
    }
}

/// A session's slot, then (`linger`) its closed guest's place among the lingering.
pub struct SlotGuard {
    counts: Arc<Mutex<Counts>>,
    capacity: usize,
    lingering: Option<Arc<SessionShared>>,
}

impl SlotGuard {
    /// The session was closed and its guest has not exited: the slot is freed and the guest
    /// lingers. With `capacity` guests lingering already, the oldest of them is told to end
    /// (`SessionShared::displaced`) and loses its place.
    pub fn linger(&mut self, shared: &Arc<SessionShared>) {
        if self.lingering.is_some() {
            return;
        }
        let mut c = self.counts.lock().unwrap();
        if c.lingering.len() >= self.capacity
            && let Some(oldest) = c.lingering.pop_front()
        {
            oldest.displace(self.capacity);
        }
        c.lingering.push_back(shared.clone());
        c.free += 1;
        self.lingering = Some(shared.clone());
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let mut c = self.counts.lock().unwrap();
        match &self.lingering {
            // Gone already if it was displaced.
            Some(me) => c.lingering.retain(|s| !Arc::ptr_eq(s, me)),
            None => c.free += 1,
        }
    }
}

/// What a session child's notifications and exit are delivered to, from other threads.
pub struct SessionShared {
    pub id: u64,
    pub violations: Mutex<Violations>,
    /// The session's workflow time and seeded stream, read by whoever answers its
    /// notifications (the session's loop, or its zygote's router).
    pub determinism: Mutex<Determinism>,
    /// The supervisor's work for this session, bounded (`notify::Budget`): charged by whoever
    /// answers its notifications.
    pub budget: Mutex<crate::notify::Budget>,
    exit: Mutex<Option<ChildExit>>,
    killed: AtomicBool,
    /// Its lingering guest lost its place to a newer one, when this many lingered (0: not).
    displaced: AtomicU64,
    /// Written when `exit` is set; the session thread polls the other end.
    wake_w: OwnedFd,
    pub wake_r: OwnedFd,
}

/// A session's answers under `[time] clock = "virtual"` and `[random] getrandom = "seeded"`.
#[derive(Debug, Default)]
pub struct Determinism {
    /// The workflow time (nanoseconds since the epoch): OPEN's `time_ns`, then each TIME's.
    pub clock: Option<i64>,
    /// The stream keyed by OPEN's `seed`.
    pub entropy: Option<crate::answers::entropy::Entropy>,
    /// The seed it was keyed by, for the report.
    pub seed: Option<u64>,
    /// The session's virtual monotonic clock (`clock = "virtual"`).
    pub monotonic: crate::answers::monotonic::Monotonic,
    /// The inode numbers its pipes and sockets read (`clock = "virtual"`).
    pub inodes: crate::answers::filetimes::Inodes,
    /// The guest has said HELLO: its `getrandom` draws from `entropy`. Before (a zygote's
    /// child between its fork and its session), fixed bytes: how much it drew then depends
    /// on timing (whether a spare was ready), which must not shift the session's stream.
    pub armed: bool,
    /// The child has left the fork: the zygote's code in it said so (a zero-length
    /// `getrandom`, first thing in `_child` of zygote.py) before any of the session's code.
    /// Before, its draws are the fork machinery's (CPython reseeds `random` in every forked
    /// child), made before or after the zygote's FORKED registered it as whether a spare was
    /// ready decides: fixed bytes under every policy, never a violation.
    pub begun: bool,
    /// The router answered its pinned pid once and tried to have the guest answer it itself
    /// (`answers/guest_pid.rs`): tried once per session.
    pub pid_in_guest_tried: bool,
}

impl Determinism {
    /// What a session of `policy` opened with `seed` and `time_ns` starts with.
    pub fn new(policy: &crate::policy::Policy, seed: Option<u64>, time_ns: Option<i64>) -> Self {
        let seeded = crate::policy::rules::getrandom::answered(policy);
        let virtual_clock = crate::policy::rules::clock::answered(policy);
        let seed = seeded.then(|| seed.unwrap_or(0));
        Determinism {
            clock: virtual_clock.then(|| time_ns.unwrap_or_else(crate::workflow_time::host_now)),
            entropy: seed.map(crate::answers::entropy::Entropy::new),
            seed,
            monotonic: Default::default(),
            inodes: Default::default(),
            armed: false,
            begun: false,
            pid_in_guest_tried: false,
        }
    }
}

impl SessionShared {
    pub fn new(id: u64, echo: bool) -> std::io::Result<Arc<Self>> {
        let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)?;
        Ok(Arc::new(SessionShared {
            id,
            violations: Mutex::new(Violations::new(
                echo.then(|| format!("wfjail: session {id}: ")),
            )),
            determinism: Mutex::new(Determinism::default()),
            budget: Mutex::new(Default::default()),
            exit: Mutex::new(None),
            killed: AtomicBool::new(false),
            displaced: AtomicU64::new(0),
            wake_w: w,
            wake_r: r,
        }))
    }

    /// Records how the child ended and wakes the session thread.
    pub fn set_exit(&self, e: ChildExit) {
        *self.exit.lock().unwrap() = Some(e);
        let _ = nix::unistd::write(&self.wake_w, b"x");
    }

    pub fn exit(&self) -> Option<ChildExit> {
        *self.exit.lock().unwrap()
    }

    /// The policy killed the child for a violation.
    pub fn mark_killed(&self) {
        self.killed.store(true, Ordering::SeqCst);
    }

    pub fn killed(&self) -> bool {
        self.killed.load(Ordering::SeqCst)
    }

    /// Its lingering guest must end: a newer closed guest takes its place among the
    /// `lingering`. Wakes the session thread.
    fn displace(&self, lingering: usize) {
        self.displaced.store(lingering as u64, Ordering::SeqCst);
        let _ = nix::unistd::write(&self.wake_w, b"d");
    }

    /// How many guests lingered when this one was displaced, if it was.
    pub fn displaced(&self) -> Option<usize> {
        match self.displaced.load(Ordering::SeqCst) {
            0 => None,
            n => Some(n as usize),
        }
    }
}

/// The zygotes of a prefork server; a dead one is replaced by the main thread.
pub struct Pool {
    pub config: ZygoteConfig,
    zygotes: Mutex<Vec<Option<Arc<Zygote>>>>,
    next: AtomicU64,
    /// When each zygote was last restarted.
    restarted: Mutex<std::collections::HashMap<usize, std::time::Instant>>,
}

impl Pool {
    /// A live zygote, round-robin.
    pub fn pick(&self) -> Option<Arc<Zygote>> {
        let list = self.zygotes.lock().unwrap();
        let n = list.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) as usize;
        (0..n)
            .map(|i| (start + i) % n)
            .find_map(|i| list[i].clone().filter(|z| z.alive()))
    }
}

/// Shared by every session thread.
pub struct Server {
    pub policy: Arc<Policy>,
    pub pool: Option<Pool>,
    pub grants: Vec<ExtraGrant>,
    pub timeout: Option<Duration>,
    pub slots: Slots,
    pub echo: bool,
    /// Sessions, calls and violations, counted (`metrics.rs`).
    pub metrics: metrics::Metrics,
    next_id: AtomicU64,
    /// Exec-mode children, killed at shutdown (zygote children die with their zygote).
    pub children: Mutex<std::collections::HashMap<u64, Arc<OwnedFd>>>,
}

impl Server {
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The counters, and the slots' gauges, as Prometheus text.
    pub fn render_metrics(&self) -> String {
        self.metrics
            .render_with_gauges(self.slots.open(), self.slots.lingering())
    }
}

/// How long to stop accepting after `accept` failed (out of descriptors).
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// Raises this process's open-file soft limit to its hard limit: each session holds a few
/// descriptors, and the usual soft limit (1024) would stop a server near 200 sessions.
fn raise_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
    {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}

/// A pipe whose write end becomes the zygote's stdout and stderr; a thread copies what comes
/// out to wfjail's stderr, each line behind `prefix`. Guests never get wfjail's own stderr:
/// an inherited descriptor escapes Landlock, and a terminal or log file behind it could be
/// read or truncated. (Sessions have a pipe each, read by the session thread.)
pub fn log_pipe(name: String, prefix: String) -> std::io::Result<OwnedFd> {
    let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    std::thread::Builder::new()
        .name(format!("{name}-log"))
        .spawn(move || {
            let mut file = std::fs::File::from(r);
            let mut lines = LineEcho::new(prefix);
            let mut stderr = std::io::stderr();
            let mut buf = [0u8; 16 * 1024];
            loop {
                match std::io::Read::read(&mut file, &mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        let _ = std::io::Write::write_all(&mut stderr, &lines.feed(&buf[..n]));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            let _ = std::io::Write::write_all(&mut stderr, &lines.finish());
        })?;
    Ok(w)
}

/// The default socket path: under `$XDG_RUNTIME_DIR` or the temp dir, named after our pid.
fn default_socket() -> PathBuf {
    let dir = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    dir.join(format!("wfjail-{}.sock", std::process::id()))
}

/// Runs the server until the worker exits; returns the worker's exit status. Without a
/// worker command, until SIGTERM or SIGINT (or the parent's end, with `exit_with_parent`);
/// then 0.
pub fn serve(policy: Policy, opts: ServeOptions) -> Result<i32, ServeError> {
    if opts.worker.is_empty() && opts.socket.is_none() {
        return Err(ServeError::NoWorker);
    }
    if policy.limits.disk.is_some() {
        return Err(ServeError::DiskLimit(policy.name.clone()));
    }
    // The parent first, before it can go: a pidfd that becomes readable when it exits.
    let parent = if opts.exit_with_parent {
        Some(sys::pidfd_open(nix::unistd::getppid().as_raw()).map_err(ServeError::WorkerPidfd)?)
    } else {
        None
    };
    raise_fd_limit();
    // Signals arrive on a signalfd; block them first so every thread inherits the mask.
    let mut mask = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        mask.add(s);
    }
    mask.thread_block().map_err(ServeError::BlockSignals)?;
    let sfd = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .map_err(ServeError::SignalFd)?;

    let path = opts.socket.clone().unwrap_or_else(default_socket);
    if path.exists() {
        // A stale socket of ours is replaced; anything else is left alone.
        use std::os::unix::fs::FileTypeExt;
        let stale = std::fs::symlink_metadata(&path)
            .map(|m| m.file_type().is_socket())
            .unwrap_or(false)
            && std::os::unix::net::UnixStream::connect(&path).is_err();
        if !stale {
            return Err(ServeError::Socket {
                path: path.display().to_string(),
                source: std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    "exists (another server?)",
                ),
            });
        }
        let _ = std::fs::remove_file(&path);
    }
    let listener = UnixListener::bind(&path).map_err(|source| ServeError::Socket {
        path: path.display().to_string(),
        source,
    })?;
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600));
    }
    listener
        .set_nonblocking(true)
        .map_err(ServeError::Nonblocking)?;
    let _unlink = Unlink(path.clone());

    let policy = Arc::new(policy);
    let (restart_r, restart_w) =
        nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).map_err(ServeError::Pipe)?;
    let restart_w = Arc::new(restart_w);
    let on_death: Arc<dyn Fn(usize) + Send + Sync> = {
        let w = restart_w.clone();
        Arc::new(move |i: usize| {
            let _ = nix::unistd::write(&*w, &[i as u8]);
        })
    };
    // Zygote 0 is started here: the server serves once it is ready. The others start once it
    // has settled, on a thread of their own (`start_the_other_zygotes`), so that a server of
    // N zygotes is ready as soon as one has preloaded, not N preloads later; sessions go to
    // those ready.
    let pool = match &opts.zygote {
        Some((cfg, count)) => {
            let z = Zygote::start(0, policy.clone(), cfg, on_death.clone())
                .map_err(|source| ServeError::Zygote { index: 0, source })?;
            announce_zygote(&z, opts.echo);
            let mut list = vec![Some(z)];
            list.resize((*count).max(1), None);
            Some(Pool {
                config: cfg.clone(),
                zygotes: Mutex::new(list),
                next: AtomicU64::new(0),
                restarted: Mutex::new(std::collections::HashMap::new()),
            })
        }
        None => None,
    };
    let server = Arc::new(Server {
        policy: policy.clone(),
        pool,
        grants: opts.grants.clone(),
        timeout: opts.timeout.or(policy.limits.timeout.map(|d| d.0)),
        slots: Slots::new(opts.max_executions),
        echo: opts.echo,
        metrics: metrics::Metrics::default(),
        next_id: AtomicU64::new(0),
        children: Mutex::new(std::collections::HashMap::new()),
    });
    start_the_other_zygotes(&server, &on_death);

    // Its directory opened once: every write is beneath it, by a name of its own.
    let metrics_file = opts.metrics.as_ref().and_then(|path| {
        metrics::MetricsFile::open(path)
            .map_err(|e| eprintln!("wfjail: --metrics {}: {e}; not written", path.display()))
            .ok()
            .map(|f| (path.clone(), Arc::new(f)))
    });
    if let Some((path, file)) = metrics_file.clone() {
        // Readable while the server runs; the last write is at shutdown.
        let s = server.clone();
        let _ = std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || {
                loop {
                    if let Err(e) = file.write(&s.render_metrics()) {
                        eprintln!(
                            "wfjail: --metrics {}: {e}; not written again",
                            path.display()
                        );
                        return;
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
            });
    }

    // The worker, unconfined: it must reach its server.
    let mut worker = match opts.worker.split_first() {
        Some((cmd, args)) => {
            let mut worker = std::process::Command::new(cmd);
            worker.args(args).env("WFJAIL_SOCKET", &path);
            sys::unblock_signals_on_exec(&mut worker);
            let worker = worker.spawn().map_err(|source| ServeError::Worker {
                cmd: opts.worker.join(" "),
                source,
            })?;
            let pidfd =
                sys::pidfd_open(worker.id() as libc::pid_t).map_err(ServeError::WorkerPidfd)?;
            Some((worker, pidfd))
        }
        None => {
            if opts.echo {
                eprintln!("wfjail: serving {} (no worker command)", path.display());
            }
            None
        }
    };

    let mut terminating: Option<std::time::Instant> = None;
    let mut paused: Option<std::time::Instant> = None;
    let mut warned_accept = false;
    let session_threads = threads::SessionThreads::default();
    // A descriptor held in reserve, released to accept (and refuse) a session when none is left.
    let mut spare_fd = std::fs::File::open("/dev/null").ok();
    let status = loop {
        let mut fds = vec![
            PollFd::new(listener.as_fd(), PollFlags::POLLIN),
            PollFd::new(sfd.as_fd(), PollFlags::POLLIN),
            PollFd::new(restart_r.as_fd(), PollFlags::POLLIN),
        ];
        if let Some((_, pidfd)) = &worker {
            fds.push(PollFd::new(pidfd.as_fd(), PollFlags::POLLIN));
        }
        if let Some(p) = &parent {
            fds.push(PollFd::new(p.as_fd(), PollFlags::POLLIN));
        }
        let timeout = if terminating.is_some() || paused.is_some() {
            PollTimeout::from(ACCEPT_PAUSE.as_millis() as u16)
        } else {
            PollTimeout::NONE
        };
        match poll(&mut fds, timeout) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => return Err(ServeError::Poll(e)),
        }
        let ready = |i: usize| {
            fds.get(i)
                .is_some_and(|f| f.revents().is_some_and(|r| !r.is_empty()))
        };
        let (accept, signalled, restart) = (ready(0), ready(1), ready(2));
        let exited = worker.is_some() && ready(3);
        let parent_gone = parent.is_some() && ready(if worker.is_some() { 4 } else { 3 });
        drop(fds);
        if let Some((w, _)) = worker.as_mut()
            && exited
        {
            let status = w.wait().map_err(ServeError::WaitWorker)?;
            use std::os::unix::process::ExitStatusExt;
            break status
                .code()
                .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
        }
        if parent_gone {
            if opts.echo {
                eprintln!("wfjail: the process that started wfjail ended: stopping");
            }
            if let Some((_, pidfd)) = &worker {
                let _ = sys::pidfd_send_signal(pidfd.as_fd(), libc::SIGKILL);
            }
            break 0;
        }
        if signalled {
            while let Ok(Some(info)) = sfd.read_signal() {
                let Some((_, pidfd)) = &worker else {
                    if opts.echo {
                        eprintln!("wfjail: signal {}: stopping", info.ssi_signo);
                    }
                    break;
                };
                if terminating.is_none() {
                    if opts.echo {
                        eprintln!("wfjail: signal {}: stopping the worker", info.ssi_signo);
                    }
                    let _ = sys::pidfd_send_signal(pidfd.as_fd(), libc::SIGTERM);
                    terminating = Some(std::time::Instant::now());
                }
            }
            if worker.is_none() {
                break 0;
            }
        }
        if let Some(t) = terminating
            && t.elapsed() > Duration::from_secs(10)
            && let Some((_, pidfd)) = &worker
        {
            let _ = sys::pidfd_send_signal(pidfd.as_fd(), libc::SIGKILL);
        }
        if restart {
            let mut b = [0u8; 16];
            while let Ok(n) = nix::unistd::read(&restart_r, &mut b) {
                if n == 0 {
                    break;
                }
                for &i in &b[..n] {
                    restart_zygote(&server, i as usize, &on_death);
                }
            }
        }
        if accept && paused.is_none_or(|t| t.elapsed() > ACCEPT_PAUSE) {
            paused = None;
            loop {
                match listener.accept() {
                    Ok((conn, _)) => {
                        // A thread that cannot start drops its closure, and with it the
                        // connection, which then answers FAILED (`owe`): the worker hears why
                        // instead of finding its OPEN reset.
                        let mut client = worker_conn::WorkerConn::new(conn);
                        client.owe(session::failure_doc(
                            &server,
                            "wfjail cannot start a thread for this session (out of memory or \
                             threads: its stderr says which); lower --max-executions or give \
                             the server more room"
                                .into(),
                        ));
                        let server = server.clone();
                        let spawned =
                            session_threads.run(Box::new(move || session::run(client, server)));
                        if let Err(e) = spawned {
                            eprintln!("wfjail: cannot start a session thread: {e}");
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        // Out of descriptors: give the spare one back, take the connection and
                        // tell the worker why, rather than leave it waiting in the backlog.
                        let why = format!(
                            "wfjail cannot open another session: {e}; raise `ulimit -n` or lower --max-executions"
                        );
                        if !warned_accept {
                            eprintln!("wfjail: {why}");
                            warned_accept = true;
                        }
                        drop(spare_fd.take());
                        if let Ok((conn, _)) = listener.accept() {
                            session::refuse(conn, &server, why);
                        }
                        spare_fd = std::fs::File::open("/dev/null").ok();
                        paused = Some(std::time::Instant::now());
                        break;
                    }
                }
            }
        }
    };
    shutdown(&server);
    if let Some((_, file)) = &metrics_file {
        let _ = file.write(&server.render_metrics());
    }
    if opts.echo {
        eprintln!("{}", server.metrics.summary());
    }
    Ok(status)
}

/// How long the other zygotes' start waits for zygote 0 to settle (one of an older package
/// never says SETTLED; one with a heap of millions of objects takes seconds).
const SETTLED_WAIT: Duration = Duration::from_secs(10);

/// Says that zygote `z` is ready (`-v`), and, for the first, what its sessions run without.
fn announce_zygote(z: &Zygote, echo: bool) {
    if !echo {
        return;
    }
    eprintln!(
        "wfjail: zygote {} ready (pid {}): {}",
        z.index,
        z.pid,
        z.ready
            .get()
            .and_then(|r| serde_json::to_string(r).ok())
            .unwrap_or_default()
    );
    // As `run`'s summary line does: what the sessions will run without.
    if z.index == 0 && !z.layers.degraded.is_empty() {
        let names: Vec<&str> = z
            .layers
            .degraded
            .iter()
            .map(|d| d.split(':').next().unwrap_or(d))
            .collect();
        eprintln!(
            "wfjail: sessions run without {} (each session's report says why under layers.degraded; see `wfjail check`)",
            names.join(", ")
        );
    }
}

/// Starts zygotes 1.. of the pool, one after the other, once zygote 0 has settled (its heap
/// marked and collapsed after its first sessions: SETTLED), so that neither competes with
/// the first sessions for the CPUs; on a thread that then lives as long as the server (a
/// zygote's parent-death signal is tied to the thread that started it). One that cannot
/// start is said and its slot left empty: the others serve.
fn start_the_other_zygotes(server: &Arc<Server>, on_death: &Arc<dyn Fn(usize) + Send + Sync>) {
    let Some(pool) = &server.pool else { return };
    let count = pool.zygotes.lock().unwrap().len();
    if count < 2 {
        return;
    }
    let (server, on_death) = (server.clone(), on_death.clone());
    let spawned = std::thread::Builder::new()
        .name("wfjail-zygotes".into())
        .spawn(move || {
            let Some(pool) = &server.pool else { return };
            let first = pool.zygotes.lock().unwrap().first().cloned().flatten();
            if let Some(z) = first {
                z.wait_settled(SETTLED_WAIT);
            }
            for i in 1..count {
                match Zygote::start(i, server.policy.clone(), &pool.config, on_death.clone()) {
                    Ok(z) => {
                        announce_zygote(&z, server.echo);
                        // A restart of this slot (its zygote died as it became ready) that
                        // came first keeps its own.
                        if let Some(slot) = pool.zygotes.lock().unwrap().get_mut(i)
                            && slot.is_none()
                        {
                            *slot = Some(z);
                        }
                    }
                    Err(e) => eprintln!("wfjail: zygote {i} could not be started: {e}"),
                }
            }
            loop {
                std::thread::park();
            }
        });
    if let Err(e) = spawned {
        eprintln!(
            "wfjail: cannot start a thread for zygotes 1 to {count}: {e}; zygote 0 serves alone"
        );
    }
}

/// Replaces dead zygote `i` (from the main thread, so that the new zygote's parent-death
/// signal is tied to a thread that lives as long as the server).
fn restart_zygote(server: &Server, i: usize, on_death: &Arc<dyn Fn(usize) + Send + Sync>) {
    let Some(pool) = &server.pool else { return };
    // A zygote that keeps dying is restarted at most once a second.
    {
        let mut last = pool.restarted.lock().unwrap();
        if let Some(t) = last.get(&i) {
            let since = t.elapsed();
            if since < Duration::from_secs(1) {
                std::thread::sleep(Duration::from_secs(1) - since);
            }
        }
        last.insert(i, std::time::Instant::now());
    }
    if let Some(slot) = pool.zygotes.lock().unwrap().get_mut(i) {
        *slot = None;
    }
    match Zygote::start(i, server.policy.clone(), &pool.config, on_death.clone()) {
        Ok(z) => {
            server.metrics.zygote_restarted();
            eprintln!("wfjail: zygote {i} restarted (pid {})", z.pid);
            if let Some(slot) = pool.zygotes.lock().unwrap().get_mut(i) {
                *slot = Some(z);
            }
        }
        Err(e) => eprintln!("wfjail: zygote {i} could not be restarted: {e}"),
    }
}

/// Ends every guest: exec-mode children by their pidfds, zygotes (and so their children).
fn shutdown(server: &Server) {
    for (_, fd) in server.children.lock().unwrap().drain() {
        let _ = sys::pidfd_send_signal(fd.as_fd(), libc::SIGKILL);
    }
    if let Some(pool) = &server.pool {
        let zygotes: Vec<Arc<Zygote>> = pool
            .zygotes
            .lock()
            .unwrap()
            .iter()
            .flatten()
            .cloned()
            .collect();
        for z in &zygotes {
            z.stop();
        }
        for z in &zygotes {
            z.wait_gone(Duration::from_secs(5));
        }
    }
    let _ = std::io::Write::flush(&mut std::io::stderr());
}

/// Removes the socket file when the server ends.
struct Unlink(PathBuf);

impl Drop for Unlink {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
