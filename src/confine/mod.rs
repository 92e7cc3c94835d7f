//! Child side: applies what the parent prepared, in one fixed order, then execs the guest.
//!
//! [`apply`] is the only place the order of confinement steps lives. It runs between `clone`
//! and `execve`, so it only makes system calls: everything it reads was built by the parent
//! (`plan`) before the fork, and it neither allocates nor takes locks.
//!
//! Order, and why:
//! 1. parent-death signal — so that nothing outlives wfjail (checked against a race).
//! 2. user-namespace id maps — the PID and user namespaces came from `clone` itself;
//!    maps must be written before anything that checks ids.
//! 3. net, IPC, UTS namespaces (best-effort unless required), then the hostname, then a mount
//!    namespace with a `/proc` of our own PID namespace — these need CAP_SYS_ADMIN in our
//!    user namespace, so before capabilities go; `/proc` after the id maps were written
//!    through the host's.
//! 4. descriptors — the guest's stdio and protocol pipes onto 0..=4, everything else closed
//!    but the set-up channel and the Landlock ruleset (both close-on-exec); then an empty
//!    signal mask and SIGPIPE back to default.
//! 5. rlimits — lowering needs no privilege; then the personality (no address-space
//!    randomisation, when the policy pins the layout), which needs none either but which
//!    container seccomp profiles refuse (best-effort unless `address-layout` is required).
//!    Under `serve --merge-pages`, the zygote is opted into same-page merging here too
//!    (`prctl(PR_SET_MEMORY_MERGE, 1)`, kept across the exec, inherited by its forks): the
//!    guest's filter refuses that call to the guest itself.
//! 6. capabilities — bounding, ambient, then effective/permitted/inheritable.
//! 7. no_new_privs — required by Landlock and seccomp without CAP_SYS_ADMIN.
//! 8. Landlock — restrict_self with the ruleset the parent built, then close it.
//! 9. seccomp — last, so that the steps above may use syscalls the guest may not; with a
//!    user-notification listener handed to the parent over the channel.
//! 10. execve — the supervisor allows exactly this one (see docs/architecture.md).

pub mod records;

use std::ffi::CStr;
use std::os::fd::RawFd;

use nix::errno::Errno;

use crate::sys;
use records::{ChildMsg, Step};

/// Descriptors a guest gets: `fd_targets` sources are placed at their target numbers.
pub const MAX_FD_TARGETS: usize = 5;
/// Kept descriptors are first moved at or above this number, out of the way of targets.
const HIGH_FD: RawFd = 16;

/// Everything the child needs, borrowed from the parent's prepared plan. Plain data: slices,
/// C strings and descriptor numbers.
pub struct ChildSpec<'a> {
    /// Our end of the set-up channel, and the parent's end (closed first thing).
    pub chan: RawFd,
    pub chan_parent_end: RawFd,
    /// Whether `clone` created a user namespace (then the id maps are ours to write).
    pub in_user_ns: bool,
    pub uid_map: &'a [u8],
    pub gid_map: &'a [u8],
    /// `(CLONE_NEW* flag, step, required)` for the namespaces made with `unshare`.
    pub unshare: &'a [(libc::c_int, Step, bool)],
    pub hostname: &'a [u8],
    /// `Some(required)`: mount a private `/proc` (only when `clone` made a PID namespace).
    pub private_proc: Option<bool>,
    /// Landlock grants under `/proc`, added again for the private one: (path, access).
    pub proc_rules: &'a [(std::ffi::CString, u64)],
    /// `(source fd, target fd)`.
    pub fd_targets: &'a [(RawFd, RawFd)],
    pub rlimits: &'a [(libc::c_int, u64)],
    /// `[process] address_randomization = "deny"`.
    pub no_aslr: bool,
    /// `require` names `address-layout`: a refused `personality` stops the start.
    pub no_aslr_required: bool,
    /// `serve --merge-pages`: opt into same-page merging before the exec (best-effort: a
    /// failure goes to the parent as a degraded `Step::MemoryMerge`).
    pub merge_pages: bool,
    pub last_cap: u32,
    pub capabilities_required: bool,
    pub no_new_privs_required: bool,
    pub landlock_fd: Option<RawFd>,
    pub landlock_required: bool,
    /// The program with user-notification actions, if the parent wants notification. The
    /// child's own copy (fork semantics): it writes its pid into it, see `self_pid_slots`.
    pub seccomp_notify: Option<&'a mut [libc::sock_filter]>,
    /// The program with in-filter actions, used when notification is unavailable; `None`
    /// when the parent knew it would not be (then a refused listener is fatal).
    pub seccomp_fallback: Option<&'a mut [libc::sock_filter]>,
    /// Instructions of (notify, fallback) that compare with `bpf::SELF_PID`.
    pub self_pid_slots: (&'a [usize], &'a [usize]),
    pub seccomp_required: bool,
    pub seccomp_notify_required: bool,
    /// `limits.disk`: stacked once the listener has gone to the parent
    /// (`bpf::no_send_fds`).
    pub no_send_fds: Option<&'a [libc::sock_filter]>,
    pub exec_path: &'a CStr,
    pub argv: &'a [*const libc::c_char],
    pub envp: &'a [*const libc::c_char],
}

