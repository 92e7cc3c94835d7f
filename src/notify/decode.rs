//! Turning a seccomp notification into a violation: category, readable arguments, the rule
//! that forbids it, and a hint. Guest memory is read through [`GuestMemory`]
//! (`process_vm_readv` for a live guest) and trusted only after the caller's
//! `SECCOMP_IOCTL_NOTIF_ID_VALID` confirms the call is still pending (`notify::handle`).
//! [`decode`] reads nothing but guest memory; [`classify`] also judges watched writes and
//! locks against the file system (`paths.rs`).

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::policy::bpf;
use crate::policy::decisions::{Check, Decision, Decisions, watched_paths};
use crate::policy::syscalls::{self, Args, Category};
use crate::sys::Notif;

use std::path::PathBuf;

use super::paths::{self, Grants, PathJudgement};
use crate::guest_memory::GuestMemory;

/// A decoded notification (before the supervisor decides what to do with it).
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    pub category: Category,
    pub syscall: String,
    pub args: String,
    pub rule: String,
    /// Never let this call proceed, whatever `on_violation` says.
    pub always_deny: bool,
    /// The errno a denied call fails with (EACCES for file-system writes, like Landlock).
    pub errno: i32,
    /// A hint more precise than the category's.
    pub hint: Option<&'static str>,
}

/// What a session child that opens a file after the zygote preloaded should do instead.
pub const LATE_IMPORT_HINT: &str = "the workflow opened a file after preload (a late import?); import this module at load time (wfjail serve --preload)";

/// A write outside `filesystem.write`: the grant that would allow it is `--rw`, not `--ro`.
pub const WRITE_HINT: &str = "writing outside filesystem.write is denied in workflow code; do file I/O in an activity, or grant the directory with --rw (or [filesystem] write)";
/// A Unix socket: most often glibc asking nscd (user and host lookups), not the workflow.
pub const UNIX_SOCKET_HINT: &str = "Unix sockets are denied in workflow code; glibc makes one to ask nscd for user and host lookups (getpwnam, getaddrinfo, ~ without HOME) and then reads /etc itself: keep HOME set, and do lookups and connections in an activity";

fn fs_violation(name: &str, args: String, rule: &str) -> Decoded {
    Decoded {
        category: Category::Filesystem,
        syscall: name.to_string(),
        args,
        rule: rule.into(),
        always_deny: false,
        errno: libc::EACCES,
        hint: Some(WRITE_HINT),
    }
}

const OUTSIDE_RULE: &str = "filesystem.write does not grant this path";
const READ_OUTSIDE_RULE: &str = "filesystem.read does not grant this path";
const READ_HINT: &str = "reading outside filesystem.read is denied in workflow code; grant the file or its directory with --ro (or [filesystem] read), or read it in an activity";

/// The open flags that make an open a write.
pub const OPEN_WRITE_BITS: u64 =
    (libc::O_WRONLY | libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC) as u64;

/// What an open call asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenArgs {
    pub flags: u64,
    pub mode: u64,
    /// `openat2`'s resolve flags (0 for the other calls).
    pub resolve: u64,
}

/// The [`OpenArgs`] of open call `name` with arguments `a`: `openat2`'s `struct open_how`
/// read from guest memory once (all of it: the kernel copies all of it, and fails with
/// EFAULT what it cannot), `creat` as the open it is; `None` for other calls or an
/// unreadable `open_how`.
pub fn open_args(name: &str, a: &[u64; 6], mem: &dyn GuestMemory) -> Option<OpenArgs> {
    let (flags, mode, resolve) = match name {
        "open" => (a[1], a[2], 0),
        "openat" => (a[2], a[3], 0),
        // struct open_how { u64 flags; u64 mode; u64 resolve; }
        "openat2" => {
            let how = mem.read_bytes(a[2], 24)?;
            let word = |i: usize| -> Option<u64> {
                Some(u64::from_ne_bytes(
                    how.get(i * 8..i * 8 + 8)?.try_into().ok()?,
                ))
            };
            (word(0)?, word(1)?, word(2)?)
        }
        "creat" => (
            (libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC) as u64,
            a[1],
            0,
        ),
        _ => return None,
    };
    Some(OpenArgs {
        flags,
        mode,
        resolve,
    })
}

/// A read-only open (`open`, `openat`, `openat2`) judged against `reads`: the violation when
/// its path is outside them. Only `wfjail run` under `on_violation = "warn"` asks (there
/// Landlock lets everything through, so that a read the policy would deny runs and is
/// reported).
pub fn check_read(n: &Notif, mem: &dyn GuestMemory, name: &str, reads: &Grants) -> Option<Decoded> {
    let a = &n.args;
    let flags = open_args(name, a, mem)?.flags;
    if flags & OPEN_WRITE_BITS != 0 {
        return None;
    }
    let (dirfd_arg, path_arg, _) = watched_paths(name)[0];
    let dirfd = dirfd_arg.map_or(libc::AT_FDCWD, |i| a[i] as i32);
    let raw = mem.read_path(a[path_arg]).ok()?;
    let full = paths::guest_path(dirfd, &raw);
    let follow = flags & libc::O_NOFOLLOW as u64 == 0;
    let shown = match reads.judge(n.pid, &full, follow, true) {
        PathJudgement::Granted => return None,
        PathJudgement::Outside(p) => p.display().to_string(),
        PathJudgement::CannotJudge(_) => paths::display(n.pid, &full).display().to_string(),
    };
    Some(Decoded {
        category: Category::Filesystem,
        syscall: name.to_string(),
        args: format!("{shown} (read)"),
        rule: READ_OUTSIDE_RULE.into(),
        always_deny: false,
        errno: libc::EACCES,
        hint: Some(READ_HINT),
    })
}
const CANNOT_JUDGE_RULE: &str =
    "a write the supervisor cannot judge is refused (filesystem.write must be shown to grant it)";

