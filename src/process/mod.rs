//! Creating the confined child: `clone` with the PID and user namespaces (falling back when
//! the host refuses them and the policy allows it), the set-up channel, and the child entry.

pub mod channel;
pub mod pids_cgroup;

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::Instant;

use nix::errno::Errno;
use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};

use crate::confine::{self, ChildSpec};
use crate::plan::Plan;
use crate::policy::Layer;
use crate::sys;
use channel::Step;

/// A started child, before its exec has been confirmed.
pub struct Spawned {
    pub pid: libc::pid_t,
    pub pidfd: OwnedFd,
    /// Parent end of the set-up channel.
    pub chan: OwnedFd,
    /// Namespaces `clone` created.
    pub user_ns: bool,
    pub pid_ns: bool,
    /// Namespaces `clone` could not create (best-effort ones only), with the reason.
    pub clone_degraded: Vec<(Layer, Errno)>,
    pub started: Instant,
}

#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("creating the set-up channel: {0}")]
    Channel(Errno),
    #[error(
        "the {layer} namespace is required by the policy but this host refuses it ({errno}); \
         run `wfjail check` for what would enable it"
    )]
    RequiredNamespace { layer: &'static str, errno: Errno },
    #[error(
        "the policy requires mount-ns but sets namespaces.pid = false: a private /proc shows \
         the guest's own PID namespace; set namespaces.pid = true, or drop mount-ns from require"
    )]
    MountNeedsPid,
    #[error("clone: {0}")]
    Clone(std::io::Error),
    #[error("entering the guest's pids cgroup: {0}")]
    Cgroup(pids_cgroup::CgroupError),
}

/// Whether a failed `clone` means "namespaces not allowed here" (so a smaller set may work).
fn namespace_refused(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::EPERM | libc::EINVAL | libc::ENOSPC | libc::EUSERS | libc::ENOSYS | libc::EACCES
        )
    )
}

/// Starts the child: it applies `plan` through [`confine::apply`] and execs the guest, with
/// `fd_targets` (source, target) as its descriptors 0..=4.
pub fn spawn(
    plan: &Plan,
    fd_targets: &[(RawFd, RawFd)],
    cgroup: Option<&pids_cgroup::PidsCgroup>,
) -> Result<Spawned, SpawnError> {
    let (parent_end, child_end) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(SpawnError::Channel)?;

    let p = plan;
    let ns = p.namespaces;
    let mut unshare = Vec::with_capacity(3);
    if ns.net {
        unshare.push((libc::CLONE_NEWNET, Step::NetNs, p.requires(Layer::NetNs)));
    }
    if ns.ipc {
        unshare.push((libc::CLONE_NEWIPC, Step::IpcNs, p.requires(Layer::IpcNs)));
    }
    if ns.uts {
        unshare.push((libc::CLONE_NEWUTS, Step::UtsNs, p.requires(Layer::UtsNs)));
    }

    // Attempts, most confined first. A namespace the policy requires is never dropped.
    let user_req = p.requires(Layer::UserNs);
    // A private /proc shows the guest's own PID namespace: requiring it requires that too.
    let mount_req = ns.mount && p.requires(Layer::MountNs);
    let pid_req = p.requires(Layer::PidNs) || mount_req;
    if mount_req && !ns.pid {
        return Err(SpawnError::MountNeedsPid);
    }

    // A user namespace whose id maps the kernel would refuse fails in the child, too late to
    // fall back: it is refused here, as a clone would be.
    let user_maps = if ns.user {
        user_ns_maps_allowed(&p.uid_map)
    } else {
        Ok(())
    };
    let mut attempts: Vec<(bool, bool)> = vec![(ns.user, ns.pid)];
    for (u, pd) in [(false, ns.pid), (ns.user, false), (false, false)] {
        if (ns.user && !u && user_req) || (ns.pid && !pd && pid_req) {
            continue;
        }
        if !attempts.contains(&(u, pd)) {
            attempts.push((u, pd));
        }
    }
    let mut first_error: Option<std::io::Error> = None;
    if let Err(e) = user_maps {
        attempts.retain(|&(u, _)| !u);
        first_error = Some(std::io::Error::from_raw_os_error(e as i32));
    }

    for (user, pid) in attempts {
        let flags =
            if user { libc::CLONE_NEWUSER } else { 0 } | if pid { libc::CLONE_NEWPID } else { 0 };
        // The child fills its pid into its copy of the programs.
        let mut notify_prog = plan.seccomp_notify.clone();
        let mut fallback_prog = plan.seccomp_fallback.clone();
        let mut spec = ChildSpec {
            chan: child_end.as_raw_fd(),
            chan_parent_end: parent_end.as_raw_fd(),
            in_user_ns: user,
            uid_map: &plan.uid_map,
            gid_map: &plan.gid_map,
            unshare: &unshare,
            hostname: crate::plan::HOSTNAME,
            private_proc: (ns.mount && pid).then_some(mount_req),
            proc_rules: plan
                .landlock
                .as_ref()
                .map_or(&[], |(_, info)| &info.proc_rules),
            fd_targets,
            rlimits: &plan.rlimits,
            no_aslr: p.no_aslr,
            no_aslr_required: p.requires(Layer::AddressLayout),
            merge_pages: p.merge_pages,
            last_cap: plan.last_cap,
            capabilities_required: p.requires(Layer::Capabilities),
            no_new_privs_required: p.requires(Layer::NoNewPrivs),
            landlock_fd: plan.landlock.as_ref().map(|(fd, _)| fd.as_raw_fd()),
            landlock_required: p.requires(Layer::Landlock),
            seccomp_notify: Some(&mut notify_prog),
            seccomp_fallback: fallback_prog.as_deref_mut(),
            self_pid_slots: (&plan.self_pid_slots.0, &plan.self_pid_slots.1),
            seccomp_required: p.requires(Layer::Seccomp),
            // Under warn (plan.warn_files) Landlock lets every path through: only the supervisor
            // stands between the guest and a file it may not touch, so it must be there.
            seccomp_notify_required: p.requires(Layer::SeccompNotify) || plan.warn_files,
            no_send_fds: plan.seccomp_no_send_fds.as_deref(),
            exec_path: &plan.exec.path,
            argv: &plan.exec.argv_ptrs,
            envp: &plan.exec.envp_ptrs,
        };
        crate::timing::mark("spawn: before clone");
        let started = Instant::now();
        let clone = |spec: &mut ChildSpec| sys::clone_process(flags, || confine::apply(spec));
        // In a pids cgroup, the child is born inside it (see pids_cgroup).
        let cloned = match cgroup {
            Some(cg) => cg
                .born_inside(|| clone(&mut spec))
                .map_err(SpawnError::Cgroup)?,
            None => clone(&mut spec),
        };
        match cloned {
            Ok(c) => {
                drop(child_end);
                let mut clone_degraded = Vec::new();
                if ns.user && !user {
                    clone_degraded.push((Layer::UserNs, errno_of(first_error.as_ref())));
                }
                if ns.pid && !pid {
                    clone_degraded.push((Layer::PidNs, errno_of(first_error.as_ref())));
                }
                if ns.mount && !pid {
                    // Without a PID namespace of its own, a new /proc would show the host's.
                    let errno = if ns.pid {
                        errno_of(first_error.as_ref())
                    } else {
                        Errno::ENOTSUP
                    };
                    clone_degraded.push((Layer::MountNs, errno));
                }
                return Ok(Spawned {
                    pid: c.pid,
                    pidfd: c.pidfd,
                    chan: parent_end,
                    user_ns: user,
                    pid_ns: pid,
                    clone_degraded,
                    started,
                });
            }
            Err(e) if flags != 0 && namespace_refused(&e) => {
                first_error.get_or_insert(e);
            }
            Err(e) => return Err(SpawnError::Clone(e)),
        }
    }
    // Every allowed attempt failed: a required namespace is refused.
    let errno = errno_of(first_error.as_ref());
    let layer = if user_req {
        "user"
    } else if p.requires(Layer::PidNs) {
        "pid"
    } else {
        "pid (for mount-ns)"
    };
    Err(SpawnError::RequiredNamespace { layer, errno })
}

