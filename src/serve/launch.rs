//! A session's guest, started: forked from a zygote (prefork mode) or planned and spawned like
//! `wfjail run` does (exec mode), with the session socket on its fds 3 and 4 and a pipe of the
//! session's own as its stdout and stderr.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::socket::{AddressFamily, SockFlag, SockType, setsockopt, socketpair, sockopt};

use crate::plan::{self, Plan, PlanError, PlanRequest};
use crate::policy::Dur;
use crate::process::SpawnError;
use crate::protocol::worker::OpenRequest;
use crate::supervise::assemble::{Applied, LayersBase, applied_rlimit};
use crate::supervise::guest::{Judge, Supervisor};
use crate::supervise::memory_evidence::MemoryEvidence;
use crate::supervise::set_nonblocking;
use crate::sys::Reaped;

use super::zygote::{ForkError, Zygote};
use super::{Server, SessionShared};

/// Why a session could not start its guest (the worker gets FAILED with this).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("OPEN timeout: {0}")]
    Timeout(String),
    #[error("OPEN's init is {0} bytes as JSON; at most {max} are accepted", max = crate::protocol::worker::MAX_INIT)]
    InitTooLarge(usize),
    /// The pipe that wakes the session when the zygote reports the guest's exit.
    #[error("pipe: {0}")]
    Wake(#[source] std::io::Error),
    #[error("output pipe: {0}")]
    OutputPipe(#[source] Errno),
    #[error("session socket: {0}")]
    Socket(#[source] Errno),
    #[error("SO_PASSCRED: {0}")]
    PassCred(#[source] Errno),
    #[error("no zygote is running (restarting?)")]
    NoZygote,
    #[error("zygote fork: {0}")]
    Fork(#[source] ForkError),
    #[error(transparent)]
    Exec(#[from] ExecError),
    #[error(
        "this server runs in zygote mode: open a session with {{\"handler\": \"module:function\"}}"
    )]
    ZygoteMode,
    #[error(
        "this server runs in exec mode: open a session with {{\"argv\": [\"/path/to/guest\", \
         ...]}} (or start it with --zygote)"
    )]
    ExecMode,
}

/// Why an exec-mode guest could not be spawned.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("/dev/null: {0}")]
    DevNull(#[source] std::io::Error),
    #[error(transparent)]
    Spawn(#[from] SpawnError),
}

/// How the guest was started.
pub enum Child {
    Zygote {
        zygote: Arc<Zygote>,
        ns_pid: i32,
        /// Learned from the credentials on the guest's first message.
        pid: Option<libc::pid_t>,
        pidfd: Option<OwnedFd>,
    },
    Exec(Box<ExecChild>),
}

/// An exec-mode guest: the session thread embeds its supervisor (supervise/guest.rs), whose
/// notification state is the session's shared one.
pub struct ExecChild {
    pub plan: Plan,
    pub base: LayersBase,
    pub sup: Supervisor<Arc<SessionShared>>,
    pub reaped: Option<Reaped>,
    /// `limits.processes` for a guest that runs as host root; removed with the session.
    pub pids_cgroup: Option<crate::process::pids_cgroup::PidsCgroup>,
}

/// A guest started for a session, and what the session holds of it.
pub struct Launched {
    pub shared: Arc<SessionShared>,
    pub child: Child,
    /// The guest's command (exec mode) or handler (zygote mode), for the report.
    pub command: Vec<String>,
    pub applied: Applied,
    /// The session's end of the guest's socket (the guest has the other on fds 3 and 4).
    pub guest: OwnedFd,
    /// The read end of the guest's stdout and stderr.
    pub output: OwnedFd,
    /// Each call's wall-clock limit.
    pub timeout: Option<Duration>,
    /// The guest's log records go to the worker (OPEN's `logs`).
    pub relay_logs: bool,
}

/// Starts the guest of session `id` as `open` asks. On failure: why, and the command (if it
/// was known) for the report.
pub fn launch(
    id: u64,
    server: &Server,
    open: OpenRequest,
) -> Result<Launched, (StartError, Vec<String>)> {
    let timeout = match open.timeout.as_deref().map(Dur::parse) {
        Some(Ok(d)) => Some(d.0),
        Some(Err(e)) => return Err((StartError::Timeout(e), vec![])),
        None => server.timeout,
    };
    let relay_logs = open.logs;
    let init = match &open.init {
        Some(v) => {
            let text = v.to_string();
            if text.len() > crate::protocol::worker::MAX_INIT {
                return Err((StartError::InitTooLarge(text.len()), vec![]));
            }
            Some(text)
        }
        None => None,
    };
    let shared = SessionShared::new(id, server.echo).map_err(|e| (StartError::Wake(e), vec![]))?;
    *shared.determinism.lock().unwrap() =
        super::Determinism::new(&server.policy, open.seed, open.time_ns);
    // The guest's stdout and stderr: a pipe of this session's own, so that one guest cannot
    // block (O_NONBLOCK), flood or read another's.
    let (out_r, out_w) =
        nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| (StartError::OutputPipe(e), vec![]))?;
    let (ours, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| (StartError::Socket(e), vec![]))?;
    let seed = open.seed;
    let (child, command, applied) = match (&server.pool, open) {
        (
            Some(pool),
            OpenRequest {
                handler: Some(handler),
                argv: None,
                init: init_value,
                ..
            },
        ) => {
            let command = vec![handler.clone()];
            if let Err(e) = setsockopt(&ours, sockopt::PassCred, &true) {
                return Err((StartError::PassCred(e), command));
            }
            let Some(zygote) = pool.pick() else {
                return Err((StartError::NoZygote, command));
            };
            match zygote.fork(shared.clone(), &handler, init_value.as_ref(), theirs, out_w) {
                Ok(ns_pid) => {
                    let applied = zygote.applied.clone();
                    let child = Child::Zygote {
                        zygote,
                        ns_pid,
                        pid: None,
                        pidfd: None,
                    };
                    (child, command, applied)
                }
                Err(e) => return Err((StartError::Fork(e), command)),
            }
        }
        (
            None,
            OpenRequest {
                argv: Some(argv),
                handler: None,
                ..
            },
        ) => match start_exec(server, &shared, seed, &argv, init.as_deref(), theirs, out_w) {
            Ok(c) => {
                server
                    .children
                    .lock()
                    .unwrap()
                    .insert(id, c.sup.pidfd().clone());
                let applied = Applied::of(&c.plan);
                (Child::Exec(Box::new(c)), argv, applied)
            }
            Err(e) => return Err((e.into(), argv)),
        },
        (Some(_), _) => return Err((StartError::ZygoteMode, vec![])),
        (None, _) => return Err((StartError::ExecMode, vec![])),
    };
    set_nonblocking(&ours);
    set_nonblocking(&out_r);
    Ok(Launched {
        shared,
        child,
        command,
        applied,
        guest: ours,
        output: out_r,
        timeout,
        relay_logs,
    })
}

/// Exec mode: plans and spawns the session's guest with the session socket on fds 3 and 4,
/// its supervisor answering with the session's `shared` state and AT_RANDOM from `seed`.
fn start_exec(
    server: &Server,
    shared: &Arc<SessionShared>,
    seed: Option<u64>,
    argv: &[String],
    init: Option<&str>,
    theirs: OwnedFd,
    log: OwnedFd,
) -> Result<ExecChild, ExecError> {
    let policy = &server.policy;
    let mut extra_env = crate::protocol::guest::protocol_env(policy);
    if let Some(init) = init {
        extra_env.push(("WFJAIL_INIT".into(), init.to_string()));
    }
    let req = PlanRequest {
        session: true,
        argv: argv.to_vec(),
        grants: server.grants.clone(),
        extra_env,
        zygote: false,
        learn: false,
    };
    let mut plan = plan::build(policy, &req)?;
    // AT_RANDOM from the session's seed (answers/vdso.rs).
    plan.rules.vdso = plan.rules.vdso.map(|p| p.seeded(seed));
    let null = std::fs::File::open("/dev/null").map_err(ExecError::DevNull)?;
    let targets = [
        (null.as_raw_fd(), 0),
        (log.as_raw_fd(), 1),
        (log.as_raw_fd(), 2),
        (theirs.as_raw_fd(), 3),
        (theirs.as_raw_fd(), 4),
    ];
    let pids_cgroup = crate::process::pids_cgroup::for_policy(policy);
    let spawned = crate::process::spawn(
        &plan,
        &targets,
        pids_cgroup.as_ref().and_then(|c| c.as_ref().ok()),
    )?;
    drop((null, theirs, log));
    let mut base = LayersBase::of(&spawned);
    base.nproc_bound = crate::process::pids_cgroup::apply(policy, &pids_cgroup);
    let sup = Supervisor::new(
        spawned.pid,
        Arc::new(spawned.pidfd),
        spawned.chan,
        plan.rules.vdso,
        Judge::of(&plan, false),
        shared.clone(),
        MemoryEvidence::for_policy(applied_rlimit(&plan, libc::RLIMIT_AS), policy),
    );
    Ok(ExecChild {
        base,
        sup,
        reaped: None,
        plan,
        pids_cgroup: pids_cgroup.and_then(Result::ok),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wrong_mode_says_how_to_open_a_session() {
        assert_eq!(
            StartError::ZygoteMode.to_string(),
            r#"this server runs in zygote mode: open a session with {"handler": "module:function"}"#
        );
        assert_eq!(
            StartError::ExecMode.to_string(),
            r#"this server runs in exec mode: open a session with {"argv": ["/path/to/guest", ...]} (or start it with --zygote)"#
        );
    }
}