/// For a watched file-system call: `None` when every path it writes is granted (or bound to
/// fail in the kernel below a granted directory), else the violation naming the first path
/// outside the grants, or saying why it could not be judged.
fn check_writes(
    n: &Notif,
    mem: &dyn GuestMemory,
    name: &str,
    grants: &Grants,
    late_reads: bool,
) -> Option<Decoded> {
    let a = &n.args;
    let open = open_args(name, a, mem);
    let flags = open.map(|o| o.flags);
    if let Some(flags) = flags
        && flags & OPEN_WRITE_BITS == 0
    {
        // A read: only watched in prefork mode after preload, where it is a late import.
        if !late_reads {
            return None;
        }
        let (dirfd_arg, path_arg, _) = watched_paths(name)[0];
        let dirfd = dirfd_arg.map_or(libc::AT_FDCWD, |i| a[i] as i32);
        let shown = match mem.read_path(a[path_arg]) {
            Ok(p) => paths::display(n.pid, &paths::guest_path(dirfd, &p))
                .display()
                .to_string(),
            Err(e) => e.to_string(),
        };
        return Some(Decoded {
            category: Category::Filesystem,
            syscall: name.to_string(),
            args: format!("{shown} (read)"),
            rule: "zygote.reads_after_preload = \"deny\"".into(),
            always_deny: false,
            errno: libc::EACCES,
            hint: Some(LATE_IMPORT_HINT),
        });
    }
    if let Some(o) = open
        && o.resolve & libc::RESOLVE_IN_ROOT != 0
        && let Some(v) = in_root_write(n, mem, name, grants)
    {
        return v;
    }
    // O_NOFOLLOW, and O_CREAT|O_EXCL, do not follow a final symlink.
    let excl = (libc::O_CREAT | libc::O_EXCL) as u64;
    let open_follows = flags.is_none_or(|f| f & libc::O_NOFOLLOW as u64 == 0 && f & excl != excl);
    for &(dirfd_arg, path_arg, follow) in watched_paths(name) {
        let raw = match mem.read_path(a[path_arg]) {
            Ok(p) => p,
            Err(e) => {
                return Some(fs_violation(
                    name,
                    format!("{:#x} (write; cannot judge: {e})", a[path_arg]),
                    CANNOT_JUDGE_RULE,
                ));
            }
        };
        let follow = match (name, path_arg) {
            // linkat's source: AT_SYMLINK_FOLLOW, or AT_EMPTY_PATH (the descriptor itself).
            ("linkat", 1) => a[4] & libc::AT_SYMLINK_FOLLOW as u64 != 0 || raw.is_empty(),
            _ => follow && open_follows,
        };
        let dirfd = dirfd_arg.map_or(libc::AT_FDCWD, |i| a[i] as i32);
        let full = paths::guest_path(dirfd, &raw);
        match grants.judge(n.pid, &full, follow, true) {
            PathJudgement::Granted => {}
            PathJudgement::Outside(p) => {
                return Some(fs_violation(
                    name,
                    format!("{} (write)", p.display()),
                    OUTSIDE_RULE,
                ));
            }
            PathJudgement::CannotJudge(why) => {
                return Some(fs_violation(
                    name,
                    format!(
                        "{} (write; cannot judge: {why})",
                        paths::display(n.pid, &full).display()
                    ),
                    CANNOT_JUDGE_RULE,
                ));
            }
        }
    }
    None
}

/// A write-open by `openat2` with `RESOLVE_IN_ROOT`: its path is resolved inside the guest's
/// directory, not from `/`. Where that directory lies in the grants, the open cannot leave
/// them (the supervisor makes it, `opener.rs`): granted. Under `/` it is an ordinary path
/// (`None`: judged as one). Elsewhere the supervisor's resolution cannot follow it: refused.
fn in_root_write(
    n: &Notif,
    mem: &dyn GuestMemory,
    name: &str,
    grants: &Grants,
) -> Option<Option<Decoded>> {
    let dir = paths::guest_dir(n.args[0] as i32);
    if let paths::GrantedOpen::Beneath(..) = grants.granted_target(n.pid, &dir, true) {
        return Some(None);
    }
    let shown = paths::display(n.pid, &dir);
    if std::fs::canonicalize(&shown).is_ok_and(|p| p == std::path::Path::new("/")) {
        return None;
    }
    let path = mem
        .read_path(n.args[1])
        .map(|p| String::from_utf8_lossy(&p).into_owned())
        .unwrap_or_default();
    Some(Some(fs_violation(
        name,
        format!(
            "{path} in root {} (write; cannot judge: RESOLVE_IN_ROOT in a directory outside \
             filesystem.write)",
            shown.display()
        ),
        CANNOT_JUDGE_RULE,
    )))
}

