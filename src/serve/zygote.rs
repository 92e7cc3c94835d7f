//! The prefork zygote: a confined Python process (`python -m wfjail.zygote`) that preloaded
//! the workflow code and forks one child per session, copy-on-write.
//!
//! Threads per zygote: a control reader (READY, FORKED, EXITED from the zygote;
//! `zygote/reader.rs`) and a notification router. Its start (spawn, exec, READY checked) is
//! `zygote/start.rs`. Every task under the zygote's filter notifies the same listener, so
//! the router decides by pid: the zygote's own `clone` (fork) is let through — only the zygote
//! may fork — and so are the threads it and its threads start (a preloaded module's, by
//! `Tgid`), while a child's notification is judged under the full policy and recorded in its
//! session (`route.rs` has the rules).
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
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
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

use crate::notify;
use crate::notify::paths::Grants;
use crate::notify::violations::Violations;
use crate::plan::{self, ExtraGrant, PlanError, PlanRequest};
use crate::policy::decisions::Check;
use crate::policy::syscalls;
use crate::policy::{Policy, Toggle};
use crate::process::channel as chan;
use crate::process::{self, SpawnError, Spawned};
use crate::report::Layers;
use crate::supervise::startup::{ChanRead, Driver, Listened, StartupError};
use crate::sys::{self, NotifBuf};

mod reader;
mod start;

pub use reader::{ChildExit, describe_status};
pub use start::{InspectError, ZygoteError, await_exec};

use super::SessionShared;
use super::control::{
    self, CONTROL_VERSION, Control, ControlError, Exited, Fork, ForkOutcome, NoDomain, Ready,
};
use super::route;

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
    /// Opt the zygote and its children into same-page merging (`--merge-pages`).
    pub merge: bool,
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
    /// Written (one byte) when what decides a held call changes (a child registered by its
    /// FORKED, a FORK no longer in flight, the zygote's death): the router, polling its read
    /// end beside the listener, looks again at the calls it holds ([`Held`]).
    registered: (OwnedFd, OwnedFd),
    alive: AtomicBool,
    /// The server is stopping it: its death is expected, not restarted.
    stopping: AtomicBool,
    /// What the zygote reported when ready (preloaded modules, Python version).
    pub ready: std::sync::OnceLock<Ready>,
    /// What the zygote reported when its work after READY was done (SETTLED).
    pub settled: std::sync::OnceLock<control::Settled>,
    /// Notified when `settled` is set or the zygote dies ([`Zygote::wait_settled`]).
    settling: (Mutex<()>, std::sync::Condvar),
    /// Where its C library's `getpid` and `gettid` start (its sessions' too), found at the
    /// first session whose pinned pid the router answers; `None`: not found.
    pid_entries: std::sync::OnceLock<Option<crate::answers::guest_pid::Entries>>,
}

