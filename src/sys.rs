//! The few raw system calls wfjail needs that neither `nix` nor `std` wraps, as safe functions.
//!
//! This is the only module allowed to use `unsafe`. Every block says why it is sound. Functions
//! marked *child-safe* neither allocate nor take locks: they may run in the child between
//! `clone` and `execve` (see `confine::apply`).

use std::ffi::CStr;
use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;

/// Result of a child-safe call: the error is a plain errno (no allocation).
pub type SysResult<T> = Result<T, Errno>;

fn check(ret: libc::c_long) -> SysResult<libc::c_long> {
    if ret < 0 { Err(Errno::last()) } else { Ok(ret) }
}

fn check_int(ret: libc::c_int) -> SysResult<libc::c_int> {
    if ret < 0 { Err(Errno::last()) } else { Ok(ret) }
}

// ---------------------------------------------------------------------------------------------
// Process creation

/// What `clone_process` returns in the parent.
#[derive(Debug)]
pub struct Cloned {
    pub pid: libc::pid_t,
    pub pidfd: OwnedFd,
}

/// Creates a child process with `clone(2)` (fork semantics, no shared memory) and the given
/// namespace flags, runs `child` in it, and returns the child's pid and a pidfd in the parent.
///
/// `child` runs in a copy of the parent's address space and must only make system calls: no
/// allocation, no locks (another thread of the parent may have held them at the time of the
/// clone). It should end with `execve` or [`exit_now`]; if it returns, the child exits 127.
pub fn clone_process(namespaces: libc::c_int, child: impl FnOnce()) -> io::Result<Cloned> {
    let mut pidfd: libc::c_int = -1;
    let flags = (namespaces | libc::CLONE_PIDFD | libc::SIGCHLD) as libc::c_ulong;
    // SAFETY: raw clone without CLONE_VM and with a null stack behaves like fork(2): the child
    // continues on a copy-on-write copy of this stack. The pidfd is written to `pidfd` (the
    // parent_tid argument when CLONE_PIDFD is set), which outlives the call. The child only runs
    // `child`, which by this function's contract makes system calls only, and never returns
    // into Rust code that could observe the duplicated state.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone,
            flags,
            std::ptr::null_mut::<libc::c_void>(),
            &mut pidfd as *mut libc::c_int,
            std::ptr::null_mut::<libc::c_int>(),
            0usize,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    if ret == 0 {
        child();
        exit_now(127);
    }
    // SAFETY: with CLONE_PIDFD the kernel stored a new, owned descriptor in `pidfd`.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    Ok(Cloned {
        pid: ret as libc::pid_t,
        pidfd,
    })
}

/// Sends `sig` to the process behind `pidfd` (no pid-reuse race).
pub fn pidfd_send_signal(pidfd: BorrowedFd<'_>, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: plain syscall with an fd we borrow for the duration and null siginfo.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A pidfd for `pid` (`pidfd_open`), to signal it without a pid-reuse race from now on.
pub fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: integer arguments; on success the kernel returns a new descriptor we own.
    let ret = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor from pidfd_open, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(ret as RawFd) })
}

/// Sends `sig` to `pid` (`kill(2)`). Only for a pid that cannot have been reused: one whose
/// task is blocked on our own seccomp notification, for instance.
pub fn kill_pid(pid: libc::pid_t, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: integer arguments only.
    if unsafe { libc::kill(pid, sig) } < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// How a reaped child ended, with its resource usage.
#[derive(Debug, Clone, Copy)]
pub struct Reaped {
    pub status: libc::c_int,
    pub rusage: libc::rusage,
}

impl Reaped {
    /// User plus system CPU time, in milliseconds.
    pub fn cpu_ms(&self) -> f64 {
        let ms = |t: libc::timeval| t.tv_sec as f64 * 1000.0 + t.tv_usec as f64 / 1000.0;
        ms(self.rusage.ru_utime) + ms(self.rusage.ru_stime)
    }

    /// Peak resident set size, in KiB.
    pub fn max_rss_kb(&self) -> u64 {
        self.rusage.ru_maxrss as u64
    }
}

/// `wait4(pid)`: reaps the child and returns its wait status and resource usage.
pub fn wait4(pid: libc::pid_t) -> io::Result<Reaped> {
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain old data; zero is a valid bit pattern.
    let mut rusage: libc::rusage = unsafe { zeroed() };
    loop {
        // SAFETY: both out-pointers are valid for writes for the duration of the call.
        let ret = unsafe { libc::wait4(pid, &mut status, libc::__WALL, &mut rusage) };
        if ret >= 0 {
            return Ok(Reaped { status, rusage });
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Child-safe confinement steps

/// Child-safe. `prctl(PR_SET_PDEATHSIG, sig)`.
pub fn set_parent_death_signal(sig: libc::c_int) -> SysResult<()> {
    // SAFETY: prctl with integer arguments only.
    check_int(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, sig as libc::c_ulong, 0, 0, 0) })
        .map(drop)
}

/// Child-safe. `getpid()` (in the caller's PID namespace).
pub fn getpid() -> libc::pid_t {
    // SAFETY: getpid takes no arguments and cannot fail.
    unsafe { libc::getpid() }
}

/// Child-safe. `unshare(flags)`.
pub fn unshare(flags: libc::c_int) -> SysResult<()> {
    // SAFETY: integer argument only.
    check_int(unsafe { libc::unshare(flags) }).map(drop)
}

/// Child-safe. Gives the calling process (the first of a new PID namespace) a mount
/// namespace of its own whose `/proc` shows only that PID namespace: every mount is made
/// private first, so that the new `/proc` never propagates back to the host.
pub fn private_proc() -> SysResult<()> {
    unshare(libc::CLONE_NEWNS)?;
    // SAFETY: NUL-terminated constant strings (or null where the kernel ignores the
    // argument); integer flags.
    check_int(unsafe {
        libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        )
    })?;
    // SAFETY: as above.
    check_int(unsafe {
        libc::mount(
            c"proc".as_ptr(),
            c"/proc".as_ptr(),
            c"proc".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            std::ptr::null(),
        )
    })
    .map(drop)
}

/// `mount(2)`: `source` of type `fstype` (`None`: a bind or propagation change) on `target`,
/// with `flags` and the file system's `data` options. For `wfjail learn`'s throw-away copies
/// (`learn::Throwaway`), in a mount namespace of wfjail's own.
pub fn mount(
    source: Option<&CStr>,
    target: &CStr,
    fstype: Option<&CStr>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> SysResult<()> {
    let ptr = |s: Option<&CStr>| s.map_or(std::ptr::null(), CStr::as_ptr);
    // SAFETY: every pointer is a NUL-terminated string that outlives the call, or null where
    // the kernel accepts null (no source for a propagation change, no type for a bind, no
    // options).
    check_int(unsafe {
        libc::mount(
            ptr(source),
            target.as_ptr(),
            ptr(fstype),
            flags,
            ptr(data).cast(),
        )
    })
    .map(drop)
}

/// `umount2(target, MNT_DETACH)`: the mount leaves the namespace now, and goes when its last
/// user does.
pub fn umount_detach(target: &CStr) -> SysResult<()> {
    // SAFETY: a NUL-terminated string and a constant flag.
    check_int(unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) }).map(drop)
}