/// Exit code of a child that failed before exec (the parent reads the reason from the
/// channel; this is what the wait status shows if the channel was lost).
pub const SETUP_FAILED: libc::c_int = 125;

/// Applies the confinement in order and execs the guest. Never returns.
pub fn apply(spec: &mut ChildSpec<'_>) -> ! {
    let chan = spec.chan;
    sys::close(spec.chan_parent_end);

    // 1. Die with the parent. If it died before this point, the channel has hung up.
    if let Err(e) = sys::set_parent_death_signal(libc::SIGKILL) {
        fatal(chan, Step::DeathSignal, e);
    }
    if sys::peer_hung_up(chan) {
        sys::exit_now(SETUP_FAILED);
    }

    // 2. Id maps for the user namespace `clone` made: our own ids, mapped to themselves.
    if spec.in_user_ns {
        let r = sys::write_file(c"/proc/self/setgroups", b"deny")
            .and_then(|_| sys::write_file(c"/proc/self/uid_map", spec.uid_map))
            .and_then(|_| sys::write_file(c"/proc/self/gid_map", spec.gid_map));
        if let Err(e) = r {
            fatal(chan, Step::IdMaps, e);
        }
    }

    // 3. The namespaces `unshare` can make for us (they do not need a new process).
    let mut uts = false;
    for &(flag, step, required) in spec.unshare {
        match sys::unshare(flag) {
            Ok(()) => uts |= flag == libc::CLONE_NEWUTS,
            Err(e) => degrade(chan, step, e, required),
        }
    }
    if uts && let Err(e) = sys::sethostname(spec.hostname) {
        degrade(chan, Step::Hostname, e, false);
    }
    if let Some(required) = spec.private_proc {
        match sys::private_proc() {
            // Grants under /proc named the host's; the guest's is another file system. A
            // grant that does not exist there is not given (narrower, never wider).
            Ok(()) => {
                if let Some(fd) = spec.landlock_fd {
                    for (path, access) in spec.proc_rules {
                        let _ = sys::landlock_add_path_rule(fd, path, *access);
                    }
                }
            }
            Err(e) => degrade(chan, Step::MountNs, e, required),
        }
    }

    // 4. Descriptors. The channel moves to a new number.
    let (chan, landlock_fd) = match arrange_fds(spec) {
        Ok(kept) => kept,
        Err(e) => fatal(chan, Step::Descriptors, e),
    };

    // Default signal handling for the guest (no step of its own in the report).
    if let Err(e) = sys::reset_signals() {
        fatal(chan, Step::Descriptors, e);
    }

    // 5. Resource limits.
    for &(resource, value) in spec.rlimits {
        if let Err(e) = sys::set_rlimit(resource, value, value) {
            fatal(chan, Step::Rlimits, e);
        }
    }

    // ...and the address-space layout of the exec to come (no privilege needed either, but
    // container profiles refuse it: best-effort unless required).
    if spec.no_aslr
        && let Err(e) = sys::disable_address_randomization()
    {
        degrade(chan, Step::Personality, e, spec.no_aslr_required);
    }

    // ...and same-page merging for the zygote of `serve --merge-pages`, which its filter would
    // refuse it after the exec (the opt-in is the operator's, never the guest's).
    if spec.merge_pages
        && let Err(e) = sys::set_memory_merge()
    {
        degrade(chan, Step::MemoryMerge, e, false);
    }

    // 6. Capabilities.
    match sys::drop_all_capabilities(spec.last_cap) {
        Ok(true) => {}
        Ok(false) => degrade(
            chan,
            Step::CapabilityBounding,
            Errno::EPERM,
            spec.capabilities_required,
        ),
        Err(e) => fatal(chan, Step::Capabilities, e),
    }

    // 7. no_new_privs (Landlock and seccomp need it without CAP_SYS_ADMIN).
    if let Err(e) = sys::set_no_new_privs() {
        degrade(chan, Step::NoNewPrivs, e, spec.no_new_privs_required);
    }

    // 8. Landlock.
    if let Some(fd) = landlock_fd {
        if let Err(e) = sys::landlock_restrict_self(fd) {
            degrade(chan, Step::Landlock, e, spec.landlock_required);
        }
        sys::close(fd);
    }

    // 9. Seccomp, last: from here on the guest's allowlist applies to us too (write, sendmsg,
    // close are on it; execve goes to the supervisor).
    // Signals only to itself: our pid (1 in a PID namespace) replaces the placeholder.
    let me = sys::getpid() as u32;
    if let Some(prog) = spec.seccomp_notify.as_deref_mut() {
        for &i in spec.self_pid_slots.0 {
            if let Some(insn) = prog.get_mut(i) {
                insn.k = me;
            }
        }
    }
    if let Some(prog) = spec.seccomp_fallback.as_deref_mut() {
        for &i in spec.self_pid_slots.1 {
            if let Some(insn) = prog.get_mut(i) {
                insn.k = me;
            }
        }
    }
    let mut installed = false;
    if let Some(prog) = spec.seccomp_notify.as_deref() {
        let flags = libc::SECCOMP_FILTER_FLAG_NEW_LISTENER;
        // WAIT_KILLABLE_RECV (Linux 5.19): a guest killed while its call waits for the
        // supervisor is not left in an uninterruptible wait.
        let listener =
            sys::seccomp_install(prog, flags | libc::SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV)
                .or_else(|e| {
                    if e == Errno::EINVAL {
                        sys::seccomp_install(prog, flags)
                    } else {
                        Err(e)
                    }
                });
        match listener {
            Ok(listener) => {
                if let Err(e) = records::send_listener(chan, listener) {
                    fatal(chan, Step::SeccompNotify, e);
                }
                sys::close(listener);
                installed = true;
            }
            // No fall-back program: the parent found nothing that could refuse the listener,
            // so this is unforeseen (ENOMEM): stop rather than run with no filter.
            Err(e) if spec.seccomp_fallback.is_none() => fatal(chan, Step::SeccompNotify, e),
            Err(e) => degrade(chan, Step::SeccompNotify, e, spec.seccomp_notify_required),
        }
    }
    if !installed {
        let Some(prog) = spec.seccomp_fallback.as_deref() else {
            fatal(chan, Step::Seccomp, Errno::EINVAL)
        };
        match sys::seccomp_install(prog, 0) {
            Ok(_) => installed = true,
            Err(e) => degrade(chan, Step::Seccomp, e, spec.seccomp_required),
        }
    }
    // Under limits.disk, no descriptor may travel in a message (bpf::no_send_fds). Only now:
    // the listener itself went to the parent with sendmsg.
    if let Some(prog) = spec.no_send_fds
        && installed
        && let Err(e) = sys::seccomp_install(prog, 0)
    {
        fatal(chan, Step::Seccomp, e);
    }

    // 10. The guest. On success the channel closes (close-on-exec): the parent's signal.
    let e = sys::execve(spec.exec_path, spec.argv, spec.envp);
    records::send(
        chan,
        ChildMsg::Fatal {
            step: Step::Exec,
            errno: e,
        },
    );
    sys::exit_now(if e == Errno::ENOENT { 127 } else { 126 })
}