impl Zygote {
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
            self.registration_changed();
            return Err(ForkError::Send(e));
        }
        rx.recv_timeout(FORK_WAIT).unwrap_or_else(|_| {
            super::waits::timed_out(super::waits::Wait::Forked);
            Err(ForkError::NoAnswer)
        })
    }

    /// Forgets a finished session.
    pub fn forget(&self, shared: &SessionShared) {
        self.by_ns_pid
            .lock()
            .unwrap()
            .retain(|_, s| s.id != shared.id);
        self.by_pid.lock().unwrap().retain(|_, s| s.id != shared.id);
        self.pending.lock().unwrap().remove(&shared.id);
        self.registration_changed();
    }

    /// The global pid of the child with namespace pid `ns_pid`, from the zygote's children.
    pub fn find_child(&self, ns_pid: i32) -> Option<libc::pid_t> {
        let list =
            std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", self.pid)).ok()?;
        list.split_whitespace()
            .filter_map(|p| p.parse::<libc::pid_t>().ok())
            .find(|&p| crate::procfs::ns_pid(p as u32) == Some(ns_pid))
    }

    /// Whether a FORK is in flight: a caller that is no session's child yet may become one
    /// when its FORKED arrives (a spare handed a session makes its first calls before the
    /// zygote's FORKED reaches us). With none in flight it is a spare, and holding its call
    /// would not make it a session's.
    fn fork_in_flight(&self) -> bool {
        !self.pending.lock().unwrap().is_empty()
    }

    /// Waits until the zygote has said SETTLED, or died, or `limit` passed (a zygote of an
    /// older package never says it). Whether it settled.
    pub fn wait_settled(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut guard = self.settling.0.lock().unwrap();
        while self.settled.get().is_none() && self.alive() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            guard = self.settling.1.wait_timeout(guard, left).unwrap().0;
        }
        self.settled.get().is_some()
    }

    /// Wakes [`Zygote::wait_settled`].
    fn settling_changed(&self) {
        let _guard = self.settling.0.lock().unwrap();
        self.settling.1.notify_all();
    }

    /// Something a held call waits on changed: wake the router.
    fn registration_changed(&self) {
        let _ = nix::unistd::write(&self.registered.1, &[1]);
    }

    fn session_for(&self, pid: u32) -> Option<Arc<SessionShared>> {
        self.session_of(pid, None, None)
    }

    /// [`Zygote::session_for`], given the caller's own namespace process id when it is
    /// known already (`ns_tgid`, from [`TaskIds`]): a caller that is a session's process is
    /// then found without reading `/proc`. With `parent` too (its `PPid`, read in the same
    /// look at its status, never one kept across a hold) the walk up its parents starts
    /// there: a spare's calls (no session's yet, the zygote's child) cost one read of its
    /// status, not two.
    fn session_of(
        &self,
        pid: u32,
        ns_tgid: Option<i32>,
        parent: Option<u32>,
    ) -> Option<Arc<SessionShared>> {
        if let Some(s) = self.by_pid.lock().unwrap().get(&pid) {
            return Some(s.clone());
        }
        if let Some(ns) = ns_tgid {
            if ns == 1 {
                return None; // the zygote's process
            }
            if let Some(s) = self.by_ns_pid.lock().unwrap().get(&ns).cloned() {
                self.by_pid.lock().unwrap().insert(pid, s.clone());
                return Some(s);
            }
        }
        // A session's thread is its process's: the process id (`NStgid`), not the thread's;
        // and a process a session forked (a policy allowing subprocesses) is the session's:
        // up its parents until a session's process, or the zygote.
        let mut task = pid;
        let mut steps = MAX_SESSION_DEPTH;
        if let (Some(_), Some(parent)) = (ns_tgid, parent) {
            // The walk's first step, done already: `pid` is no session's process.
            if parent == self.pid as u32 || parent <= 1 {
                return None;
            }
            task = parent;
            steps -= 1;
        }
        for _ in 0..steps {
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

    /// Has the process that made `n` (an armed session's `getpid` or `gettid`, which the
    /// router answers with [`SESSION_PID`]) answer its later ones itself, in its C library
    /// (`answers/guest_pid.rs`), when it is its process's only task and the zygote's child
    /// (the session's own process, not one it made): it waits on `n`, so no code of that
    /// process runs while its text is rewritten. Anything else leaves it as it
    /// was (the router answers its calls as before), counted.
    fn pid_in_guest(&self, listener: BorrowedFd<'_>, n: &sys::Notif) {
        use crate::answers::guest_pid::{self, Skip};
        let pid = n.pid as libc::pid_t;
        let outcome = match self.pid_entries.get_or_init(|| guest_pid::locate(self.pid)) {
            None => Err(Skip::NoLibc),
            Some(entries) => match sys::open_process_memory(pid) {
                Err(_) => Err(Skip::Write),
                // Still waiting on `n` after the open: the memory opened and the status read
                // are the caller's (its pid cannot have been reused while it waits).
                Ok(mem) => match guest_pid::alone(pid, self.pid) {
                    Ok(true) if sys::notif_id_valid(listener, n.id) => {
                        guest_pid::patch(&mem, *entries, SESSION_PID)
                    }
                    Ok(true) => return, // gone: nothing to count
                    _ => Err(Skip::NotAlone),
                },
            },
        };
        match outcome {
            Ok(()) => super::pid_answers::in_guest(),
            Err(why) => super::pid_answers::skipped(why),
        }
    }

    /// Answers every notification of the zygote's filter. `rules` are the sessions'; the
    /// zygote's own calls are judged with `own_grants` as their write grants (the sessions'
    /// and the zygote's scratch directory).
    fn route_notifications(
        self: Arc<Self>,
        listener: OwnedFd,
        rules: notify::Rules<'_>,
        own_grants: &Grants,
    ) {
        // Whether the policy pins a session's pid (`getpid` then reaches the router).
        let pid_pinned = syscalls::number("getpid")
            .and_then(|nr| rules.decisions.get(nr))
            .is_some_and(|d| d.check == Check::Pid);
        let Ok(mut buf) = NotifBuf::new() else { return };
        let mut own = Own {
            clock: Default::default(),
            inodes: Default::default(),
            violations: Violations::new(Some(format!("wfjail: zygote {}: ", self.index))),
            pid_pinned,
        };
        // Calls of children not known yet, held (unanswered: the caller waits) until their
        // FORKED registers them, no FORK is in flight any more, or their deadline passes.
        let mut held: Vec<Held> = Vec::new();
        loop {
            let wait = held
                .iter()
                .map(|h| h.until)
                .min()
                .map_or(PollTimeout::NONE, |t| {
                    crate::supervise::poll_timeout(t.saturating_duration_since(Instant::now()))
                });
            let mut fds = [
                PollFd::new(listener.as_fd(), PollFlags::POLLIN),
                PollFd::new(self.registered.0.as_fd(), PollFlags::POLLIN),
            ];
            match poll(&mut fds, wait) {
                Ok(_) => {}
                Err(Errno::EINTR) => continue,
                Err(_) => return,
            }
            let rev = fds[0].revents().unwrap_or(PollFlags::empty());
            let changed = fds[1]
                .revents()
                .is_some_and(|r| r.contains(PollFlags::POLLIN));
            if changed {
                let mut sink = [0u8; 64];
                while matches!(nix::unistd::read(&self.registered.0, &mut sink), Ok(n) if n > 0) {}
            }
            // Held calls first (they are older): each is answered once its caller is known,
            // or no FORK in flight can make it known, or (a backstop, counted) at its deadline.
            if !held.is_empty() {
                let now = Instant::now();
                for mut h in std::mem::take(&mut held) {
                    let timed_out = now >= h.until;
                    if !self.route_one(
                        listener.as_fd(),
                        &h.n,
                        &mut h.ids,
                        rules,
                        own_grants,
                        &mut own,
                        !timed_out,
                    ) {
                        held.push(h);
                    } else if timed_out {
                        super::waits::timed_out(super::waits::Wait::ForkedBeforeCall);
                    }
                }
            }
            if rev.contains(PollFlags::POLLIN) {
                // None: the call went away before it was read (its caller was interrupted).
                let Some(n) = notify::receive(listener.as_fd(), &mut buf) else {
                    continue;
                };
                let mut ids = None;
                if !self.route_one(
                    listener.as_fd(),
                    &n,
                    &mut ids,
                    rules,
                    own_grants,
                    &mut own,
                    true,
                ) {
                    held.push(Held {
                        n,
                        ids,
                        until: Instant::now() + AWAIT_SESSION,
                    });
                }
            } else if !rev.is_empty() {
                return; // every task under the filter is gone
            }
        }
    }

    /// Routes and answers notification `n`; false when it is held instead (`may_hold`, and
    /// its caller is no known session's child while a FORK is in flight: its FORKED may be
    /// on its way). `ids`: its caller's ids, read at most once per notification (kept with a
    /// held one).
    #[allow(clippy::too_many_arguments)]
    fn route_one(
        &self,
        listener: BorrowedFd<'_>,
        n: &sys::Notif,
        ids: &mut Option<TaskIds>,
        rules: notify::Rules<'_>,
        own_grants: &Grants,
        own: &mut Own,
        may_hold: bool,
    ) -> bool {
        let pid_pinned = own.pid_pinned;
        let mut hold = false;
        {
            let name = syscalls::name(n.nr as u32).unwrap_or("");
            let native = n.arch == crate::policy::bpf::AUDIT_ARCH_X86_64;
            let signal = matches!(name, "kill" | "tkill" | "tgkill");
            let call = route::Call {
                native,
                check: rules.decisions.get(n.nr as u32).map(|d| d.check),
                forks: matches!(name, "fork" | "vfork")
                    || (name == "clone" && n.args[0] & libc::CLONE_THREAD as u64 == 0),
                spawns_thread: name == "clone" && n.args[0] & libc::CLONE_THREAD as u64 != 0,
                sleeps: matches!(name, "nanosleep" | "clock_nanosleep"),
                draws_entropy: syscalls::RANDOM.contains(&name),
                signals_itself: signal
                    && native
                    && (crate::procfs::ns_pid(n.pid) == Some(n.args[0] as i32)
                        || crate::procfs::ns_tgid(n.pid) == Some(n.args[0] as i32)),
                // Its pid, once it runs its session: the same in every session, and a signal
                // to that pid is a signal to itself, sent for it.
                signals_session_pid: signal
                    && pid_pinned
                    && n.args[0] as i32 == SESSION_PID
                    && (name != "tgkill"
                        || n.args[1] as i32 == SESSION_PID
                        || crate::procfs::ns_pid(n.pid) == Some(n.args[1] as i32)),
            };
            let mut found = None;
            let asker = || {
                if n.pid == self.pid as u32 {
                    return route::Asker::Zygote;
                }
                // A known session's task first (the common case: no /proc read).
                let known = self.by_pid.lock().unwrap().get(&n.pid).cloned();
                found = match known {
                    Some(s) => Some(s),
                    None => {
                        // One read of its status says whether it is a thread of the
                        // zygote's process and, if not, which process of the namespace.
                        // Read now (not kept from a hold, when the caller may have been
                        // reparented since): its parent is as fresh as the walk's own read.
                        let fresh = ids.is_none();
                        if fresh {
                            *ids = TaskIds::of(n.pid);
                        }
                        if ids.is_some_and(|i| i.tgid == self.pid as u64) {
                            return route::Asker::ZygoteThread;
                        }
                        let parent = ids.filter(|_| fresh).map(|i| i.ppid);
                        self.session_of(n.pid, ids.map(|i| i.ns_tgid), parent)
                    }
                };
                if found.is_none() && may_hold && self.alive() && self.fork_in_flight() {
                    hold = true;
                }
                match found {
                    Some(_) => route::Asker::Session,
                    None => route::Asker::Unknown,
                }
            };
            let routed = route::route(call, asker);
            if hold {
                return false;
            }
            let session = match routed {
                route::Routed::Continue => {
                    notify::allow(listener, n);
                    return true;
                }
                route::Routed::SignalItself => {
                    // A session's signal to itself costs the router like any answer: a loop
                    // of them is a flood its budget stops (the zygote and spares have none).
                    if self
                        .session_for(n.pid)
                        .is_none_or(|session| charge(&session, listener, n))
                    {
                        notify::allow(listener, n);
                    }
                    return true;
                }
                route::Routed::ZygoteHandles => {
                    // Never kill the zygote for its own violation: deny it and say so. Under
                    // `clock = "virtual"` what preloading reads of the wall clock is
                    // [`PRELOAD_INSTANT`], and its monotonic clock is a virtual one of its
                    // own: a module-level `time.time()` in preloaded code gives the same
                    // value in every zygote, as a replay needs.
                    let rules = notify::Rules {
                        on_violation: crate::policy::OnViolation::Deny,
                        late_reads: false,
                        grants: own_grants,
                        ..rules
                    };
                    let state = notify::State {
                        violations: &mut own.violations,
                        entropy: None,
                        clock: Some(PRELOAD_INSTANT),
                        monotonic: &mut own.clock,
                        inodes: &mut own.inodes,
                        learned: None,
                    };
                    notify::handle(listener, n, rules, state, || {});
                    return true;
                }
                route::Routed::SpareSeeded => {
                    // A spare before its session gets fixed bytes (its session reseeds from its
                    // own seed, `_child` in zygote.py).
                    answer_fixed_bytes(listener, n);
                    return true;
                }
                route::Routed::SpareCpuCount(cpus) => {
                    notify::respond(listener, n, notify::cpu_answer(&n.args, cpus));
                    return true;
                }
                route::Routed::RefuseUnknown => {
                    eprintln!(
                        "wfjail: zygote {}: call from unknown pid {} refused",
                        self.index, n.pid
                    );
                    notify::refuse(listener, n, libc::EPERM);
                    return true;
                }
                route::Routed::Session => match found.take() {
                    Some(session) => session,
                    None => return true,
                },
            };
            // The router's work for a session is bounded (notify::Budget): a flooding session
            // is killed before it starves its siblings.
            if !charge(&session, listener, n) {
                return true;
            }
            let mut v = session.violations.lock().unwrap();
            let mut det = session.determinism.lock().unwrap();
            match route::route_session(call, det.armed, det.begun) {
                route::SessionRouted::BeforeSession => {
                    if n.args[1] == 0 {
                        det.begun = true;
                    }
                    drop((v, det));
                    answer_fixed_bytes(listener, n);
                    return true;
                }
                route::SessionRouted::Pid => {
                    let first = !det.pid_in_guest_tried;
                    det.pid_in_guest_tried = true;
                    drop((v, det));
                    super::pid_answers::notified();
                    if first {
                        self.pid_in_guest(listener, n);
                    }
                    let answer = notify::Answer::Value {
                        ret: SESSION_PID as i64,
                        writes: vec![],
                    };
                    notify::respond(listener, n, answer);
                    return true;
                }
                route::SessionRouted::SignalForIt => {
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
                    notify::respond(listener, n, answer);
                    return true;
                }
                route::SessionRouted::Handle => {}
            }
            let det_now = &mut *det;
            let clock = det_now.clock;
            let mut unarmed = crate::answers::entropy::Entropy::new(0);
            // Before HELLO a spare's clock reads do not move its session's monotonic clock.
            let mut unarmed_clock = crate::answers::monotonic::Monotonic::default();
            let mut unarmed_inodes = crate::answers::filetimes::Inodes::default();
            let (entropy, monotonic, inodes) = if det_now.armed {
                (
                    det_now.entropy.as_mut(),
                    &mut det_now.monotonic,
                    &mut det_now.inodes,
                )
            } else {
                (
                    det_now.entropy.as_mut().map(|_| &mut unarmed),
                    &mut unarmed_clock,
                    &mut unarmed_inodes,
                )
            };
            let state = notify::State {
                violations: &mut v,
                entropy,
                clock,
                monotonic,
                inodes,
                learned: None,
            };
            let killed = notify::handle(listener, n, rules, state, || kill_caller(n));
            drop((v, det));
            if killed == notify::Handled::Killed {
                session.mark_killed();
            }
        }
        true
    }
}

/// The router's own state: the zygote's answers (its virtual clock, file times, violations).
struct Own {
    clock: crate::answers::monotonic::Monotonic,
    inodes: crate::answers::filetimes::Inodes,
    violations: Violations,
    /// Whether the policy pins a session's pid (`getpid` then reaches the router).
    pid_pinned: bool,
}

/// A call held until its caller is known (see [`AWAIT_SESSION`]).
struct Held {
    n: sys::Notif,
    /// Its caller's ids, once read.
    ids: Option<TaskIds>,
    until: Instant,
}

/// Answers a `getrandom` of a zygote's child made before its session (a spare's, or the
/// fork's reseed): fixed bytes, the same under every policy and in every run.
fn answer_fixed_bytes(listener: BorrowedFd<'_>, n: &sys::Notif) {
    let mut fixed = crate::answers::entropy::Entropy::new(0);
    notify::respond(listener, n, notify::seeded_answer(n, &mut fixed));
}

/// Kills the task that made notification `n`: it waits on the notification, so its pid cannot
/// have been reused.
fn kill_caller(n: &sys::Notif) {
    let _ = sys::kill_pid(n.pid as libc::pid_t, libc::SIGKILL);
}

/// Charges `n` to `session`'s budget (`notify::charge`, as for `run` and exec-mode sessions):
/// `false` when it was over, its guest killed and the call failed, and the session marked so.
fn charge(session: &SessionShared, listener: BorrowedFd<'_>, n: &sys::Notif) -> bool {
    let within = notify::charge(&mut session.budget.lock().unwrap(), listener, n, || {
        kill_caller(n)
    });
    if !within {
        session.mark_killed();
    }
    within
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

/// How long the router holds a call of a child not known yet, waiting for its FORKED: a
/// backstop (the FORKED, or the FORK's end, wakes it); the router answers every other call
/// meanwhile, the zygote's own among them.
const AWAIT_SESSION: Duration = Duration::from_millis(500);

/// How many parents up from a caller a session's process is looked for (a session's
/// processes are bounded by `limits.processes`; a deeper chain is no session's).
const MAX_SESSION_DEPTH: usize = 64;

/// What the router needs of a notifying task that is no known session's: its process
/// (`Tgid`: a thread of the zygote's?) and that process's id in the namespace (`NStgid`: a
/// session's?). The task waits on its notification, so neither changes while it is held (a
/// thread whose process execs dies first, and its notification with it).
#[derive(Debug, Clone, Copy)]
struct TaskIds {
    tgid: u64,
    ns_tgid: i32,
    /// The global pid of its parent process (`PPid`), as read: it can change while the call
    /// is held (a reparented caller), so only a fresh read is used.
    ppid: u32,
}

impl TaskIds {
    fn of(tid: u32) -> Option<TaskIds> {
        let status = crate::procfs::Status::of(tid)?;
        Some(TaskIds {
            tgid: status.number("Tgid")?,
            ns_tgid: status.innermost("NStgid")? as i32,
            ppid: status.innermost("PPid")? as u32,
        })
    }
}

/// The process id of global task `tid` in its own PID namespace (`NStgid`), and the global
/// pid of its parent process (`PPid`).
fn ns_tgid_and_parent(tid: u32) -> Option<(i32, u32)> {
    let status = crate::procfs::Status::of(tid)?;
    Some((
        status.innermost("NStgid")? as i32,
        status.innermost("PPid")? as u32,
    ))
}