/// Child-safe. Adds a Landlock rule granting `access` beneath `path` to `ruleset`.
pub fn landlock_add_path_rule(ruleset: RawFd, path: &CStr, access: u64) -> SysResult<()> {
    #[repr(C, packed)]
    struct PathBeneath {
        allowed_access: u64,
        parent_fd: i32,
    }
    // SAFETY: `path` is NUL-terminated; flags are constants.
    let fd = check_int(unsafe { libc::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) })?;
    let attr = PathBeneath {
        allowed_access: access,
        parent_fd: fd,
    };
    // SAFETY: `attr` is a live landlock_path_beneath_attr (packed, as the kernel's);
    // LANDLOCK_RULE_PATH_BENEATH = 1.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset,
            1,
            &attr as *const PathBeneath,
            0,
        )
    };
    let res = if r < 0 { Err(Errno::last()) } else { Ok(()) };
    // SAFETY: we own `fd`, opened above, and close it once.
    unsafe { libc::close(fd) };
    res
}

/// Child-safe. `sethostname(name)`.
pub fn sethostname(name: &[u8]) -> SysResult<()> {
    // SAFETY: the pointer and length describe a live slice.
    check_int(unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) }).map(drop)
}

/// Child-safe. Opens `path` write-only, writes all of `data`, closes it.
pub fn write_file(path: &CStr, data: &[u8]) -> SysResult<()> {
    // SAFETY: `path` is NUL-terminated; flags are constants.
    let fd = check_int(unsafe { libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) })?;
    let res = write_all(fd, data);
    // SAFETY: we own `fd`, opened above, and close it once.
    unsafe { libc::close(fd) };
    res
}

/// Child-safe. Writes all of `data` to `fd`, retrying on EINTR and short writes.
pub fn write_all(fd: RawFd, mut data: &[u8]) -> SysResult<()> {
    while !data.is_empty() {
        // SAFETY: the pointer and length describe a live slice.
        let n = unsafe { libc::write(fd, data.as_ptr().cast(), data.len()) };
        if n < 0 {
            let e = Errno::last();
            if e == Errno::EINTR {
                continue;
            }
            return Err(e);
        }
        data = data.get(n as usize..).unwrap_or(&[]);
    }
    Ok(())
}

/// Child-safe. `dup2(old, new)`, clearing close-on-exec on `new`. When `old == new` only the
/// close-on-exec flag is cleared.
pub fn dup_onto(old: RawFd, new: RawFd) -> SysResult<()> {
    if old == new {
        // SAFETY: fcntl with integer arguments on an fd number.
        check_int(unsafe { libc::fcntl(new, libc::F_SETFD, 0) }).map(drop)
    } else {
        // SAFETY: dup2 with integer arguments; the result is not close-on-exec.
        check_int(unsafe { libc::dup2(old, new) }).map(drop)
    }
}

/// Child-safe. `fcntl(fd, F_DUPFD_CLOEXEC, min)`: duplicates `fd` to the lowest free number
/// at or above `min`.
pub fn dup_above(fd: RawFd, min: RawFd) -> SysResult<RawFd> {
    // SAFETY: fcntl with integer arguments.
    check_int(unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, min) })
}

/// Child-safe. Closes every descriptor in `first..=last`.
pub fn close_range(first: u32, last: u32) -> SysResult<()> {
    if first > last {
        return Ok(());
    }
    // SAFETY: integer arguments only; descriptors closed here are owned by no live Rust
    // object in the child, which only runs to exec.
    check(unsafe { libc::syscall(libc::SYS_close_range, first, last, 0) }).map(drop)
}

/// Child-safe. Closes `fd`.
pub fn close(fd: RawFd) {
    // SAFETY: closing a number we were handed; errors are irrelevant before exec.
    unsafe { libc::close(fd) };
}

/// Child-safe. Gives the guest default signal handling: an empty signal mask (a
/// multi-threaded parent may block signals) and SIGPIPE back to its default (Rust ignores it
/// at start-up, and ignored signals stay ignored across exec).
pub fn reset_signals() -> SysResult<()> {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it.
    let mut set: libc::sigset_t = unsafe { zeroed() };
    // SAFETY: `set` is a valid sigset_t for both calls; the old mask is not requested.
    check_int(unsafe {
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut())
    })?;
    // SAFETY: resetting a disposition to SIG_DFL with a zeroed sigaction.
    let mut act: libc::sigaction = unsafe { zeroed() };
    act.sa_sigaction = libc::SIG_DFL;
    // SAFETY: `act` is valid for the call; the old action is not requested.
    check_int(unsafe { libc::sigaction(libc::SIGPIPE, &act, std::ptr::null_mut()) }).map(drop)
}

/// Child-safe. `setsid()`: a session and process group of the caller's own (it is not a
/// group leader: a child of `clone`).
pub fn new_session() -> SysResult<()> {
    // SAFETY: setsid takes no arguments and only changes this process's ids.
    check_int(unsafe { libc::setsid() }).map(drop)
}

/// Makes `cmd` start its program with an empty signal mask, whatever this thread blocks
/// (`wfjail serve` blocks SIGTERM and friends to read them from a signalfd).
pub fn unblock_signals_on_exec(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the hook runs in the forked child before exec and only calls sigemptyset and
    // sigprocmask, which are async-signal-safe and touch no shared state.
    unsafe {
        cmd.pre_exec(|| {
            let mut set: libc::sigset_t = zeroed();
            libc::sigemptyset(&mut set);
            if libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut()) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        })
    };
}

/// Child-safe. `prlimit64(0, resource, {soft, hard})` (lowering needs no privilege).
pub fn set_rlimit(resource: libc::c_int, soft: u64, hard: u64) -> SysResult<()> {
    let lim = libc::rlimit64 {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: `lim` is a valid rlimit64 for the duration of the call; old value not requested.
    check_int(unsafe { libc::prlimit64(0, resource as _, &lim, std::ptr::null_mut()) }).map(drop)
}

/// Child-safe. Drops every capability: bounding set (0..=last_cap), ambient set, then
/// effective/permitted/inheritable via capset. Returns whether the bounding set could be
/// cleared (it cannot without CAP_SETPCAP, which an unprivileged process outside a user
/// namespace lacks; harmless once no_new_privs is set).
pub fn drop_all_capabilities(last_cap: u32) -> SysResult<bool> {
    let mut bounding_cleared = true;
    for cap in 0..=last_cap {
        // SAFETY: prctl with integer arguments only.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) } < 0 {
            let e = Errno::last();
            if e == Errno::EPERM {
                bounding_cleared = false;
                break;
            }
            if e != Errno::EINVAL {
                return Err(e);
            }
        }
    }
    // SAFETY: prctl with integer arguments only. EINVAL means no ambient support: nothing to clear.
    let r = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    if r < 0 && Errno::last() != Errno::EINVAL {
        return Err(Errno::last());
    }
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut header = Header {
        version: 0x2008_0522,
        pid: 0,
    }; // _LINUX_CAPABILITY_VERSION_3
    let data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: header and two data structs as capset(2) expects for version 3.
    check(unsafe { libc::syscall(libc::SYS_capset, &mut header as *mut Header, data.as_ptr()) })?;
    Ok(bounding_cleared)
}