/// Whether a new user namespace can be given the id maps `run` writes (its own uid and gid,
/// mapped to themselves), tried for real in a child as the confined child does it. Mapping
/// uid 0 needs CAP_SETFCAP at clone (Linux >= 5.12): root with every capability dropped (a
/// pod's `capabilities: drop: [ALL]`) gets EPERM.
pub fn probe_user_ns_maps() -> Result<(), Errno> {
    let uid_map = format!("{0} {0} 1\n", nix::unistd::getuid()).into_bytes();
    let gid_map = format!("{0} {0} 1\n", nix::unistd::getgid()).into_bytes();
    sys::probe_in_child(libc::CLONE_NEWUSER, || {
        sys::write_file(c"/proc/self/setgroups", b"deny")
            .and_then(|_| sys::write_file(c"/proc/self/uid_map", &uid_map))
            .and_then(|_| sys::write_file(c"/proc/self/gid_map", &gid_map))
    })
}

/// Whether `spawn`'s id maps will be allowed: those of any uid but root's need no
/// capability. Root's need one more thing than mapping one's own ids (the kernel's
/// `verify_root_map`): CAP_SETFCAP in the effective set of the process that makes the user
/// namespace. When this process holds it, the maps are allowed without a try (a `capget`
/// instead of a child that makes a user namespace: ~0.2 ms of every `wfjail run` as root);
/// without it, [`probe_user_ns_maps`] tries them, once per process (kernels before 5.12 allow
/// them anyway).
fn user_ns_maps_allowed(uid_map: &[u8]) -> Result<(), Errno> {
    static ROOT_MAPS: std::sync::OnceLock<Result<(), Errno>> = std::sync::OnceLock::new();
    if !uid_map.starts_with(b"0 ") {
        return Ok(());
    }
    let setfcap = caps::has_cap(None, caps::CapSet::Effective, caps::Capability::CAP_SETFCAP);
    if setfcap.unwrap_or(false) {
        return Ok(());
    }
    *ROOT_MAPS.get_or_init(probe_user_ns_maps)
}

fn errno_of(e: Option<&std::io::Error>) -> Errno {
    e.and_then(|e| e.raw_os_error())
        .map(Errno::from_raw)
        .unwrap_or(Errno::EPERM)
}