/// `fcntl` record locks and `flock`: allowed on files under the write grants (and always to
/// unlock), else a violation — a lock on a host file is held against host processes.
fn check_lock(n: &Notif, mem: &dyn GuestMemory, name: &str, grants: &Grants) -> Option<Decoded> {
    let a = &n.args;
    let fd = a[0] as i32;
    let (what, unlock) = if name == "flock" {
        let op = a[1] & 0xffff_ffff & !(libc::LOCK_NB as u64);
        let what = match op as i32 {
            libc::LOCK_SH => "LOCK_SH".to_string(),
            libc::LOCK_EX => "LOCK_EX".to_string(),
            libc::LOCK_UN => "LOCK_UN".to_string(),
            _ => format!("operation {:#x}", a[1]),
        };
        (what, op == libc::LOCK_UN as u64)
    } else {
        // struct flock starts with `short l_type`.
        let l_type = mem
            .read_bytes(a[2], 2)
            .filter(|b| b.len() == 2)
            .map(|b| i16::from_ne_bytes([b[0], b[1]]));
        let ty = match l_type.map(i32::from) {
            Some(libc::F_RDLCK) => "F_RDLCK".to_string(),
            Some(libc::F_WRLCK) => "F_WRLCK".to_string(),
            Some(libc::F_UNLCK) => "F_UNLCK".to_string(),
            Some(t) => format!("type {t}"),
            None => "an unreadable struct flock".to_string(),
        };
        let cmd = syscalls::fcntl_name(a[1]).unwrap_or("?");
        (format!("{cmd} {ty}"), l_type == Some(libc::F_UNLCK as i16))
    };
    let path = PathBuf::from(format!("/proc/self/fd/{fd}"));
    let on = match grants.judge(n.pid, &path, true, false) {
        PathJudgement::Granted => return None,
        _ if unlock => return None,
        PathJudgement::Outside(p) => p.display().to_string(),
        PathJudgement::CannotJudge(why) => format!("fd {fd} ({why})"),
    };
    Some(Decoded {
        category: Category::Filesystem,
        syscall: name.to_string(),
        args: format!("{what} on {on}"),
        rule: "locks only on files under filesystem.write".into(),
        always_deny: false,
        errno: libc::EPERM,
        hint: Some(
            "a lock on a file outside --rw would be held against processes outside the sandbox; lock files under --rw",
        ),
    })
}

fn family_name(f: u64) -> String {
    match f as i32 {
        libc::AF_UNIX => "AF_UNIX".into(),
        libc::AF_INET => "AF_INET".into(),
        libc::AF_INET6 => "AF_INET6".into(),
        libc::AF_NETLINK => "AF_NETLINK".into(),
        libc::AF_PACKET => "AF_PACKET".into(),
        libc::AF_VSOCK => "AF_VSOCK".into(),
        libc::AF_ALG => "AF_ALG".into(),
        libc::AF_BLUETOOTH => "AF_BLUETOOTH".into(),
        other => format!("family {other}"),
    }
}

fn socket_type(t: u64) -> String {
    let base = match (t & 0xf) as i32 {
        libc::SOCK_STREAM => "SOCK_STREAM".to_string(),
        libc::SOCK_DGRAM => "SOCK_DGRAM".to_string(),
        libc::SOCK_RAW => "SOCK_RAW".to_string(),
        libc::SOCK_SEQPACKET => "SOCK_SEQPACKET".to_string(),
        other => format!("type {other}"),
    };
    let mut s = base;
    if t & libc::SOCK_CLOEXEC as u64 != 0 {
        s.push_str("|SOCK_CLOEXEC");
    }
    if t & libc::SOCK_NONBLOCK as u64 != 0 {
        s.push_str("|SOCK_NONBLOCK");
    }
    s
}

/// Formats a `struct sockaddr` read from the guest: `AF_INET 10.0.0.1:443`,
/// `AF_INET6 [::1]:80`, `AF_UNIX /run/x.sock` or `AF_UNIX @abstract`.
pub fn format_sockaddr(b: &[u8]) -> String {
    if b.len() < 2 {
        return "(short address)".into();
    }
    let family = u16::from_ne_bytes([b[0], b[1]]) as i32;
    match family {
        libc::AF_INET if b.len() >= 8 => {
            let port = u16::from_be_bytes([b[2], b[3]]);
            let ip = Ipv4Addr::new(b[4], b[5], b[6], b[7]);
            format!("AF_INET {ip}:{port}")
        }
        libc::AF_INET6 if b.len() >= 24 => {
            let port = u16::from_be_bytes([b[2], b[3]]);
            let mut o = [0u8; 16];
            o.copy_from_slice(&b[8..24]);
            format!("AF_INET6 [{}]:{port}", Ipv6Addr::from(o))
        }
        libc::AF_UNIX => {
            let path = &b[2..];
            if path.first() == Some(&0) {
                let name = &path[1..];
                let end = name.iter().rposition(|&c| c != 0).map_or(0, |i| i + 1);
                format!("AF_UNIX @{}", String::from_utf8_lossy(&name[..end]))
            } else {
                let end = path.iter().position(|&c| c == 0).unwrap_or(path.len());
                format!("AF_UNIX {}", String::from_utf8_lossy(&path[..end]))
            }
        }
        other => family_name(other as u64),
    }
}

fn sockaddr_arg(mem: &dyn GuestMemory, addr: u64, len: u64) -> String {
    let len = (len as usize).min(128);
    match mem.read_bytes(addr, len) {
        Some(b) => format_sockaddr(&b),
        None if addr == 0 => "no address".into(),
        None => format!("address {addr:#x} (unreadable)"),
    }
}