/// Child-safe. `personality(ADDR_NO_RANDOMIZE)`: the next exec lays out the address space
/// without randomisation (the flag survives exec; a set-id exec would clear it). Read back
/// after setting: a seccomp filter can fake success (`SECCOMP_RET_ERRNO` with 0), and then
/// the flag is not there (EPERM, as a refusal).
pub fn disable_address_randomization() -> SysResult<()> {
    const ADDR_NO_RANDOMIZE: libc::c_ulong = 0x0040000;
    // SAFETY: personality takes an integer; 0xffffffff only queries the current value.
    let current = unsafe { libc::personality(0xffff_ffff) };
    check_int(current)?;
    // SAFETY: as above, setting the persona with one more flag.
    check_int(unsafe { libc::personality(current as libc::c_ulong | ADDR_NO_RANDOMIZE) })?;
    // SAFETY: as above, a query.
    let now = check_int(unsafe { libc::personality(0xffff_ffff) })?;
    if now as libc::c_ulong & ADDR_NO_RANDOMIZE == 0 {
        return Err(Errno::EPERM);
    }
    Ok(())
}

/// Child-safe. `prctl(PR_SET_NO_NEW_PRIVS, 1)`.
pub fn set_no_new_privs() -> SysResult<()> {
    // SAFETY: prctl with integer arguments only.
    check_int(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) }).map(drop)
}

/// Child-safe. `landlock_restrict_self(ruleset, 0)`.
pub fn landlock_restrict_self(ruleset: RawFd) -> SysResult<()> {
    // SAFETY: integer arguments only.
    check(unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0u32) }).map(drop)
}

/// Child-safe. Installs a classic-BPF seccomp filter with `seccomp(SECCOMP_SET_MODE_FILTER)`.
/// With `SECCOMP_FILTER_FLAG_NEW_LISTENER` in `flags` the return value is the listener fd.
pub fn seccomp_install(program: &[libc::sock_filter], flags: libc::c_ulong) -> SysResult<RawFd> {
    let prog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_ptr() as *mut _,
    };
    // SAFETY: `prog` points at `program`, which is live for the call; the kernel copies it.
    check(unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            flags,
            &prog as *const _,
        )
    })
    .map(|fd| fd as RawFd)
}

/// Child-safe. Sends `data` with `fd` attached (SCM_RIGHTS) on a connected socket.
pub fn send_with_fd(sock: RawFd, data: &[u8], fd: RawFd) -> SysResult<()> {
    // Room for one int of ancillary data, aligned like cmsghdr.
    #[repr(C)]
    union Control {
        buf: [u8; 32],
        _align: libc::cmsghdr,
    }
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE(size_of::<RawFd>() as u32) } as usize;
    let mut control = Control { buf: [0; 32] };
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut _,
        iov_len: data.len(),
    };
    // SAFETY: msghdr is plain old data; zero is valid.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    // SAFETY: taking the address of a union field we initialised.
    msg.msg_control = unsafe { control.buf.as_mut_ptr() }.cast();
    msg.msg_controllen = space as _;
    // SAFETY: msg_control points at `space` <= 32 writable bytes, so CMSG_FIRSTHDR is non-null
    // and the header plus one int fit.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
    }
    loop {
        // SAFETY: msg and everything it points at are live for the call.
        let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(());
        }
        if Errno::last() != Errno::EINTR {
            return Err(Errno::last());
        }
    }
}