/// A step that must succeed failed: report it and exit.
fn fatal(chan: RawFd, step: Step, errno: Errno) -> ! {
    records::send(chan, ChildMsg::Fatal { step, errno });
    sys::exit_now(SETUP_FAILED)
}

/// A best-effort step failed: report it and go on, unless the policy requires it.
fn degrade(chan: RawFd, step: Step, errno: Errno, required: bool) {
    if required {
        fatal(chan, step, errno);
    }
    records::send(chan, ChildMsg::Degraded { step, errno });
}

/// Places `fd_targets` at their numbers and closes everything else but the channel and the
/// Landlock ruleset, which it returns at their new (high, close-on-exec) numbers.
fn arrange_fds(spec: &ChildSpec<'_>) -> sys::SysResult<(RawFd, Option<RawFd>)> {
    // Move every descriptor we keep above the target range first, so that placing one
    // target cannot clobber another's source.
    let chan = sys::dup_above(spec.chan, HIGH_FD)?;
    let landlock = match spec.landlock_fd {
        Some(fd) => Some(sys::dup_above(fd, HIGH_FD)?),
        None => None,
    };
    let mut high = [-1 as RawFd; MAX_FD_TARGETS];
    for (slot, &(src, _)) in high.iter_mut().zip(spec.fd_targets) {
        *slot = sys::dup_above(src, HIGH_FD)?;
    }
    let mut max_target: RawFd = 2;
    for (&h, &(_, target)) in high.iter().zip(spec.fd_targets) {
        sys::dup_onto(h, target)?;
        max_target = max_target.max(target);
    }
    // Close everything above the targets except the two kept descriptors.
    let (lo, hi) = match landlock {
        Some(l) if l < chan => (l, chan),
        Some(l) => (chan, l),
        None => (chan, chan),
    };
    let first = (max_target + 1) as u32;
    sys::close_range(first, lo as u32 - 1)?;
    if hi != lo {
        sys::close_range(lo as u32 + 1, hi as u32 - 1)?;
    }
    sys::close_range(hi as u32 + 1, u32::MAX)?;
    Ok((chan, landlock))
}