const CLONE_FLAGS: &[(u64, &str)] = &[
    (libc::CLONE_VM as u64, "CLONE_VM"),
    (libc::CLONE_FS as u64, "CLONE_FS"),
    (libc::CLONE_FILES as u64, "CLONE_FILES"),
    (libc::CLONE_SIGHAND as u64, "CLONE_SIGHAND"),
    (libc::CLONE_PIDFD as u64, "CLONE_PIDFD"),
    (libc::CLONE_PTRACE as u64, "CLONE_PTRACE"),
    (libc::CLONE_VFORK as u64, "CLONE_VFORK"),
    (libc::CLONE_PARENT as u64, "CLONE_PARENT"),
    (libc::CLONE_THREAD as u64, "CLONE_THREAD"),
    (libc::CLONE_NEWNS as u64, "CLONE_NEWNS"),
    (libc::CLONE_SYSVSEM as u64, "CLONE_SYSVSEM"),
    (libc::CLONE_SETTLS as u64, "CLONE_SETTLS"),
    (libc::CLONE_PARENT_SETTID as u64, "CLONE_PARENT_SETTID"),
    (libc::CLONE_CHILD_CLEARTID as u64, "CLONE_CHILD_CLEARTID"),
    (libc::CLONE_UNTRACED as u64, "CLONE_UNTRACED"),
    (libc::CLONE_CHILD_SETTID as u64, "CLONE_CHILD_SETTID"),
    (libc::CLONE_NEWCGROUP as u64, "CLONE_NEWCGROUP"),
    (libc::CLONE_NEWUTS as u64, "CLONE_NEWUTS"),
    (libc::CLONE_NEWIPC as u64, "CLONE_NEWIPC"),
    (libc::CLONE_NEWUSER as u64, "CLONE_NEWUSER"),
    (libc::CLONE_NEWPID as u64, "CLONE_NEWPID"),
    (libc::CLONE_NEWNET as u64, "CLONE_NEWNET"),
    (libc::CLONE_IO as u64, "CLONE_IO"),
];

/// `CLONE_VM|CLONE_THREAD|...|SIGCHLD`. The flags are 32 bits (`libc`'s constants are
/// `c_int`: widened, `CLONE_IO` would match every high bit); bits without a name are shown
/// in hex.
pub fn format_clone_flags(flags: u64) -> String {
    let bit = |b: &u64| *b as u32 as u64;
    let mut parts: Vec<String> = CLONE_FLAGS
        .iter()
        .filter(|(b, _)| flags & bit(b) != 0)
        .map(|(_, name)| name.to_string())
        .collect();
    let sig = (flags & 0xff) as i32;
    if sig != 0 {
        parts.push(crate::report::signal_name(sig));
    }
    let known = CLONE_FLAGS.iter().fold(0xff, |m, (b, _)| m | bit(b));
    if flags & !known != 0 {
        parts.push(format!("{:#x}", flags & !known));
    }
    if parts.is_empty() {
        "0".into()
    } else {
        parts.join("|")
    }
}

/// A `struct timespec` in guest memory, in seconds.
fn read_timespec(mem: &dyn GuestMemory, addr: u64) -> Option<f64> {
    let b = mem.read_bytes(addr, 16).filter(|b| b.len() == 16)?;
    let sec = i64::from_ne_bytes(b[0..8].try_into().ok()?);
    let nsec = i64::from_ne_bytes(b[8..16].try_into().ok()?);
    Some(sec as f64 + nsec as f64 / 1e9)
}

fn timespec_arg(mem: &dyn GuestMemory, addr: u64) -> String {
    read_timespec(mem, addr).map_or_else(|| format!("{addr:#x}"), |secs| format!("{secs}s"))
}

/// The requested sleep as a duration; an absolute deadline is turned into "from now" (the
/// guest shares our clocks: there is no time namespace).
fn sleep_duration(mem: &dyn GuestMemory, clock: u64, addr: u64, absolute: bool) -> String {
    let Some(mut secs) = read_timespec(mem, addr) else {
        return format!("{addr:#x}");
    };
    if absolute {
        if let Ok(now) =
            nix::time::clock_gettime(nix::time::ClockId::from_raw(clock as libc::clockid_t))
        {
            secs -= now.tv_sec() as f64 + now.tv_nsec() as f64 / 1e9;
        }
        return format!("{:.3}s (until an absolute time)", secs.max(0.0));
    }
    format!("{secs}s")
}

fn clock_name(c: u64) -> String {
    match c as i32 {
        libc::CLOCK_REALTIME => "CLOCK_REALTIME".into(),
        libc::CLOCK_MONOTONIC => "CLOCK_MONOTONIC".into(),
        libc::CLOCK_BOOTTIME => "CLOCK_BOOTTIME".into(),
        other => format!("clock {other}"),
    }
}

/// `execve` arguments: the path and the first few argv entries.
fn exec_arg(mem: &dyn GuestMemory, path: u64, argv: u64) -> String {
    let mut s = mem
        .read_string(path)
        .unwrap_or_else(|| format!("{path:#x}"));
    if let Some(ptrs) = mem.read_bytes(argv, 8 * 8) {
        let words: Vec<u64> = ptrs
            .chunks_exact(8)
            .map(|c| u64::from_ne_bytes(c.try_into().unwrap_or_default()))
            .take_while(|&p| p != 0)
            .collect();
        let mut shown = Vec::new();
        for &p in words.iter().skip(1).take(6) {
            shown.push(mem.read_string(p).unwrap_or_else(|| "?".into()));
        }
        if !shown.is_empty() {
            s.push_str(&format!(" argv=[{}]", shown.join(", ")));
        }
    }
    s
}