/// Receives one datagram/record into `buf` and at most one passed descriptor.
/// Returns `(bytes, fd)`; `(0, None)` is end-of-file.
pub fn recv_with_fd(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    #[repr(C)]
    union Control {
        buf: [u8; 64],
        _align: libc::cmsghdr,
    }
    let mut control = Control { buf: [0; 64] };
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain old data; zero is valid.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    // SAFETY: address of a union field we initialised.
    msg.msg_control = unsafe { control.buf.as_mut_ptr() }.cast();
    msg.msg_controllen = 64 as _;
    let n = loop {
        // SAFETY: msg and its buffers are live and writable for the call.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    };
    let mut fd = None;
    // SAFETY: the kernel filled msg_control/msg_controllen; the CMSG macros walk within it, and
    // an SCM_RIGHTS payload of at least one int holds a descriptor now owned by us.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let count =
                    ((*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / size_of::<RawFd>();
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                for i in 0..count {
                    let raw = std::ptr::read_unaligned(data.add(i));
                    let owned = OwnedFd::from_raw_fd(raw);
                    if fd.is_none() {
                        fd = Some(owned);
                    } // extra descriptors are dropped (closed)
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok((n, fd))
}

/// Child-safe. `execve(path, argv, envp)`; returns only on failure.
pub fn execve(path: &CStr, argv: &[*const libc::c_char], envp: &[*const libc::c_char]) -> Errno {
    // SAFETY: `path` is NUL-terminated; argv and envp are NULL-terminated arrays of pointers to
    // NUL-terminated strings that the caller keeps alive (prepared before fork).
    unsafe { libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
    Errno::last()
}

/// Child-safe. `_exit(code)`.
pub fn exit_now(code: libc::c_int) -> ! {
    // SAFETY: terminates the process without running any user-space cleanup.
    unsafe { libc::_exit(code) }
}

/// Child-safe. `poll` for `POLLHUP` on `fd` without waiting: true when the peer is gone.
pub fn peer_hung_up(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    let r = unsafe { libc::poll(&mut p, 1, 0) };
    r > 0 && p.revents & (libc::POLLHUP | libc::POLLERR) != 0
}

// ---------------------------------------------------------------------------------------------
// Seccomp user notification (supervisor side)

/// Whether a filter with a user-notification listener is sure to install in a child of this
/// process: the kernel has listeners (`SECCOMP_GET_NOTIF_SIZES` came with
/// `SECCOMP_FILTER_FLAG_NEW_LISTENER`, Linux 5.0) and this thread runs under no seccomp filter
/// (`PR_GET_SECCOMP` answers 0): only a filter above ours can refuse the install (its own
/// answer to `seccomp`, or EBUSY when it has a listener itself). When this says yes, the plan
/// leaves out the fall-back program the child would install instead (`plan::build`).
pub fn user_notification_certain() -> bool {
    under_no_seccomp_filter() && seccomp_notif_sizes().is_ok()
}

/// Whether the kernel says the calling thread runs under no seccomp filter (`PR_GET_SECCOMP`
/// answers 0; a filter may refuse the call, which reads as "maybe filtered"). One system call
/// where `procfs::seccomp_mode` opens and reads `/proc/self/status`.
pub fn under_no_seccomp_filter() -> bool {
    // SAFETY: PR_GET_SECCOMP takes no pointer and only reads the calling thread's mode.
    unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) == 0 }
}

/// Child-safe. `prctl(PR_SET_MEMORY_MERGE, 1)` (Linux 6.4+, 67): opts the calling process
/// into same-page merging as a whole; a fork inherits it and an exec keeps it (kernels with
/// "mm/ksm: support fork/exec for prctl"). EINVAL: a kernel without the prctl or without KSM.
pub fn set_memory_merge() -> SysResult<()> {
    // SAFETY: PR_SET_MEMORY_MERGE takes no pointer; it marks the calling process's own mappings.
    check_int(unsafe { libc::prctl(67, 1, 0, 0, 0) }).map(drop)
}

/// `prctl(PR_GET_MEMORY_MERGE)` (Linux 6.4+, 68): whether this process is opted into
/// same-page merging as a whole. EINVAL: a kernel without the prctl (before 6.4, or without
/// KSM); another error: a seccomp profile's refusal. Only reads.
pub fn memory_merge() -> SysResult<bool> {
    // SAFETY: PR_GET_MEMORY_MERGE takes no pointer and only reads the calling process's flag.
    let ret = unsafe { libc::prctl(68, 0, 0, 0, 0) };
    check_int(ret).map(|r| r != 0)
}

/// Kernel sizes of the notification structures (`SECCOMP_GET_NOTIF_SIZES`).
pub fn seccomp_notif_sizes() -> io::Result<libc::seccomp_notif_sizes> {
    // SAFETY: plain old data; zero is valid.
    let mut sizes: libc::seccomp_notif_sizes = unsafe { zeroed() };
    // SAFETY: the kernel writes a seccomp_notif_sizes into `sizes`.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_GET_NOTIF_SIZES,
            0,
            &mut sizes as *mut _,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(sizes)
    }
}

/// One seccomp notification, copied out of the kernel.
#[derive(Debug, Clone, Copy)]
pub struct Notif {
    pub id: u64,
    pub pid: u32,
    pub nr: i32,
    pub arch: u32,
    pub instruction_pointer: u64,
    pub args: [u64; 6],
}

/// Receives one notification. `buf` must be at least `seccomp_notif_sizes().seccomp_notif`
/// bytes and 8-byte aligned (use [`NotifBuf`]).
pub fn notif_recv(listener: BorrowedFd<'_>, buf: &mut NotifBuf) -> io::Result<Notif> {
    buf.0.fill(0);
    // SAFETY: the buffer is at least as large as the kernel's struct seccomp_notif (checked
    // when NotifBuf was built) and aligned for it; the kernel fills it.
    let ret = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_RECV,
            buf.0.as_mut_ptr(),
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel wrote a struct seccomp_notif at the start of the aligned buffer; its
    // prefix layout is fixed by the UAPI and read here by value.
    let n: libc::seccomp_notif = unsafe { std::ptr::read(buf.0.as_ptr().cast()) };
    Ok(Notif {
        id: n.id,
        pid: n.pid,
        nr: n.data.nr,
        arch: n.data.arch,
        instruction_pointer: n.data.instruction_pointer,
        args: n.data.args,
    })
}

/// An aligned receive buffer sized for this kernel's `struct seccomp_notif`.
pub struct NotifBuf(Vec<u64>);

impl NotifBuf {
    pub fn new() -> io::Result<Self> {
        let sizes = seccomp_notif_sizes()?;
        let bytes = (sizes.seccomp_notif as usize).max(size_of::<libc::seccomp_notif>());
        Ok(NotifBuf(vec![0u64; bytes.div_ceil(8)]))
    }
}

/// The supervisor's answer to a notification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotifAnswer {
    /// Let the syscall run as if there were no filter.
    Continue,
    /// Fail the syscall with this errno.
    Error(libc::c_int),
    /// Return this value without running the syscall.
    Value(i64),
}

/// Answers notification `id`. ENOENT (the task died or the syscall was interrupted) is
/// reported as an error for the caller to ignore.
pub fn notif_send(listener: BorrowedFd<'_>, id: u64, answer: NotifAnswer) -> io::Result<()> {
    // SAFETY: plain old data; zero is valid.
    let mut resp: libc::seccomp_notif_resp = unsafe { zeroed() };
    resp.id = id;
    match answer {
        NotifAnswer::Continue => resp.flags = libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32,
        NotifAnswer::Error(errno) => resp.error = -errno,
        NotifAnswer::Value(val) => resp.val = val,
    }
    // SAFETY: `resp` is a valid seccomp_notif_resp for the duration of the call.
    let ret = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_SEND,
            &mut resp as *mut _,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Answers notification `id` with a descriptor installed in the notifying task
/// (`SECCOMP_IOCTL_NOTIF_ADDFD` with `SECCOMP_ADDFD_FLAG_SEND`, Linux 5.14): the call
/// returns the new descriptor's number, atomically with the install. `cloexec`: the new
/// descriptor is close-on-exec.
pub fn notif_addfd_send(
    listener: BorrowedFd<'_>,
    id: u64,
    fd: BorrowedFd<'_>,
    cloexec: bool,
) -> io::Result<i32> {
    let mut add = libc::seccomp_notif_addfd {
        id,
        flags: libc::SECCOMP_ADDFD_FLAG_SEND as u32,
        srcfd: fd.as_raw_fd() as u32,
        newfd: 0,
        newfd_flags: if cloexec { libc::O_CLOEXEC as u32 } else { 0 },
    };
    // SAFETY: `add` is a valid seccomp_notif_addfd for the duration of the call; the kernel
    // only reads it.
    let ret = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_ADDFD,
            &mut add as *mut _,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// `openat2(dir, rel, {flags, mode, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS})`: opens `rel`
/// without leaving `dir` on the way, whatever symbolic links it meets (EXDEV if one leads
/// out), and without /proc's magic links.
pub fn openat2_beneath(
    dir: BorrowedFd<'_>,
    rel: &CStr,
    flags: u64,
    mode: u64,
) -> SysResult<OwnedFd> {
    openat2(
        dir,
        rel,
        flags,
        mode,
        libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS,
    )
}

/// `openat2(dir, path, {flags, mode, resolve})`.
pub fn openat2(
    dir: BorrowedFd<'_>,
    path: &CStr,
    flags: u64,
    mode: u64,
    resolve: u64,
) -> SysResult<OwnedFd> {
    // SAFETY: plain old data; zero is valid (the struct is non_exhaustive).
    let mut how: libc::open_how = unsafe { zeroed() };
    how.flags = flags;
    how.mode = mode;
    how.resolve = resolve;
    // SAFETY: `path` is NUL-terminated and `how` lives for the call, its size passed with it.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            path.as_ptr(),
            &how as *const libc::open_how,
            size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(Errno::last());
    }
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// One of the path operations the supervisor makes for a guest beneath a grant
/// (`notify/opener.rs`), each relative to a directory descriptor; a name is one
/// component.
pub enum PathOp<'a> {
    Mkdir {
        name: &'a CStr,
        mode: u32,
    },
    Unlink {
        name: &'a CStr,
        flags: i32,
    },
    Rename {
        from: &'a CStr,
        to_dir: BorrowedFd<'a>,
        to: &'a CStr,
        flags: u32,
    },
    Symlink {
        target: &'a CStr,
        name: &'a CStr,
    },
    Link {
        from: &'a CStr,
        to_dir: BorrowedFd<'a>,
        to: &'a CStr,
    },
}

/// Runs `op` relative to `dir` (`mkdirat`, `unlinkat`, `renameat2`, `symlinkat`, `linkat`).
pub fn path_op(dir: BorrowedFd<'_>, op: &PathOp<'_>) -> SysResult<()> {
    let d = dir.as_raw_fd();
    // SAFETY: every name is NUL-terminated and every descriptor is held by the caller for the
    // call; the kernel reads them only.
    let ret = unsafe {
        match op {
            PathOp::Mkdir { name, mode } => libc::mkdirat(d, name.as_ptr(), *mode as libc::mode_t),
            PathOp::Unlink { name, flags } => libc::unlinkat(d, name.as_ptr(), *flags),
            PathOp::Rename {
                from,
                to_dir,
                to,
                flags,
            } => libc::syscall(
                libc::SYS_renameat2,
                d,
                from.as_ptr(),
                to_dir.as_raw_fd(),
                to.as_ptr(),
                *flags,
            ) as libc::c_int,
            PathOp::Symlink { target, name } => libc::symlinkat(target.as_ptr(), d, name.as_ptr()),
            PathOp::Link { from, to_dir, to } => {
                libc::linkat(d, from.as_ptr(), to_dir.as_raw_fd(), to.as_ptr(), 0)
            }
        }
    };
    check_int(ret).map(drop)
}

/// `ftruncate` of a regular file (EISDIR for a directory and EINVAL for anything else, as
/// `truncate` answers).
pub fn ftruncate_regular(fd: BorrowedFd<'_>, len: i64) -> SysResult<()> {
    let meta = nix::sys::stat::fstat(fd)?;
    match meta.st_mode & libc::S_IFMT {
        libc::S_IFREG => {}
        libc::S_IFDIR => return Err(Errno::EISDIR),
        _ => return Err(Errno::EINVAL),
    }
    // SAFETY: ftruncate on a descriptor the caller holds.
    check_int(unsafe { libc::ftruncate(fd.as_raw_fd(), len) }).map(drop)
}

/// Process `pid`'s soft RLIMIT_FSIZE: `Some(None)` when unlimited, `None` when unreadable.
pub fn file_size_limit(pid: u32) -> Option<Option<u64>> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: prlimit with a null new limit only reads process `pid`'s into `lim`.
    let r = unsafe {
        libc::prlimit(
            pid as libc::pid_t,
            libc::RLIMIT_FSIZE,
            std::ptr::null(),
            &mut lim,
        )
    };
    if r != 0 {
        return None;
    }
    Some((lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur))
}

/// Sets this process's file mode creation mask, returning the previous one.
pub fn set_umask(mask: u32) -> u32 {
    // SAFETY: umask cannot fail.
    unsafe { libc::umask(mask as libc::mode_t) as u32 }
}

/// Clears `O_NONBLOCK` from a descriptor's status flags.
pub fn clear_nonblock(fd: BorrowedFd<'_>) -> SysResult<()> {
    // SAFETY: F_GETFL/F_SETFL on a descriptor we hold.
    let flags = check_int(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
    // SAFETY: as above.
    check_int(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK) })
        .map(drop)
}

/// Asks the kernel to wake the notifying task on the CPU that answers it
/// (`SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP`, Linux 6.6): an answered syscall — a virtual clock
/// read, a seeded `getrandom` — then returns in microseconds instead of waiting for the
/// scheduler. Best effort: older kernels answer EINVAL and nothing changes.
pub fn notif_sync_wake_up(listener: BorrowedFd<'_>) {
    const SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP: u64 = 1;
    // SAFETY: the kernel reads the flags as an integer argument; no memory is passed.
    let _ = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_SET_FLAGS,
            SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP,
        )
    };
}

/// True while notification `id` is still pending (its task alive and waiting). Checked after
/// reading the task's memory, so that what was read belongs to this syscall.
pub fn notif_id_valid(listener: BorrowedFd<'_>, id: u64) -> bool {
    let mut id = id;
    // SAFETY: the kernel reads a u64 from the pointer.
    unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_ID_VALID,
            &mut id as *mut u64,
        ) == 0
    }
}

/// Whether `process_vm_readv`/`process_vm_writev` work here. Container profiles of Docker
/// <= 22 and containerd < 1.7 allow them only with CAP_SYS_PTRACE; the kernel's own access
/// check always lets a process read itself, so a refusal to read our own memory is the
/// profile's. Then guest memory is read and written through `/proc/PID/mem`, which needs
/// the same access to the process and no extra syscall.
fn process_vm_usable() -> bool {
    static USABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *USABLE.get_or_init(|| {
        let probe = [0x5au8; 8];
        let mut back = [0u8; 8];
        let local = libc::iovec {
            iov_base: back.as_mut_ptr().cast(),
            iov_len: back.len(),
        };
        let remote = libc::iovec {
            iov_base: probe.as_ptr() as *mut libc::c_void,
            iov_len: probe.len(),
        };
        // SAFETY: both iovecs describe our own live buffers, of the stated lengths.
        let n = unsafe { libc::process_vm_readv(getpid(), &local, 1, &remote, 1, 0) };
        n == 8 && back == probe
    })
}

/// How guest memory is read and written here, for `wfjail check`.
pub fn guest_memory_route() -> &'static str {
    if process_vm_usable() {
        "process_vm_readv/process_vm_writev"
    } else {
        "/proc/PID/mem (this container's seccomp profile refuses process_vm_readv: Docker <= 22, containerd < 1.7)"
    }
}