fn hex_args(a: &[u64; 6], count: usize) -> String {
    a.iter()
        .take(count)
        .map(|v| format!("{v:#x}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Classifies notification `n` by the plan's `decisions`, reading the guest's memory through
/// `mem`: `None` lets the call run (a watched write inside the grants, a private mapping),
/// `Some` is a violation to act on. Watched writes and locks are judged against the file
/// system (`grants`, by `n.pid`). `late_reads`: a read-only open is a violation (a prefork
/// session child after preload).
pub fn classify(
    n: &Notif,
    mem: &dyn GuestMemory,
    decisions: &Decisions,
    grants: &Grants,
    late_reads: bool,
) -> Option<Decoded> {
    classify_unbounded(n, mem, decisions, grants, late_reads).map(bounded)
}

fn classify_unbounded(
    n: &Notif,
    mem: &dyn GuestMemory,
    decisions: &Decisions,
    grants: &Grants,
    late_reads: bool,
) -> Option<Decoded> {
    let native = n.arch == bpf::AUDIT_ARCH_X86_64 && (n.nr as u32) & bpf::X32_SYSCALL_BIT == 0;
    if let Some(d) = decisions.get(n.nr as u32).filter(|_| native) {
        match d.check {
            Check::Writes => return check_writes(n, mem, d.name, grants, late_reads),
            Check::Lock => return check_lock(n, mem, d.name, grants),
            Check::Fcntl
                if syscalls::FCNTL_LOCKS
                    .iter()
                    .any(|&(c, _)| c == n.args[1] & 0xffff_ffff) =>
            {
                return check_lock(n, mem, d.name, grants);
            }
            // A large private mapping or growth, sent as evidence for the memory limit (the
            // caller may note it); the kernel applies RLIMIT_AS. Only a prefork plan's filter
            // sends shared mappings, and those are violations.
            Check::Mapping if d.name == "mremap" || n.args[3] & libc::MAP_SHARED as u64 == 0 => {
                return None;
            }
            // The guest ends; its peak address space was read as evidence (the caller's).
            Check::Exit => return None,
            // A wait without a timeout, or with a zero one, runs; one that would block for a
            // while is a sleep (and one whose timeout cannot be read is judged one).
            Check::TimedWait if !waits_a_while(n, mem, d.name) => return None,
            _ => {}
        }
    }
    Some(decode(n, mem, decisions))
}

/// Whether wait `name` (notification `n`) has a non-zero timeout, or one that cannot be read.
fn waits_a_while(n: &Notif, mem: &dyn GuestMemory, name: &str) -> bool {
    use crate::policy::syscalls::{Timeout, timed_wait};
    let Some(timeout) = timed_wait(name) else {
        return true;
    };
    match timeout {
        Timeout::Millis(a) => (n.args[a] as u32 as i32) > 0,
        Timeout::Timespec(a) | Timeout::Timeval(a) => {
            if n.args[a] == 0 {
                return false; // no timeout: it waits for its descriptors or its wake-up
            }
            let mut raw = [0u8; 16];
            match mem.read_at(n.args[a], &mut raw) {
                Ok(16) => raw != [0u8; 16],
                _ => true,
            }
        }
    }
}

/// The most bytes of a decoded call's arguments text (`Decoded::args`); what is longer is cut
/// (an `execve` with its path and six arguments, each up to 4 KiB and each invalid UTF-8 byte
/// shown as three, would be about 86 KiB).
pub const MAX_ARGS_TEXT: usize = 8 << 10;
const CUT: &str = "... (cut)";

/// `d` with its arguments text cut to [`MAX_ARGS_TEXT`] bytes.
fn bounded(mut d: Decoded) -> Decoded {
    if d.args.len() > MAX_ARGS_TEXT {
        let mut end = MAX_ARGS_TEXT - CUT.len();
        while !d.args.is_char_boundary(end) {
            end -= 1;
        }
        d.args.truncate(end);
        d.args.push_str(CUT);
    }
    d
}

/// Decodes notification `n` as a violation, with the plan's `decisions`, reading the guest's memory through
/// `mem` and nothing else (no path is judged; see [`classify`]).
pub fn decode(n: &Notif, mem: &dyn GuestMemory, decisions: &Decisions) -> Decoded {
    bounded(decode_unbounded(n, mem, decisions))
}

fn decode_unbounded(n: &Notif, mem: &dyn GuestMemory, decisions: &Decisions) -> Decoded {
    let a = &n.args;
    if n.arch != bpf::AUDIT_ARCH_X86_64 {
        return Decoded {
            category: Category::Privilege,
            syscall: format!("foreign-arch syscall {}", n.nr),
            args: format!("arch {:#x}", n.arch),
            rule: "only the native x86_64 ABI is allowed".into(),
            always_deny: true,
            errno: libc::EPERM,
            hint: None,
        };
    }
    let nr = n.nr as u32;
    if nr & bpf::X32_SYSCALL_BIT != 0 {
        let base = nr & !bpf::X32_SYSCALL_BIT;
        return Decoded {
            category: Category::Privilege,
            syscall: format!("x32 syscall {base}"),
            args: hex_args(a, 3),
            rule: "the x32 ABI is rejected".into(),
            always_deny: true,
            errno: libc::EPERM,
            hint: None,
        };
    }
    let fallback;
    let d = match decisions.get(nr) {
        Some(d) => d,
        None => {
            fallback = Decision {
                name: "unknown",
                check: Check::Violation,
                category: Category::Other,
                rule: "not on the allowlist".into(),
                hint: None,
                always_deny: false,
                policy_denies: false,
                args: Args::Hex,
            };
            &fallback
        }
    };
    let name = d.name;
    let syscall = if name == "unknown" {
        format!("syscall {nr}")
    } else {
        name.to_string()
    };
    let mut category = d.category;
    let mut rule = d.rule.clone();
    let mut hint = d.hint;
    // What the arguments show; `clone`, `ioctl` and `fcntl` also refine category and rule
    // (unless the policy's own deny list names the call).
    let refine = !d.policy_denies;
    let args = match d.args {
        Args::Hex => hex_args(a, 3),
        Args::None => String::new(),
        Args::SocketKind => {
            if a[0] as i32 == libc::AF_UNIX {
                hint = Some(UNIX_SOCKET_HINT);
            }
            format!("{} {}", family_name(a[0]), socket_type(a[1]))
        }
        Args::Sockaddr { addr, len } => sockaddr_arg(mem, a[addr], a[len]),
        Args::Fd => format!("fd {}", a[0] as i32),
        Args::CloneFlags => {
            let thread = a[0] & libc::CLONE_THREAD as u64 != 0;
            category = if thread {
                Category::Thread
            } else {
                Category::Subprocess
            };
            if refine {
                rule = if thread {
                    "process.threads = \"deny\""
                } else {
                    "process.subprocess = \"deny\""
                }
                .into();
            }
            format_clone_flags(a[0])
        }
        Args::NamespaceFlags { at } => format_clone_flags(a[at]),
        Args::Exec { path, argv } => exec_arg(mem, a[path], a[argv]),
        Args::Timespec => timespec_arg(mem, a[0]),
        Args::ClockSleep => {
            let absolute = a[1] & libc::TIMER_ABSTIME as u64 != 0;
            format!(
                "{} {}",
                clock_name(a[0]),
                sleep_duration(mem, a[0], a[2], absolute)
            )
        }
        Args::Seconds => format!("{}s", a[0]),
        Args::Bytes => format!("{} bytes", a[1]),
        Args::Ioctl => {
            let req = a[1] & 0xffff_ffff; // the kernel reads an unsigned int
            category = match (req >> 8) & 0xff {
                // 'f', 'X', 'v' and 0x94: inode flags, fsxattr, versions, reflinks.
                0x66 | 0x58 | 0x76 | 0x94 | 0x00 => Category::Filesystem,
                0x89 if !matches!(req, 0x8901 | 0x8902) => Category::Network,
                _ => Category::Privilege,
            };
            let shown =
                syscalls::ioctl_name(req).map_or_else(|| format!("{req:#x}"), str::to_string);
            format!("fd {}, {shown}", a[0] as i32)
        }
        Args::SeccompOp => format!("op {}, flags {:#x}", a[0], a[1]),
        Args::Path { at } => mem.read_string(a[at]).unwrap_or_else(|| hex_args(a, 3)),
        Args::Mount => format!(
            "{} on {}",
            mem.read_string(a[0]).unwrap_or_else(|| "?".into()),
            mem.read_string(a[1]).unwrap_or_else(|| "?".into())
        ),
        Args::Signal { sig } => format!(
            "pid {}, {}",
            a[0] as i32,
            crate::report::signal_name(a[sig] as i32)
        ),
        Args::Prlimit => format!("pid {}, resource {}", a[0] as i32, a[1]),
        Args::Fcntl => {
            let cmd = syscalls::fcntl_name(a[1]);
            if let Some((cat, why)) = fcntl_rule(cmd) {
                category = cat;
                rule = why.into();
            } else {
                category = Category::Privilege;
            }
            let shown = cmd.map_or_else(|| format!("cmd {:#x}", a[1]), str::to_string);
            format!("fd {}, {shown}, arg {}", a[0] as i32, a[2] as i64)
        }
        Args::Memfd => format!(
            "{:?}, flags {:#x}",
            mem.read_string(a[0]).unwrap_or_default(),
            a[1]
        ),
        Args::Mmap => format!("{}, {} bytes", format_mmap_flags(a[3]), a[1]),
        Args::ArchPrctl => {
            let code = a[0] & 0xffff_ffff;
            if refine && syscalls::ARCH_MAP_VDSO.iter().any(|&(c, _)| c == code) {
                category = Category::Clock;
            }
            let shown = syscalls::arch_prctl_name(code)
                .map_or_else(|| format!("code {code:#x}"), |n| format!("{n} ({code:#x})"));
            format!("{shown}, {:#x}", a[1])
        }
        Args::Prctl => {
            let shown = syscalls::prctl_name(a[0]).map_or_else(
                || format!("option {}", a[0] as i32),
                |n| format!("{n} ({})", a[0] as i32),
            );
            format!("{shown}, {:#x}", a[1])
        }
        Args::Madvise => {
            let shown = syscalls::madvise_name(a[2])
                .map_or_else(|| format!("advice {}", a[2] as i32), str::to_string);
            format!("{:#x}, {} bytes, {shown}", a[0], a[1])
        }
    };
    Decoded {
        category,
        syscall,
        args,
        rule,
        // An opt-in to same-page merging is refused whatever `on_violation` says, also where
        // the policy's own deny list sent the call.
        always_deny: d.always_deny || merge_opt_in(name, a),
        // A denied timed futex wait times out at once: the C library takes any other error
        // from it as a broken futex facility and aborts the process.
        errno: if d.check == Check::TimedWait && matches!(d.name, "futex" | "futex_waitv") {
            libc::ETIMEDOUT
        } else {
            libc::EPERM
        },
        hint,
    }
}

/// Whether a call opts its caller into same-page merging (`syscalls::ArgRule::PrctlNoMergeOptIn`,
/// `MadviseNoMergeable`).
fn merge_opt_in(name: &str, a: &[u64; 6]) -> bool {
    match name {
        "prctl" => a[0] & 0xffff_ffff == syscalls::PR_SET_MEMORY_MERGE && a[1] != 0,
        "madvise" => a[2] & 0xffff_ffff == syscalls::MADV_MERGEABLE,
        _ => false,
    }
}

/// The category and rule of an `fcntl` command the filter refused, when it has its own.
fn fcntl_rule(cmd: Option<&str>) -> Option<(Category, &'static str)> {
    Some(match cmd? {
        "F_SETLEASE" => (
            Category::Filesystem,
            "leases are denied: a lease blocks other processes' opens of the file",
        ),
        "F_NOTIFY" => (
            Category::Filesystem,
            "directory notifications are denied: they watch directories outside the sandbox",
        ),
        "F_SETPIPE_SZ" => (
            Category::Privilege,
            "pipe sizes are fixed: pipe buffers are a per-user quota every other guest shares",
        ),
        "F_SETOWN" | "F_SETOWN_EX" | "F_SETSIG" => (
            Category::Privilege,
            "SIGIO may not be routed to another process (F_SETOWN, F_SETSIG)",
        ),
        _ => return None,
    })
}

/// `MAP_SHARED|MAP_ANONYMOUS|...` (the mapping type and the flags that matter here).
fn format_mmap_flags(flags: u64) -> String {
    let mut parts = vec![match flags & 0x0f {
        0x01 => "MAP_SHARED".to_string(),
        0x02 => "MAP_PRIVATE".to_string(),
        0x03 => "MAP_SHARED_VALIDATE".to_string(),
        t => format!("type {t:#x}"),
    }];
    for (bit, name) in [
        (libc::MAP_ANONYMOUS, "MAP_ANONYMOUS"),
        (libc::MAP_FIXED, "MAP_FIXED"),
        (libc::MAP_NORESERVE, "MAP_NORESERVE"),
        (libc::MAP_POPULATE, "MAP_POPULATE"),
    ] {
        if flags & bit as u64 != 0 {
            parts.push(name.to_string());
        }
    }
    parts.join("|")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guest_memory::MemoryImage;

    const BASE: u64 = 0x7f00_0000_0000;

    fn notif(nr: libc::c_long, args: [u64; 6]) -> Notif {
        Notif {
            id: 1,
            pid: u32::MAX, // no such process: only the image is read
            nr: nr as i32,
            arch: bpf::AUDIT_ARCH_X86_64,
            instruction_pointer: 0,
            args,
        }
    }

    fn default_policy() -> Decisions {
        Decisions::compile(&crate::policy::load("default").unwrap(), Default::default())
    }

    fn sockaddr_in(ip: [u8; 4], port: u16) -> Vec<u8> {
        let mut b = vec![0u8; 16];
        b[0..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        b[2..4].copy_from_slice(&port.to_be_bytes());
        b[4..8].copy_from_slice(&ip);
        b
    }

    #[test]
    fn connect_decodes_the_address_it_reads() {
        let mem = MemoryImage::new(BASE, sockaddr_in([127, 0, 0, 1], 80));
        let d = decode(
            &notif(libc::SYS_connect, [3, BASE, 16, 0, 0, 0]),
            &mem,
            &default_policy(),
        );
        assert_eq!(d.syscall, "connect");
        assert_eq!(d.args, "AF_INET 127.0.0.1:80");
        assert_eq!(d.category, Category::Network);
        assert_eq!(d.rule, "network.mode = \"none\"");
        assert_eq!((d.errno, d.always_deny), (libc::EPERM, false));
        // sendto's address is its fifth argument; none is "no address".
        let d = decode(
            &notif(libc::SYS_sendto, [3, 0, 0, 0, BASE, 16]),
            &mem,
            &default_policy(),
        );
        assert_eq!(d.args, "AF_INET 127.0.0.1:80");
        let d = decode(
            &notif(libc::SYS_sendto, [3, 0, 0, 0, 0, 0]),
            &mem,
            &default_policy(),
        );
        assert_eq!(d.args, "no address");
    }

    #[test]
    fn an_unreadable_address_is_said_to_be_unreadable() {
        let mem = MemoryImage::new(BASE, sockaddr_in([127, 0, 0, 1], 80));
        let d = decode(
            &notif(libc::SYS_connect, [3, BASE + 0x1000, 16, 0, 0, 0]),
            &mem,
            &default_policy(),
        );
        assert_eq!(d.args, format!("address {:#x} (unreadable)", BASE + 0x1000));
        // A path that cannot be read is shown as the raw arguments.
        let d = decode(
            &notif(libc::SYS_openat, [libc::AT_FDCWD as u64, 0x10, 0, 0, 0, 0]),
            &mem,
            &default_policy(),
        );
        assert_eq!(d.args, format!("{:#x}, 0x10, 0x0", libc::AT_FDCWD as u64));
        // A watched write whose path cannot be read is refused unjudged (no file is looked at).
        let write = libc::O_WRONLY as u64;
        let d = classify(
            &notif(
                libc::SYS_openat,
                [libc::AT_FDCWD as u64, 0x10, write, 0, 0, 0],
            ),
            &mem,
            &default_policy(),
            &Grants::default(),
            false,
        )
        .unwrap();
        assert_eq!(
            d.args,
            "0x10 (write; cannot judge: the path is not readable in the guest's memory)"
        );
        assert_eq!(
            (d.rule.as_str(), d.errno),
            (CANNOT_JUDGE_RULE, libc::EACCES)
        );
    }

    #[test]
    fn paths_argv_and_durations_come_from_memory() {
        // "/etc/shadow\0" at BASE, argv pointers at BASE+0x100, strings after them,
        // a timespec of 1.5 s at BASE+0x200.
        let mut img = vec![0u8; 0x300];
        img[..11].copy_from_slice(b"/etc/shadow");
        let strings = [(0x180, &b"sh\0"[..]), (0x190, b"-c\0"), (0x1a0, b"id\0")];
        for (i, (off, text)) in strings.iter().enumerate() {
            let at = 0x100 + 8 * i;
            img[at..at + 8].copy_from_slice(&(BASE + *off as u64).to_ne_bytes());
            img[*off..*off + text.len()].copy_from_slice(text);
        }
        img[0x200..0x208].copy_from_slice(&1i64.to_ne_bytes());
        img[0x208..0x210].copy_from_slice(&500_000_000i64.to_ne_bytes());
        let mem = MemoryImage::new(BASE, img);
        let p = Decisions::compile(&crate::policy::load("strict").unwrap(), Default::default());
        let at = libc::AT_FDCWD as u64;
        let d = decode(&notif(libc::SYS_openat, [at, BASE, 0, 0, 0, 0]), &mem, &p);
        assert_eq!(
            (d.syscall.as_str(), d.args.as_str()),
            ("openat", "/etc/shadow")
        );
        let d = decode(
            &notif(libc::SYS_execve, [BASE, BASE + 0x100, 0, 0, 0, 0]),
            &mem,
            &p,
        );
        assert_eq!(d.args, "/etc/shadow argv=[-c, id]");
        assert_eq!(d.rule, "process.exec = \"deny\"");
        let d = decode(
            &notif(libc::SYS_nanosleep, [BASE + 0x200, 0, 0, 0, 0, 0]),
            &mem,
            &p,
        );
        assert_eq!(
            (d.args.as_str(), d.rule.as_str()),
            ("1.5s", "time.sleep = \"deny\"")
        );
    }

    #[test]
    fn flags_ioctls_and_fcntls_need_no_memory() {
        let mem = MemoryImage::default();
        let p = default_policy();
        let flags = (libc::CLONE_VM | libc::CLONE_THREAD | libc::SIGCHLD) as u64;
        let d = decode(&notif(libc::SYS_clone, [flags, 0, 0, 0, 0, 0]), &mem, &p);
        assert_eq!(d.category, Category::Thread);
        assert_eq!(d.args, "CLONE_VM|CLONE_THREAD|SIGCHLD");
        let d = decode(&notif(libc::SYS_ioctl, [1, 0x5412, 0, 0, 0, 0]), &mem, &p);
        assert_eq!((d.args.as_str(), d.always_deny), ("fd 1, TIOCSTI", true));
        let d = decode(&notif(libc::SYS_fcntl, [5, 1031, 0, 0, 0, 0]), &mem, &p);
        assert_eq!(d.args, "fd 5, F_SETPIPE_SZ, arg 0");
        let mut foreign = notif(libc::SYS_connect, [0; 6]);
        foreign.arch = 0x4000_0003; // AUDIT_ARCH_I386
        let d = decode(&foreign, &mem, &p);
        assert_eq!((d.category, d.always_deny), (Category::Privilege, true));
    }

    #[test]
    fn the_arguments_text_is_bounded() {
        // execve of a 4 KiB path of invalid UTF-8 with six such arguments: ~86 KiB unbounded.
        let mut img = vec![0xffu8; 8 * 4096];
        for (i, chunk) in img.chunks_mut(4096).enumerate() {
            chunk[4095] = 0;
            if i == 7 {
                for (j, w) in chunk[..64].chunks_mut(8).enumerate() {
                    w.copy_from_slice(&(BASE + 4096 * j as u64).to_ne_bytes());
                }
            }
        }
        let mem = MemoryImage::new(BASE, img);
        let n = notif(libc::SYS_execve, [BASE, BASE + 7 * 4096, 0, 0, 0, 0]);
        let d = decode(&n, &mem, &default_policy());
        // Cut on a character boundary (U+FFFD is three bytes).
        assert!((MAX_ARGS_TEXT - 3..=MAX_ARGS_TEXT).contains(&d.args.len()));
        assert!(d.args.starts_with('\u{fffd}') && d.args.ends_with("... (cut)"));
    }

    #[test]
    fn sockaddrs() {
        let mut v4 = vec![0u8; 16];
        v4[0..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        v4[2..4].copy_from_slice(&443u16.to_be_bytes());
        v4[4..8].copy_from_slice(&[10, 0, 0, 1]);
        assert_eq!(format_sockaddr(&v4), "AF_INET 10.0.0.1:443");
        let mut un = vec![0u8; 12];
        un[0..2].copy_from_slice(&(libc::AF_UNIX as u16).to_ne_bytes());
        un[2..8].copy_from_slice(b"/x.soc");
        assert_eq!(format_sockaddr(&un), "AF_UNIX /x.soc");
        let mut abs = vec![0u8; 6];
        abs[0..2].copy_from_slice(&(libc::AF_UNIX as u16).to_ne_bytes());
        abs[3..6].copy_from_slice(b"abc");
        assert_eq!(format_sockaddr(&abs), "AF_UNIX @abc");
    }

    #[test]
    fn clone_flags() {
        let f = (libc::CLONE_VM | libc::CLONE_THREAD | libc::SIGCHLD) as u64;
        assert_eq!(format_clone_flags(f), "CLONE_VM|CLONE_THREAD|SIGCHLD");
        // High bits are not CLONE_IO (issue 7, E6).
        assert_eq!(
            format_clone_flags(0x1_0000_0000 | libc::SIGCHLD as u64),
            "SIGCHLD|0x100000000"
        );
        assert_eq!(format_clone_flags(libc::CLONE_IO as u32 as u64), "CLONE_IO");
        assert_eq!(format_clone_flags(0x40_0000), "0x400000"); // CLONE_DETACHED, unused
    }
}