/// Calls the seccomp filter this process already runs under (a container's profile) answers
/// itself. That filter stacks under wfjail's and an errno answer outranks a user
/// notification, so a guest's call to one of these fails without wfjail ever seeing it: no
/// violation is recorded. Each is probed here with arguments the kernel rejects harmlessly
/// (EFAULT, EBADF, EINVAL; `unshare(0)` does nothing), so EPERM, EACCES or ENOSYS can only
/// come from the outer filter. Empty when this process runs under no filter.
pub fn refused_by_outer_filter() -> &'static [&'static str] {
    static REFUSED: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    REFUSED.get_or_init(|| {
        // No filter above wfjail (the common case) needs no /proc read.
        if under_no_seccomp_filter() || crate::procfs::seccomp_mode() != Some(2) {
            return Vec::new();
        }
        let me = libc::c_long::from(getpid());
        let io_uring_enabled = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
            .map_or(true, |v| v.trim() == "0");
        #[allow(clippy::unnecessary_cast)] // PTRACE_PEEKUSER: c_uint on glibc, c_int on musl
        let probes: [(&'static str, libc::c_long, [libc::c_long; 5], bool); 13] = [
            ("unshare", libc::SYS_unshare, [0; 5], true),
            ("setns", libc::SYS_setns, [-1, 0, 0, 0, 0], true),
            ("mount", libc::SYS_mount, [0; 5], true),
            ("umount2", libc::SYS_umount2, [0; 5], true),
            ("chroot", libc::SYS_chroot, [0; 5], true),
            ("keyctl", libc::SYS_keyctl, [-1, 0, 0, 0, 0], true),
            ("add_key", libc::SYS_add_key, [0; 5], true),
            ("request_key", libc::SYS_request_key, [0; 5], true),
            (
                "perf_event_open",
                libc::SYS_perf_event_open,
                [0, 0, -1, -1, 0],
                true,
            ),
            ("kcmp", libc::SYS_kcmp, [me, me, 0xff, 0, 0], true),
            (
                "pidfd_getfd",
                libc::SYS_pidfd_getfd,
                [-1, -1, 0, 0, 0],
                true,
            ),
            (
                "ptrace",
                libc::SYS_ptrace,
                [libc::c_long::from(libc::PTRACE_PEEKUSER as i32), 0, 0, 0, 0],
                true,
            ),
            (
                "io_uring_setup",
                libc::SYS_io_uring_setup,
                [1, 0, 0, 0, 0],
                io_uring_enabled,
            ),
        ];
        let mut refused = Vec::new();
        for (name, nr, a, meaningful) in probes {
            if !meaningful {
                continue;
            }
            // SAFETY: every argument is a null pointer, an invalid descriptor or an invalid
            // operation the kernel rejects before acting; unshare(0) changes nothing.
            let r = unsafe { libc::syscall(nr, a[0], a[1], a[2], a[3], a[4]) };
            let errno = Errno::last();
            if r == -1 && matches!(errno, Errno::EPERM | Errno::EACCES | Errno::ENOSYS) {
                refused.push(name);
            }
        }
        if !process_vm_usable() {
            refused.extend(["process_vm_readv", "process_vm_writev"]);
        }
        refused
    })
}

/// `/proc/PID/mem` of process `pid`, for reading (or writing).
fn proc_mem(pid: libc::pid_t, write: bool) -> io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .read(!write)
        .write(write)
        .open(format!("/proc/{pid}/mem"))
}

/// Reads up to `buf.len()` bytes at `addr` in process `pid` (`process_vm_readv`).
pub fn read_process_memory(pid: libc::pid_t, addr: u64, buf: &mut [u8]) -> io::Result<usize> {
    if !process_vm_usable() {
        return std::os::unix::fs::FileExt::read_at(&proc_mem(pid, false)?, buf, addr);
    }
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: `local` describes our writable buffer; `remote` is only dereferenced by the kernel
    // in the other process, with its own checks.
    let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Writes `data` at `addr` in process `pid` (`process_vm_writev`); returns how many bytes the
/// kernel wrote (fewer when the range ends in unmapped or read-only memory).
pub fn write_process_memory(pid: libc::pid_t, addr: u64, data: &[u8]) -> io::Result<usize> {
    if !process_vm_usable() {
        return std::os::unix::fs::FileExt::write_at(&proc_mem(pid, true)?, data, addr);
    }
    let local = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: `local` describes our readable buffer (the kernel only reads it); `remote` is
    // only dereferenced by the kernel in the other process, with its own checks.
    let n = unsafe { libc::process_vm_writev(pid, &local, 1, &remote, 1, 0) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// `/proc/PID/mem` of process `pid`, to read and write: the memory of the process `pid` is
/// when it is opened (the descriptor keeps to it), and a write goes through protections (a
/// text page is copied for that process only, like a debugger's breakpoint). Needs the
/// access `process_vm_writev` needs (the same uid, ptrace access: an ancestor under Yama's
/// `ptrace_scope = 1`); a kernel may refuse writes through protections
/// (`proc_mem.force_override`, Linux 6.12).
pub fn open_process_memory(pid: libc::pid_t) -> io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/mem"))
}

// ---------------------------------------------------------------------------------------------
// The exec stop (parent side): a child traced from its initial exec until its new image is
// patched (answers/vdso.rs), then let go.

/// Traces `pid` (which must not run yet: it waits on its `execve` notification) so that its
/// exec stops it before the new image runs (`PTRACE_O_TRACEEXEC`), and kills it should wfjail
/// die while it holds it (`PTRACE_O_EXITKILL`).
pub fn ptrace_seize_for_exec(pid: libc::pid_t) -> io::Result<()> {
    let opts = (libc::PTRACE_O_TRACEEXEC | libc::PTRACE_O_EXITKILL) as libc::c_long;
    // SAFETY: PTRACE_SEIZE takes no pointers; the kernel checks that we may trace `pid`.
    let r = unsafe {
        libc::ptrace(
            libc::PTRACE_SEIZE,
            pid,
            std::ptr::null_mut::<libc::c_void>(),
            opts,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Writes one 8-byte word at `addr` in the stopped tracee `pid` (`PTRACE_POKEDATA`, which may
/// write read-only private pages, the way a debugger sets a breakpoint: the page is copied).
pub fn ptrace_poke(pid: libc::pid_t, addr: u64, word: [u8; 8]) -> io::Result<()> {
    let data = i64::from_ne_bytes(word);
    // SAFETY: POKEDATA passes `data` by value and dereferences `addr` only in the tracee,
    // with the kernel's own checks; nothing of ours is written.
    let r = unsafe {
        libc::ptrace(
            libc::PTRACE_POKEDATA,
            pid,
            addr as *mut libc::c_void,
            data as *mut libc::c_void,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Resumes the tracee `pid` with signal `sig` (0: none) and stays its tracer.
pub fn ptrace_cont(pid: libc::pid_t, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: PTRACE_CONT passes the signal number by value; no memory is touched.
    let r = unsafe {
        libc::ptrace(
            libc::PTRACE_CONT,
            pid,
            std::ptr::null_mut::<libc::c_void>(),
            sig as libc::c_long,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Stops tracing `pid` and resumes it.
pub fn ptrace_detach(pid: libc::pid_t) -> io::Result<()> {
    // SAFETY: PTRACE_DETACH with no signal touches no memory.
    let r = unsafe {
        libc::ptrace(
            libc::PTRACE_DETACH,
            pid,
            std::ptr::null_mut::<libc::c_void>(),
            0 as libc::c_long,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// What a traced child is doing, seen without reaping it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Traced {
    /// Nothing to report yet.
    Running,
    /// Stopped at its exec (`PTRACE_EVENT_EXEC`): the new image is mapped, none of it ran.
    ExecStop,
    /// Stopped for another reason (a signal to pass on).
    OtherStop(libc::c_int),
    /// It exited or was killed; its status is left for whoever reaps it.
    Gone,
}

/// Polls the traced child `pid` (`waitid` with `WNOHANG | WNOWAIT`: an exit stays for the
/// supervisor's own wait).
pub fn traced_state(pid: libc::pid_t) -> io::Result<Traced> {
    // SAFETY: siginfo_t is plain data that the kernel fills; all-zero is a valid value.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let flags = libc::WEXITED | libc::WSTOPPED | libc::WNOHANG | libc::WNOWAIT | libc::__WALL;
    // SAFETY: `info` is a valid, writable siginfo_t for the kernel to fill.
    let r = unsafe { libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, flags) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: waitid filled `info` (si_pid 0 means nothing was waitable under WNOHANG); the
    // accessors read the SIGCHLD fields that waitid always sets.
    let (child, status) = unsafe { (info.si_pid(), info.si_status()) };
    if child == 0 {
        return Ok(Traced::Running);
    }
    Ok(match info.si_code {
        libc::CLD_TRAPPED if status == (libc::SIGTRAP | (libc::PTRACE_EVENT_EXEC << 8)) => {
            Traced::ExecStop
        }
        libc::CLD_TRAPPED | libc::CLD_STOPPED => Traced::OtherStop(status & 0x7f),
        _ => Traced::Gone,
    })
}

/// The value of auxiliary-vector entry `key` of process `pid` (`/proc/PID/auxv`).
pub fn auxv_entry(pid: libc::pid_t, key: u64) -> io::Result<Option<u64>> {
    let raw = std::fs::read(format!("/proc/{pid}/auxv"))?;
    Ok(raw
        .chunks_exact(16)
        .map(|c| {
            (
                u64::from_ne_bytes(c[..8].try_into().unwrap()),
                u64::from_ne_bytes(c[8..].try_into().unwrap()),
            )
        })
        .take_while(|&(k, _)| k != 0)
        .find(|&(k, _)| k == key)
        .map(|(_, v)| v))
}

// ---------------------------------------------------------------------------------------------
// Probes (parent side)

/// The Landlock ABI version of the running kernel, or the errno explaining its absence
/// (ENOSYS: not built in; EOPNOTSUPP: built in but disabled at boot).
pub fn landlock_abi() -> Result<u32, Errno> {
    const LANDLOCK_CREATE_RULESET_VERSION: u32 = 1;
    // SAFETY: the version query takes a null attribute pointer and size 0.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if r < 0 {
        Err(Errno::last())
    } else {
        Ok(r as u32)
    }
}

/// Whether this process is single-threaded (fork from a multi-threaded process is allowed by
/// our child code, but the `run` path asserts it to catch accidental threads early).
pub fn thread_count() -> Option<usize> {
    std::fs::read_dir("/proc/self/task").ok().map(|d| d.count())
}

// ---------------------------------------------------------------------------------------------
// File metadata as the kernel lays it out (the supervisor answers a guest's fd-based stat)

/// The sizes of the kernel's x86_64 structs that answers write into a guest's memory (what
/// the kernel itself copies out for the call). Never `size_of::<libc::T>()`: the libc
/// crate's types are the C library's, not the kernel's, and wfjail may be built with either
/// (musl's `rusage` carries a 128-byte reserved tail, 272 bytes; its `sysinfo` 256, 368
/// bytes): an answer must not depend on which. `sys::tests` checks each against the kernel.
pub mod kernel_abi {
    /// `struct stat` (`fstat`, `newfstatat`).
    pub const STAT: usize = 144;
    /// `struct statx`.
    pub const STATX: usize = 256;
    /// `struct statfs` (`statfs`, `fstatfs`).
    pub const STATFS: usize = 120;
    /// `struct rusage` (`getrusage`).
    pub const RUSAGE: usize = 144;
    /// `struct tms` (`times`).
    pub const TMS: usize = 32;
    /// `struct sysinfo`.
    pub const SYSINFO: usize = 112;
    /// `struct timespec` (`clock_gettime`) and `struct timeval` (`gettimeofday`).
    pub const TIMESPEC: usize = 16;
    /// `struct timezone` (`gettimeofday`).
    pub const TIMEZONE: usize = 8;
}

/// Opens `path` `O_PATH | O_CLOEXEC` (a handle that opens nothing: no pipe end, no device).
/// Not through `std::fs::OpenOptions::custom_flags`: std masks custom flags with the C
/// library's `O_ACCMODE`, which is `03 | O_PATH` on musl, so a musl build silently opened the
/// file for reading instead (and a socket's `/proc/PID/fd/N` failed with ENXIO).
pub fn open_path(path: &CStr) -> io::Result<OwnedFd> {
    // SAFETY: `path` is NUL-terminated; flags are constants.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a descriptor we just opened and own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The first `N` bytes of what the kernel writes to the buffer `call` is given (its return
/// value: negative on failure, with errno set). The buffer is [`KERNEL_OUT_MAX`] bytes, more
/// than any of [`kernel_abi`]'s structs, so that memory safety does not rest on their sizes
/// (which `sys::tests` checks against the kernel).
fn kernel_out<const N: usize>(call: impl FnOnce(*mut u8) -> libc::c_long) -> io::Result<[u8; N]> {
    const { assert!(N <= KERNEL_OUT_MAX) };
    let mut buf = [0u8; KERNEL_OUT_MAX];
    if call(buf.as_mut_ptr()) < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(buf[..N].try_into().expect("N <= KERNEL_OUT_MAX"))
}

/// The scratch buffer of [`kernel_out`].
const KERNEL_OUT_MAX: usize = 512;

/// `struct stat` of `fd` as raw bytes (`newfstatat(fd, "", AT_EMPTY_PATH)`): what the kernel
/// copies to a guest's `fstat` buffer.
pub fn fstat_raw(fd: BorrowedFd<'_>) -> io::Result<[u8; kernel_abi::STAT]> {
    kernel_out(|buf| {
        // SAFETY: the kernel writes one `struct stat` (144 bytes) into `buf`, which has room
        // for KERNEL_OUT_MAX; the path is an empty C string.
        unsafe {
            libc::syscall(
                libc::SYS_newfstatat,
                fd.as_raw_fd(),
                c"".as_ptr(),
                buf,
                libc::AT_EMPTY_PATH,
            )
        }
    })
}

/// `struct statx` of `fd` as raw bytes (`statx(fd, "", AT_EMPTY_PATH | sync, mask)`).
pub fn statx_raw(fd: BorrowedFd<'_>, sync: u32, mask: u32) -> io::Result<[u8; kernel_abi::STATX]> {
    kernel_out(|buf| {
        // SAFETY: the kernel writes one `struct statx` (256 bytes) into `buf`, which has room
        // for KERNEL_OUT_MAX; the path is an empty C string; the flags and mask are plain
        // integers.
        unsafe {
            libc::syscall(
                libc::SYS_statx,
                fd.as_raw_fd(),
                c"".as_ptr(),
                libc::AT_EMPTY_PATH as u32 | (sync & libc::AT_STATX_SYNC_TYPE as u32),
                mask,
                buf,
            )
        }
    })
}

/// `struct statfs` of `fd` as raw bytes (`fstatfs`): what the kernel copies to a guest's
/// `statfs`/`fstatfs` buffer.
pub fn fstatfs_raw(fd: BorrowedFd<'_>) -> io::Result<[u8; kernel_abi::STATFS]> {
    // SAFETY: the kernel writes one `struct statfs` (120 bytes) into `buf`, which has room
    // for KERNEL_OUT_MAX.
    kernel_out(|buf| unsafe { libc::syscall(libc::SYS_fstatfs, fd.as_raw_fd(), buf) })
}

/// Runs `probe` in a fresh child created with `flags`; returns the errno it failed with.
/// `check`'s probes, and `process`'s of root's user-namespace id maps, both try a step the
/// way the confined child takes it.
pub fn probe_in_child(
    flags: libc::c_int,
    probe: impl Fn() -> Result<(), nix::errno::Errno>,
) -> Result<(), nix::errno::Errno> {
    match clone_process(flags, || {
        let code = match probe() {
            Ok(()) => 0,
            Err(e) => (e as i32).clamp(1, 255),
        };
        exit_now(code)
    }) {
        Err(e) => Err(nix::errno::Errno::from_raw(
            e.raw_os_error().unwrap_or(libc::EPERM),
        )),
        Ok(c) => {
            let r = wait4(c.pid).map_err(|_| nix::errno::Errno::ECHILD)?;
            if libc::WIFEXITED(r.status) && libc::WEXITSTATUS(r.status) == 0 {
                Ok(())
            } else if libc::WIFEXITED(r.status) {
                Err(nix::errno::Errno::from_raw(libc::WEXITSTATUS(r.status)))
            } else {
                Err(nix::errno::Errno::ECHILD)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How many bytes the kernel writes to the buffer that syscall `nr` gets as argument
    /// `out` (of `args`, the others as given): the buffer is filled with two different
    /// patterns in turn, and every byte the kernel writes differs from at least one of them,
    /// so the furthest byte changed in either run ends the struct.
    fn written(nr: libc::c_long, mut args: [usize; 5], out: usize) -> usize {
        [0xa5u8, 0x5a]
            .iter()
            .map(|&fill| {
                let mut buf = [fill; KERNEL_OUT_MAX];
                args[out] = buf.as_mut_ptr() as usize;
                let [a, b, c, d, e] = args;
                // SAFETY: every call made here writes one struct of at most KERNEL_OUT_MAX
                // bytes to argument `out`, which points at `buf`; the other arguments are
                // numbers, empty C strings or NULL.
                let r = unsafe { libc::syscall(nr, a, b, c, d, e) };
                assert!(r >= 0, "syscall {nr}: {}", io::Error::last_os_error());
                buf.iter().rposition(|&b| b != fill).map_or(0, |i| i + 1)
            })
            .max()
            .unwrap()
    }

    #[test]
    fn every_struct_an_answer_writes_has_the_size_the_kernel_writes() {
        let dir = std::fs::File::open("/").unwrap();
        let (fd, empty) = (dir.as_raw_fd() as usize, c"".as_ptr() as usize);
        let at_empty = libc::AT_EMPTY_PATH as usize;
        let cases = [
            (
                "stat",
                libc::SYS_newfstatat,
                [fd, empty, 0, at_empty, 0],
                2,
                kernel_abi::STAT,
            ),
            (
                "statx",
                libc::SYS_statx,
                [fd, empty, at_empty, libc::STATX_ALL as usize, 0],
                4,
                kernel_abi::STATX,
            ),
            (
                "statfs",
                libc::SYS_fstatfs,
                [fd, 0, 0, 0, 0],
                1,
                kernel_abi::STATFS,
            ),
            (
                "rusage",
                libc::SYS_getrusage,
                [0, 0, 0, 0, 0],
                1,
                kernel_abi::RUSAGE,
            ),
            ("tms", libc::SYS_times, [0; 5], 0, kernel_abi::TMS),
            ("sysinfo", libc::SYS_sysinfo, [0; 5], 0, kernel_abi::SYSINFO),
            (
                "timespec",
                libc::SYS_clock_gettime,
                [0; 5],
                1,
                kernel_abi::TIMESPEC,
            ),
            (
                "timeval",
                libc::SYS_gettimeofday,
                [0; 5],
                0,
                kernel_abi::TIMESPEC,
            ),
            (
                "timezone",
                libc::SYS_gettimeofday,
                [0; 5],
                1,
                kernel_abi::TIMEZONE,
            ),
        ];
        for (what, nr, args, out, size) in cases {
            assert_eq!(written(nr, args, out), size, "struct {what}");
        }
        // The C library's own types are not the kernel's on musl (what this module avoids).
        if cfg!(target_env = "musl") {
            assert_ne!(size_of::<libc::rusage>(), kernel_abi::RUSAGE);
            assert_ne!(size_of::<libc::sysinfo>(), kernel_abi::SYSINFO);
        }
    }

    #[test]
    fn open_path_opens_a_sockets_proc_link_without_opening_the_socket() {
        use std::os::unix::net::UnixStream;
        let (a, _b) = UnixStream::pair().unwrap();
        let link = std::ffi::CString::new(format!("/proc/self/fd/{}", a.as_raw_fd())).unwrap();
        // Opening the socket itself fails with ENXIO: only O_PATH reaches it.
        let fd = open_path(&link).expect("O_PATH reaches a socket");
        let flags = fcntl_getfl(fd.as_raw_fd());
        assert_ne!(flags & libc::O_PATH, 0, "opened O_PATH ({flags:#o})");
    }

    fn fcntl_getfl(fd: RawFd) -> libc::c_int {
        // SAFETY: F_GETFL on a descriptor we own reads its flags and changes nothing.
        unsafe { libc::fcntl(fd, libc::F_GETFL) }
    }
}
