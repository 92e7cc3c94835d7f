//! The syscall vocabulary: names and numbers, the base allowlist with the reason for each
//! entry, the categories used in reports, and the set that no policy may allow.

use std::collections::HashMap;
use std::sync::OnceLock;

use serde::Serialize;

use super::syscall_table::X86_64;

/// Category of a denied operation, as named in reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Category {
    Network,
    Thread,
    Subprocess,
    Exec,
    Filesystem,
    Sleep,
    Clock,
    Random,
    Privilege,
    Other,
}

impl Category {
    /// Whether a call of this category reaches beyond the process (the network, or files
    /// and their metadata): what `wfjail learn` refuses whatever the base allows.
    pub fn reaches_outside(self) -> bool {
        matches!(self, Category::Network | Category::Filesystem)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Category::Network => "network",
            Category::Thread => "thread",
            Category::Subprocess => "subprocess",
            Category::Exec => "exec",
            Category::Filesystem => "filesystem",
            Category::Sleep => "sleep",
            Category::Clock => "clock",
            Category::Random => "random",
            Category::Privilege => "privilege",
            Category::Other => "other",
        }
    }

    /// What the workflow author should do instead.
    pub fn hint(self) -> &'static str {
        match self {
            Category::Network => "network is denied in workflow code; do it in an activity",
            Category::Thread => {
                "threads are denied in workflow code; use asyncio tasks (workflow.wait, asyncio.gather)"
            }
            Category::Subprocess => {
                "subprocesses are denied in workflow code; run the program from an activity"
            }
            Category::Exec => {
                "exec is denied once the workflow runs; run the program from an activity"
            }
            Category::Filesystem => {
                "this file operation is outside the policy; do file I/O in an activity or grant the path with --ro/--rw"
            }
            Category::Sleep => {
                "blocking sleep is denied; use workflow.sleep() or asyncio.sleep() (durable timers)"
            }
            Category::Clock => {
                "reading the wall clock is denied in workflow code; use workflow.now() (or [time] clock = \"virtual\")"
            }
            Category::Random => {
                "randomness is denied; use workflow.random() or workflow.uuid4() (seeded from history), or [random] getrandom = \"seeded\" (Python's random and tempfile modules draw at import, so importing them is enough to get here)"
            }
            Category::Privilege => "this call could weaken the sandbox and is always denied",
            Category::Other => {
                "this syscall is not on the allowlist; if it is deterministic and safe, add it to [syscalls] allow"
            }
        }
    }
}

/// FNV-1a: the keys are the table's own names and names from policy files, so the
/// standard hasher's defence against chosen keys buys nothing here, and its SipHash cost
/// ~0.04 ms of every plan (the filters look up a few hundred names).
#[derive(Default)]
struct Fnv(u64);

impl std::hash::Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for &b in bytes {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
}

type ByName = HashMap<&'static str, u32, std::hash::BuildHasherDefault<Fnv>>;

fn by_name() -> &'static ByName {
    static MAP: OnceLock<ByName> = OnceLock::new();
    MAP.get_or_init(|| X86_64.iter().copied().collect())
}

/// The x86_64 number of `name`.
pub fn number(name: &str) -> Option<u32> {
    by_name().get(name).copied()
}

/// The name of syscall `nr`, if it has one.
pub fn name(nr: u32) -> Option<&'static str> {
    X86_64
        .binary_search_by_key(&nr, |&(_, n)| n)
        .ok()
        .map(|i| X86_64[i].0)
}

/// Up to `n` valid names closest to `wrong` (for "did you mean").
pub fn closest(wrong: &str, n: usize) -> Vec<&'static str> {
    let mut scored: Vec<(f64, &'static str)> = X86_64
        .iter()
        .map(|&(name, _)| (strsim::jaro_winkler(wrong, name), name))
        .filter(|(s, _)| *s > 0.75)
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(b.1)));
    scored.into_iter().take(n).map(|(_, name)| name).collect()
}

/// How a denied call's arguments are shown in a report (decoded by `notify/decode.rs`;
/// argument indexes are the syscall's own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Args {
    /// The first three arguments in hex.
    Hex,
    /// Nothing (fork, vfork).
    None,
    /// `socket`/`socketpair`: address family and type.
    SocketKind,
    /// A socket address at argument `addr` of length argument `len`.
    Sockaddr { addr: usize, len: usize },
    /// A descriptor at argument 0.
    Fd,
    /// `clone` flags at argument 0 (which also tell a thread from a subprocess).
    CloneFlags,
    /// `unshare`/`setns` namespace flags at argument `at`.
    NamespaceFlags { at: usize },
    /// An exec: path at `path`, argv at `argv`.
    Exec { path: usize, argv: usize },
    /// `nanosleep`'s timespec.
    Timespec,
    /// `clock_nanosleep`'s clock and duration.
    ClockSleep,
    /// Seconds at argument 0 (`alarm`).
    Seconds,
    /// A byte count at argument 1 (`getrandom`).
    Bytes,
    /// A path string at argument `at`.
    Path { at: usize },
    /// `mount`: source on target.
    Mount,
    /// `ioctl`: descriptor and request (which also sets the category).
    Ioctl,
    /// `fcntl`: descriptor, command and argument (the command sets category and rule).
    Fcntl,
    /// `seccomp`: operation and flags.
    SeccompOp,
    /// `kill`/`tkill` (signal at 1) or `tgkill` (signal at 2), with the target pid.
    Signal { sig: usize },
    /// `prlimit64`: pid and resource.
    Prlimit,
    /// `memfd_create`: name and flags.
    Memfd,
    /// `mmap`: mapping flags and length.
    Mmap,
    /// `arch_prctl`: the code (a vDSO mapping makes it a `clock` violation).
    ArchPrctl,
    /// `prctl`: the option and its first argument.
    Prctl,
    /// `madvise`: the range and the advice.
    Madvise,
}

/// How a denied call of `name` shows its arguments.
pub fn args(name: &str) -> Args {
    match name {
        "socket" | "socketpair" => Args::SocketKind,
        "connect" | "bind" => Args::Sockaddr { addr: 1, len: 2 },
        "sendto" => Args::Sockaddr { addr: 4, len: 5 },
        "listen" | "accept" | "accept4" => Args::Fd,
        "clone" => Args::CloneFlags,
        "fork" | "vfork" => Args::None,
        "execve" => Args::Exec { path: 0, argv: 1 },
        "execveat" => Args::Exec { path: 1, argv: 2 },
        "nanosleep" => Args::Timespec,
        "clock_nanosleep" => Args::ClockSleep,
        "alarm" => Args::Seconds,
        "getrandom" => Args::Bytes,
        "ioctl" => Args::Ioctl,
        "seccomp" => Args::SeccompOp,
        "inotify_add_watch" => Args::Path { at: 1 },
        "open" | "creat" | "chmod" | "chown" | "lchown" | "mknod" | "utime" | "utimes"
        | "setxattr" | "lsetxattr" | "removexattr" | "lremovexattr" | "truncate" | "unlink"
        | "mkdir" | "rmdir" | "readlink" | "stat" | "lstat" | "access" => Args::Path { at: 0 },
        "openat" | "openat2" | "fchmodat" | "fchmodat2" | "fchownat" | "mknodat" | "utimensat"
        | "futimesat" | "unlinkat" | "mkdirat" | "newfstatat" | "faccessat" | "faccessat2"
        | "readlinkat" | "name_to_handle_at" => Args::Path { at: 1 },
        "mount" => Args::Mount,
        "unshare" => Args::NamespaceFlags { at: 0 },
        "setns" => Args::NamespaceFlags { at: 1 },
        "kill" | "tkill" => Args::Signal { sig: 1 },
        "tgkill" => Args::Signal { sig: 2 },
        "prlimit64" => Args::Prlimit,
        "fcntl" => Args::Fcntl,
        "memfd_create" => Args::Memfd,
        "mmap" => Args::Mmap,
        "arch_prctl" => Args::ArchPrctl,
        "prctl" => Args::Prctl,
        "madvise" => Args::Madvise,
        _ => Args::Hex,
    }
}

/// The category a syscall belongs to when it is denied (arguments can refine this: `clone`
/// with `CLONE_THREAD` is a thread, without it a subprocess).
pub fn category(name: &str) -> Category {
    use Category::*;
    match name {
        "socket" | "connect" | "bind" | "listen" | "accept" | "accept4" | "sendto" | "sendmsg"
        | "sendmmsg" | "socketpair" | "getsockopt" | "setsockopt" => Network,
        "clone" | "clone3" => Thread, // refined by flags in the supervisor
        "fork" | "vfork" => Subprocess,
        "execve" | "execveat" => Exec,
        "nanosleep" | "clock_nanosleep" | "alarm" | "setitimer" | "timer_create"
        | "timer_settime" | "timerfd_create" | "timerfd_settime" | "pause" => Sleep,
        "getrandom" => Random,
        "clock_gettime" | "gettimeofday" | "time" => Clock,
        "chmod" | "fchmod" | "fchmodat" | "fchmodat2" | "chown" | "fchown" | "lchown"
        | "fchownat" | "utime" | "utimes" | "utimensat" | "futimesat" | "setxattr"
        | "lsetxattr" | "fsetxattr" | "setxattrat" | "removexattr" | "lremovexattr"
        | "fremovexattr" | "removexattrat" | "mknod" | "mknodat" | "file_setattr"
        | "inotify_init" | "inotify_init1" | "inotify_add_watch" | "fanotify_init"
        | "fanotify_mark" | "name_to_handle_at" | "open_by_handle_at" => Filesystem,
        // Allowed with argument checks; a denied call is one that reaches outside the guest.
        // ioctl and fcntl are allowed by request: the ones left reach the host (inode flags,
        // leases, terminal control, SIGIO routing), so they are denied even under `warn`.
        "kill" | "tkill" | "tgkill" | "prlimit64" | "ioctl" | "fcntl" => Privilege,
        // Refused only to opt into same-page merging (a side channel to every other
        // opted-in process on the host): denied even under `warn`.
        "prctl" | "madvise" => Privilege,
        _ if always_denied(name) => Privilege,
        _ => Other,
    }
}

/// Syscalls no policy may allow: they could weaken or escape the sandbox (docs/security.md, "Threat model").
pub fn always_denied(name: &str) -> bool {
    matches!(
        name,
        "io_uring_setup"
            | "io_uring_enter"
            | "io_uring_register"
            | "bpf"
            | "ptrace"
            | "userfaultfd"
            | "perf_event_open"
            | "keyctl"
            | "add_key"
            | "request_key"
            | "mount"
            | "umount2"
            | "pivot_root"
            | "fsopen"
            | "fsconfig"
            | "fsmount"
            | "fspick"
            | "move_mount"
            | "open_tree"
            | "open_tree_attr"
            | "mount_setattr"
            | "unshare"
            | "setns"
            | "chroot"
            | "kexec_load"
            | "kexec_file_load"
            | "init_module"
            | "finit_module"
            | "delete_module"
            | "reboot"
            | "swapon"
            | "swapoff"
            | "acct"
            | "quotactl"
            | "quotactl_fd"
            | "iopl"
            | "ioperm"
            | "modify_ldt"
            | "process_vm_readv"
            | "process_vm_writev"
            | "kcmp"
            | "pidfd_getfd"
            | "pidfd_open"
            | "pidfd_send_signal"
            | "lookup_dcookie"
            | "vhangup"
            | "syslog"
            | "settimeofday"
            | "clock_settime"
            | "adjtimex"
            | "clock_adjtime"
            | "setuid"
            | "setgid"
            | "setreuid"
            | "setregid"
            | "setresuid"
            | "setresgid"
            | "setfsuid"
            | "setfsgid"
            | "setgroups"
            | "capset"
            | "sethostname"
            | "setdomainname"
            | "personality"
            | "uselib"
            | "memfd_secret"
            | "process_madvise"
            | "process_mrelease"
            | "nfsservctl"
            | "create_module"
            | "get_kernel_syms"
            | "query_module"
            | "_sysctl"
            | "lsm_set_self_attr"
    )
}

/// How the base allowlist treats a syscall.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgRule {
    /// Allowed whatever the arguments.
    Any,
    /// `socketpair(AF_UNIX, SOCK_STREAM, ...)` only: asyncio's self-pipe. Datagram pairs could
    /// send to named sockets on the host with `sendmsg`.
    UnixStreamPair,
    /// `sendto` without a destination address (on an already connected socket).
    NoDestAddr,
    /// `ioctl` with one of [`IOCTL_ALLOWED`] only. Everything else is denied: on read-only
    /// grants the guest's uid maps to the files' owner, so a denylist left inode flags
    /// (`FS_IOC_SETFLAGS`) and interface listings (`SIOCGIFCONF`) reachable.
    IoctlAllowlist,
    /// `seccomp` without `SECCOMP_FILTER_FLAG_NEW_LISTENER`: a guest may narrow itself further
    /// but never become a supervisor.
    NoListener,
    /// Only on the calling process (pid argument 0): without a PID namespace another pid
    /// could be a process of the same user outside the sandbox.
    SelfOnly,
    /// `fcntl` with one of [`FCNTL_ALLOWED`]; the record-lock commands ([`FCNTL_LOCKS`]) go
    /// to the supervisor, which allows them on files under the write grants only (a lock on
    /// a host file is held against host processes). Everything else is denied: `F_SETLEASE`
    /// blocks a host writer's open, `F_NOTIFY` watches host directories, `F_SETPIPE_SZ`
    /// spends the user's pipe-buffer quota that every other guest shares, and `F_SETOWN*` /
    /// `F_SETSIG` route SIGIO to another process. Without a listener locks are denied.
    FcntlAllowlist,
    /// `flock`: unlocking is allowed; locking goes to the supervisor like an `fcntl` lock.
    Lock,
    /// `mmap`: in prefork mode a shared anonymous mapping made by preloaded code would carry
    /// one session's data to the next, so `MAP_SHARED`/`MAP_SHARED_VALIDATE` with
    /// `MAP_ANONYMOUS` is a violation there. Allowed whatever the arguments otherwise.
    NoSharedAnonInZygote,
    /// Only with the guest's own pid as the first argument: signals to itself. The pid is
    /// known after the fork only, so the compiled program holds a placeholder the child
    /// fills in (`bpf::SELF_PID`). In prefork mode (each child has its own pid) the PID
    /// namespace and Landlock's signal scoping are what keep signals in.
    SelfPid,
    /// `arch_prctl` with one of [`ARCH_PRCTL_ALLOWED`] only: what a C library and a runtime
    /// ask at start-up. `ARCH_MAP_VDSO_*` maps a fresh vDSO, whose clock functions read the
    /// real time without a syscall (undoing the exec stop's patch, `answers/vdso.rs`).
    ArchPrctlAllowlist,
    /// `prctl` with any option but `PR_SET_MEMORY_MERGE` opting in ([`PR_SET_MEMORY_MERGE`]
    /// with a non-zero argument): same-page merging is the operator's choice
    /// (`serve --merge-pages` opts a zygote in before its filter). A guest that opted itself
    /// in could time copy-on-write faults on merged pages against every other opted-in
    /// process on the host. Opting out (argument 0) and asking (`PR_GET_MEMORY_MERGE`) run.
    PrctlNoMergeOptIn,
    /// `madvise` with any advice but [`MADV_MERGEABLE`] (the same opt-in, per range;
    /// `MADV_UNMERGEABLE`, opting out, runs).
    MadviseNoMergeable,
    /// A call that changes the file system. Landlock decides; the supervisor also sees it
    /// (user notification) so that a write outside the policy is reported with its path.
    /// Without notification it is simply allowed, and Landlock alone denies.
    Watch,
    /// An open whose flags (argument `n`) may ask for writing: read-only opens stay in the
    /// kernel, write-intent opens are watched like [`ArgRule::Watch`].
    WatchWrites(u8),
}

/// One base allowlist entry: a syscall the guest may make, and why.
pub struct Allowed {
    pub name: &'static str,
    pub rule: ArgRule,
    pub why: &'static str,
}

const fn any(name: &'static str, why: &'static str) -> Allowed {
    Allowed {
        name,
        rule: ArgRule::Any,
        why,
    }
}

const fn watch(name: &'static str, why: &'static str) -> Allowed {
    Allowed {
        name,
        rule: ArgRule::Watch,
        why,
    }
}

const fn watch_writes(name: &'static str, flags_arg: u8, why: &'static str) -> Allowed {
    Allowed {
        name,
        rule: ArgRule::WatchWrites(flags_arg),
        why,
    }
}

/// The syscalls every policy allows (before `[syscalls] deny` removes and the knobs add).
/// Reads and writes are safe here because Landlock decides which paths they reach; sockets
/// are safe because the guest cannot create any (no `socket`), only AF_UNIX stream pairs.
pub const BASE_ALLOWLIST: &[Allowed] = &[
    // Descriptor I/O: paths are checked by Landlock, not here.
    any("read", "I/O on open descriptors"),
    any("write", "I/O on open descriptors"),
    any("readv", "I/O on open descriptors"),
    any("writev", "I/O on open descriptors"),
    any("pread64", "I/O on open descriptors"),
    any("pwrite64", "I/O on open descriptors"),
    any("preadv", "I/O on open descriptors"),
    any("pwritev", "I/O on open descriptors"),
    any("preadv2", "I/O on open descriptors"),
    any("pwritev2", "I/O on open descriptors"),
    any("lseek", "I/O on open descriptors"),
    any("sendfile", "copy between open descriptors"),
    any("copy_file_range", "copy between open descriptors"),
    any("splice", "copy between open descriptors"),
    any("tee", "copy between open descriptors"),
    any("vmsplice", "copy between open descriptors"),
    any("readahead", "read hint"),
    any("fadvise64", "read hint"),
    any("close", "descriptor housekeeping"),
    any("close_range", "descriptor housekeeping"),
    any("dup", "descriptor housekeeping"),
    any("dup2", "descriptor housekeeping"),
    any("dup3", "descriptor housekeeping"),
    Allowed {
        name: "fcntl",
        rule: ArgRule::FcntlAllowlist,
        why: "descriptor flags and lock queries; locks only under --rw (supervised)",
    },
    Allowed {
        name: "flock",
        rule: ArgRule::Lock,
        why: "advisory locks, only under --rw (supervised)",
    },
    any("pipe", "in-process pipes"),
    any("pipe2", "in-process pipes"),
    Allowed {
        name: "ioctl",
        rule: ArgRule::IoctlAllowlist,
        why: "isatty, terminal size, FIONREAD, FIONBIO, FIOCLEX",
    },
    // Paths: Landlock restricts every one of these to the policy's read/write paths.
    watch_writes(
        "open",
        1,
        "opening files (Landlock checks the path; writes are reported)",
    ),
    watch_writes(
        "openat",
        2,
        "opening files (Landlock checks the path; writes are reported)",
    ),
    watch(
        "openat2",
        "opening files (flags are behind a pointer: always watched)",
    ),
    watch("creat", "creating files (Landlock checks the path)"),
    any("stat", "file metadata"),
    any("lstat", "file metadata"),
    any("fstat", "file metadata"),
    any("newfstatat", "file metadata"),
    any("statx", "file metadata"),
    any("statfs", "file system metadata"),
    any("fstatfs", "file system metadata"),
    any("access", "permission checks"),
    any("faccessat", "permission checks"),
    any("faccessat2", "permission checks"),
    any("readlink", "symlink targets"),
    any("readlinkat", "symlink targets"),
    any("getdents", "directory listings"),
    any("getdents64", "directory listings"),
    any("getcwd", "working directory"),
    any("chdir", "working directory"),
    any("fchdir", "working directory"),
    any("getxattr", "extended attributes (read)"),
    any("lgetxattr", "extended attributes (read)"),
    any("fgetxattr", "extended attributes (read)"),
    any("getxattrat", "extended attributes (read)"),
    any("listxattr", "extended attributes (read)"),
    any("llistxattr", "extended attributes (read)"),
    any("flistxattr", "extended attributes (read)"),
    any("listxattrat", "extended attributes (read)"),
    any("file_getattr", "file attributes (read)"),
    watch("mkdir", "writes under --rw (Landlock checks the path)"),
    watch("mkdirat", "writes under --rw (Landlock checks the path)"),
    watch("rmdir", "writes under --rw (Landlock checks the path)"),
    watch("unlink", "writes under --rw (Landlock checks the path)"),
    watch("unlinkat", "writes under --rw (Landlock checks the path)"),
    watch("rename", "writes under --rw (Landlock checks the path)"),
    watch("renameat", "writes under --rw (Landlock checks the path)"),
    watch("renameat2", "writes under --rw (Landlock checks the path)"),
    watch("link", "writes under --rw (Landlock checks the path)"),
    watch("linkat", "writes under --rw (Landlock checks the path)"),
    watch("symlink", "writes under --rw (Landlock checks the path)"),
    watch("symlinkat", "writes under --rw (Landlock checks the path)"),
    watch("truncate", "writes under --rw (Landlock checks the path)"),
    any("ftruncate", "writes to open descriptors"),
    any("fallocate", "writes to open descriptors"),
    any("fsync", "durability of written files"),
    any("fdatasync", "durability of written files"),
    any("sync_file_range", "durability of written files"),
    any("syncfs", "durability of written files"),
    any("umask", "file creation mask"),
    // Memory.
    any("brk", "heap"),
    Allowed {
        name: "mmap",
        rule: ArgRule::NoSharedAnonInZygote,
        why: "memory mappings (no shared anonymous memory in a zygote)",
    },
    any("munmap", "memory mappings"),
    any("mremap", "memory mappings"),
    any("mprotect", "memory mappings"),
    any("pkey_mprotect", "memory mappings"),
    any("pkey_alloc", "memory protection keys"),
    any("pkey_free", "memory protection keys"),
    Allowed {
        name: "madvise",
        rule: ArgRule::MadviseNoMergeable,
        why: "memory hints (not MADV_MERGEABLE: same-page merging is the operator's choice)",
    },
    any("mincore", "memory residency"),
    any("msync", "mapped files"),
    any("mseal", "glibc seals its mappings"),
    any("map_shadow_stack", "CET shadow stacks"),
    any("membarrier", "runtime memory barriers"),
    any("get_mempolicy", "NUMA queries by allocators"),
    // Signals to itself (a PID namespace and Landlock signal scoping keep them in).
    any("rt_sigaction", "signal handlers"),
    any("rt_sigprocmask", "signal masks"),
    any("rt_sigreturn", "return from signal handlers"),
    any("rt_sigpending", "signal state"),
    any("rt_sigsuspend", "waiting for a signal"),
    any("rt_sigtimedwait", "waiting for a signal"),
    any("sigaltstack", "signal stacks"),
    any("signalfd", "signals as descriptors"),
    any("signalfd4", "signals as descriptors"),
    Allowed {
        name: "kill",
        rule: ArgRule::SelfPid,
        why: "signals to itself",
    },
    Allowed {
        name: "tkill",
        rule: ArgRule::SelfPid,
        why: "signals to itself",
    },
    Allowed {
        name: "tgkill",
        rule: ArgRule::SelfPid,
        why: "signals to itself (raise, abort)",
    },
    any("restart_syscall", "restarting interrupted calls"),
    // Event loops (asyncio): waiting on descriptors of its own.
    any("poll", "event loops"),
    any("ppoll", "event loops"),
    any("select", "event loops"),
    any("pselect6", "event loops"),
    any("epoll_create", "event loops"),
    any("epoll_create1", "event loops"),
    any("epoll_ctl", "event loops"),
    any("epoll_wait", "event loops"),
    any("epoll_pwait", "event loops"),
    any("epoll_pwait2", "event loops"),
    any("eventfd", "event loops"),
    any("eventfd2", "event loops"),
    // Sockets the guest already has (AF_UNIX pairs): it cannot create others.
    Allowed {
        name: "socketpair",
        rule: ArgRule::UnixStreamPair,
        why: "asyncio self-pipe",
    },
    Allowed {
        name: "sendto",
        rule: ArgRule::NoDestAddr,
        why: "send on a connected pair",
    },
    any(
        "sendmsg",
        "send on a connected pair (no other sockets exist)",
    ),
    any(
        "sendmmsg",
        "send on a connected pair (no other sockets exist)",
    ),
    any("recvfrom", "receive on a connected pair"),
    any("recvmsg", "receive on a connected pair"),
    any("recvmmsg", "receive on a connected pair"),
    any("shutdown", "close half of a pair"),
    any("getsockname", "socket queries"),
    any("getpeername", "socket queries"),
    any("getsockopt", "socket queries"),
    any("setsockopt", "options on a pair"),
    // Identity and process queries.
    any("getpid", "identity"),
    any("gettid", "identity"),
    any("getppid", "identity"),
    any("getuid", "identity"),
    any("geteuid", "identity"),
    any("getgid", "identity"),
    any("getegid", "identity"),
    any("getresuid", "identity"),
    any("getresgid", "identity"),
    any("getgroups", "identity"),
    any("getpgrp", "identity"),
    any("getpgid", "identity"),
    any("getsid", "identity"),
    any("capget", "capability queries (all are zero)"),
    any(
        "uname",
        "system identity (hostname pinned in a UTS namespace)",
    ),
    any("sysinfo", "memory totals (libraries size caches)"),
    any("getrlimit", "resource limits"),
    Allowed {
        name: "prlimit64",
        rule: ArgRule::SelfOnly,
        why: "its own resource limits (pid 0 only: not another process's)",
    },
    any("setrlimit", "resource limits (lowering needs no privilege)"),
    any("getrusage", "own resource usage"),
    any("times", "own CPU times"),
    any("getpriority", "scheduling queries"),
    any("sched_yield", "scheduling"),
    any("sched_getaffinity", "os.cpu_count()"),
    any("sched_getparam", "scheduling queries"),
    any("sched_getscheduler", "scheduling queries"),
    any("sched_getattr", "scheduling queries"),
    any("sched_get_priority_max", "scheduling queries"),
    any("sched_get_priority_min", "scheduling queries"),
    any("sched_rr_get_interval", "scheduling queries"),
    any("getcpu", "scheduling queries"),
    any("ioprio_get", "scheduling queries"),
    any("wait4", "waiting (the guest has no children)"),
    any("waitid", "waiting (the guest has no children)"),
    // Clocks: reads go through the vDSO anyway (see the README's known limit).
    any("clock_gettime", "clock reads"),
    any("clock_getres", "clock reads"),
    any("gettimeofday", "clock reads"),
    any("time", "clock reads"),
    any("getitimer", "timer queries"),
    any("timer_gettime", "timer queries"),
    any("timer_getoverrun", "timer queries"),
    any("timer_delete", "timer cleanup"),
    any("timerfd_gettime", "timer queries"),
    // Runtime set-up done by libc and interpreters.
    Allowed {
        name: "arch_prctl",
        rule: ArgRule::ArchPrctlAllowlist,
        why: "thread pointer set-up and CPU feature queries (no fresh vDSO: it would read the real clock)",
    },
    any("set_tid_address", "libc start-up"),
    any("set_robust_list", "libc start-up"),
    any("rseq", "libc start-up"),
    Allowed {
        name: "prctl",
        rule: ArgRule::PrctlNoMergeOptIn,
        why: "process attributes (names, no_new_privs queries; not PR_SET_MEMORY_MERGE's opt-in)",
    },
    any("futex", "locks (single-threaded runtimes still use them)"),
    any("futex_waitv", "locks"),
    any("futex_wake", "locks"),
    any("futex_wait", "locks"),
    any("futex_requeue", "locks"),
    any("cachestat", "page cache queries"),
    Allowed {
        name: "seccomp",
        rule: ArgRule::NoListener,
        why: "self-narrowing filters",
    },
    any("landlock_create_ruleset", "self-narrowing Landlock domains"),
    any("landlock_add_rule", "self-narrowing Landlock domains"),
    any("landlock_restrict_self", "self-narrowing Landlock domains"),
    any("exit", "process exit"),
    any("exit_group", "process exit"),
];

/// The `ioctl` requests a guest may make (x86_64 values): what libc and CPython ask of the
/// descriptors they are given. All are queries or per-descriptor flags.
pub const IOCTL_ALLOWED: &[(u64, &str)] = &[
    (0x5401, "TCGETS"),       // isatty(), tcgetattr()
    (0x802c_542a, "TCGETS2"), // tcgetattr() in newer glibc
    (0x540f, "TIOCGPGRP"),    // tcgetpgrp()
    (0x5413, "TIOCGWINSZ"),   // os.get_terminal_size()
    (0x541b, "FIONREAD"),     // bytes ready to read
    (0x5421, "FIONBIO"),      // socket.setblocking()
    (0x5450, "FIONCLEX"),     // os.set_inheritable(fd, True)
    (0x5451, "FIOCLEX"),      // os.set_inheritable(fd, False)
];

/// The `arch_prctl` codes a guest may use (x86_64 values): the thread pointer (every C
/// library), CPU feature queries and requests for itself (CPUID faulting's state, AMX state
/// components), CET and shadow-stack status and control (glibc built with CET), and the
/// linear-address-masking queries. Refused: `ARCH_MAP_VDSO_X32/_32/_64` (a fresh vDSO reads
/// the real clock), `ARCH_SET_CPUID`, `ARCH_FORCE_TAGGED_SVA`, the KVM guest permissions.
pub const ARCH_PRCTL_ALLOWED: &[(u64, &str)] = &[
    (0x1001, "ARCH_SET_GS"),
    (0x1002, "ARCH_SET_FS"),
    (0x1003, "ARCH_GET_FS"),
    (0x1004, "ARCH_GET_GS"),
    (0x1011, "ARCH_GET_CPUID"),
    (0x1021, "ARCH_GET_XCOMP_SUPP"),
    (0x1022, "ARCH_GET_XCOMP_PERM"),
    (0x1023, "ARCH_REQ_XCOMP_PERM"),
    (0x3001, "ARCH_CET_STATUS"),
    (0x4001, "ARCH_GET_UNTAG_MASK"),
    (0x4002, "ARCH_ENABLE_TAGGED_ADDR"),
    (0x4003, "ARCH_GET_MAX_TAG_BITS"),
    (0x5001, "ARCH_SHSTK_ENABLE"),
    (0x5002, "ARCH_SHSTK_DISABLE"),
    (0x5003, "ARCH_SHSTK_LOCK"),
    (0x5004, "ARCH_SHSTK_UNLOCK"),
    (0x5005, "ARCH_SHSTK_STATUS"),
];

/// The `arch_prctl` codes that map a vDSO (refused: see [`ARCH_PRCTL_ALLOWED`]).
pub const ARCH_MAP_VDSO: &[(u64, &str)] = &[
    (0x2001, "ARCH_MAP_VDSO_X32"),
    (0x2002, "ARCH_MAP_VDSO_32"),
    (0x2003, "ARCH_MAP_VDSO_64"),
];

/// The name of `arch_prctl` code `code`, for reports.
pub fn arch_prctl_name(code: u64) -> Option<&'static str> {
    const OTHERS: &[(u64, &str)] = &[
        (0x1012, "ARCH_SET_CPUID"),
        (0x1024, "ARCH_GET_XCOMP_GUEST_PERM"),
        (0x1025, "ARCH_REQ_XCOMP_GUEST_PERM"),
        (0x4004, "ARCH_FORCE_TAGGED_SVA"),
    ];
    ARCH_PRCTL_ALLOWED
        .iter()
        .chain(ARCH_MAP_VDSO)
        .chain(OTHERS)
        .find(|&&(c, _)| c == code)
        .map(|&(_, n)| n)
}

/// `prctl`'s same-page merging options (Linux 6.4): opting in (argument 1) is refused, opting
/// out (0) and asking are not (`ArgRule::PrctlNoMergeOptIn`).
pub const PR_SET_MEMORY_MERGE: u64 = 67;
pub const PR_GET_MEMORY_MERGE: u64 = 68;

/// `madvise`'s same-page merging advice: opting a range in is refused, opting it out is not
/// (`ArgRule::MadviseNoMergeable`).
pub const MADV_MERGEABLE: u64 = 12;
pub const MADV_UNMERGEABLE: u64 = 13;

/// The name of `prctl` option `option`, for reports (the few a report is likely to show).
pub fn prctl_name(option: u64) -> Option<&'static str> {
    Some(match option & 0xffff_ffff {
        1 => "PR_SET_PDEATHSIG",
        4 => "PR_SET_DUMPABLE",
        15 => "PR_SET_NAME",
        22 => "PR_SET_SECCOMP",
        38 => "PR_SET_NO_NEW_PRIVS",
        PR_SET_MEMORY_MERGE => "PR_SET_MEMORY_MERGE",
        PR_GET_MEMORY_MERGE => "PR_GET_MEMORY_MERGE",
        _ => return None,
    })
}

/// The name of `madvise` advice `advice`, for reports.
pub fn madvise_name(advice: u64) -> Option<&'static str> {
    Some(match advice & 0xffff_ffff {
        0 => "MADV_NORMAL",
        4 => "MADV_DONTNEED",
        8 => "MADV_FREE",
        MADV_MERGEABLE => "MADV_MERGEABLE",
        MADV_UNMERGEABLE => "MADV_UNMERGEABLE",
        14 => "MADV_HUGEPAGE",
        15 => "MADV_NOHUGEPAGE",
        25 => "MADV_COLLAPSE",
        _ => return None,
    })
}

/// The `fcntl` commands a guest may make.
pub const FCNTL_ALLOWED: &[(u64, &str)] = &[
    (0, "F_DUPFD"),
    (1, "F_GETFD"),
    (2, "F_SETFD"),
    (3, "F_GETFL"),
    (4, "F_SETFL"),
    (5, "F_GETLK"),
    (36, "F_OFD_GETLK"),
    (1030, "F_DUPFD_CLOEXEC"),
    (1032, "F_GETPIPE_SZ"),
    (1034, "F_GET_SEALS"),
];

/// The `fcntl` commands that take or release a record lock: supervised.
pub const FCNTL_LOCKS: &[(u64, &str)] = &[
    (6, "F_SETLK"),
    (7, "F_SETLKW"),
    (37, "F_OFD_SETLK"),
    (38, "F_OFD_SETLKW"),
];

/// The name of `fcntl` command `cmd`, for reports.
pub fn fcntl_name(cmd: u64) -> Option<&'static str> {
    const OTHERS: &[(u64, &str)] = &[
        (8, "F_SETOWN"),
        (9, "F_GETOWN"),
        (10, "F_SETSIG"),
        (11, "F_GETSIG"),
        (15, "F_SETOWN_EX"),
        (16, "F_GETOWN_EX"),
        (17, "F_GETOWNER_UIDS"),
        (1024, "F_SETLEASE"),
        (1025, "F_GETLEASE"),
        (1026, "F_NOTIFY"),
        (1027, "F_DUPFD_QUERY"),
        (1028, "F_CREATED_QUERY"),
        (1031, "F_SETPIPE_SZ"),
        (1033, "F_ADD_SEALS"),
        (1035, "F_GET_RW_HINT"),
        (1036, "F_SET_RW_HINT"),
        (1037, "F_GET_FILE_RW_HINT"),
        (1038, "F_SET_FILE_RW_HINT"),
    ];
    let cmd = cmd & 0xffff_ffff; // the kernel reads an unsigned int
    FCNTL_ALLOWED
        .iter()
        .chain(FCNTL_LOCKS)
        .chain(OTHERS)
        .find(|&&(c, _)| c == cmd)
        .map(|&(_, n)| n)
}

/// The name of `ioctl` request `req`, for reports (the allowed ones and those a hostile guest
/// tries: terminal control, SIGIO routing, inode flags, interface queries, reflinks).
pub fn ioctl_name(req: u64) -> Option<&'static str> {
    const OTHERS: &[(u64, &str)] = &[
        (0x5402, "TCSETS"),
        (0x5403, "TCSETSW"),
        (0x5404, "TCSETSF"),
        (0x5409, "TCSBRK"),
        (0x540a, "TCXONC"),
        (0x540b, "TCFLSH"),
        (0x540c, "TIOCEXCL"),
        (0x540d, "TIOCNXCL"),
        (0x540e, "TIOCSCTTY"),
        (0x5410, "TIOCSPGRP"),
        (0x5412, "TIOCSTI"),
        (0x5414, "TIOCSWINSZ"),
        (0x541c, "TIOCLINUX"),
        (0x541d, "TIOCCONS"),
        (0x5422, "TIOCNOTTY"),
        (0x5423, "TIOCSETD"),
        (0x5429, "TIOCGSID"),
        (0x5452, "FIOASYNC"),
        (0x8901, "FIOSETOWN"),
        (0x8902, "SIOCSPGRP"),
        (0x8903, "FIOGETOWN"),
        (0x8904, "SIOCGPGRP"),
        (0x8912, "SIOCGIFCONF"),
        (0x8913, "SIOCGIFFLAGS"),
        (0x8915, "SIOCGIFADDR"),
        (0x8927, "SIOCGIFHWADDR"),
        (0x8933, "SIOCGIFINDEX"),
        (0x8008_6601, "FS_IOC_GETFLAGS"),
        (0x4008_6602, "FS_IOC_SETFLAGS"),
        (0x801c_581f, "FS_IOC_FSGETXATTR"),
        (0x401c_5820, "FS_IOC_FSSETXATTR"),
        (0x8008_7601, "FS_IOC_GETVERSION"),
        (0x4008_7602, "FS_IOC_SETVERSION"),
        (0xc020_660b, "FS_IOC_FIEMAP"),
        (0x4004_9409, "FICLONE"),
        (0x4020_940d, "FICLONERANGE"),
        (0xc018_9436, "FIDEDUPERANGE"),
        (0x0001, "FIBMAP"),
        (0x0002, "FIGETBSZ"),
    ];
    let req = req & 0xffff_ffff; // the kernel reads an unsigned int
    IOCTL_ALLOWED
        .iter()
        .chain(OTHERS)
        .find(|&&(r, _)| r == req)
        .map(|&(_, n)| n)
}

/// Syscalls the `[time] sleep = "allow"` knob adds.
pub const SLEEP: &[&str] = &[
    "nanosleep",
    "clock_nanosleep",
    "alarm",
    "setitimer",
    "timer_create",
    "timer_settime",
    "timerfd_create",
    "timerfd_settime",
    "pause",
];

/// How a wait's timeout is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timeout {
    /// Milliseconds, an `int` argument (negative: no timeout).
    Millis(usize),
    /// A pointer to a `struct timespec` (NULL: no timeout).
    Timespec(usize),
    /// A pointer to a `struct timeval` (NULL: no timeout).
    Timeval(usize),
}

/// Waits that can block for a while without a sleep call: under `[time] sleep = "deny"`
/// a wait with a non-zero timeout is a `sleep` violation (it blocks the worker like
/// `time.sleep`); without a timeout, or with a zero one, it runs. `futex` only for its wait
/// commands (`FUTEX_WAIT`, `FUTEX_WAIT_BITSET`, the PI locks); threads are denied, so
/// nothing else could wake it.
pub const TIMED_WAITS: &[(&str, Timeout)] = &[
    ("poll", Timeout::Millis(2)),
    ("epoll_wait", Timeout::Millis(3)),
    ("epoll_pwait", Timeout::Millis(3)),
    ("ppoll", Timeout::Timespec(2)),
    ("select", Timeout::Timeval(4)),
    ("pselect6", Timeout::Timespec(4)),
    ("epoll_pwait2", Timeout::Timespec(3)),
    ("rt_sigtimedwait", Timeout::Timespec(2)),
    ("futex", Timeout::Timespec(3)),
    ("futex_waitv", Timeout::Timespec(3)),
    ("recvmmsg", Timeout::Timespec(4)),
];

/// The timeout of timed wait `name`, if it is one.
pub fn timed_wait(name: &str) -> Option<Timeout> {
    TIMED_WAITS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|&(_, t)| t)
}

/// Syscalls the `[random] getrandom = "allow"` knob adds.
pub const RANDOM: &[&str] = &["getrandom"];

/// Syscalls governed by `[network] mode` (allowed only with `mode = "allow"`).
pub const NETWORK: &[&str] = &["socket", "connect", "bind", "listen", "accept", "accept4"];

/// Syscalls governed by `[process]`: they cannot be listed in `[syscalls] allow`.
pub const PROCESS: &[&str] = &["clone", "clone3", "fork", "vfork", "execve", "execveat"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_sorted_and_complete() {
        assert!(X86_64.windows(2).all(|w| w[0].1 < w[1].1));
        assert_eq!(number("read"), Some(0));
        assert_eq!(number("clone3"), Some(435));
        assert_eq!(name(59), Some("execve"));
        for a in BASE_ALLOWLIST {
            assert!(number(a.name).is_some(), "{} not in table", a.name);
            assert!(!always_denied(a.name), "{} is always denied", a.name);
        }
        for n in SLEEP.iter().chain(RANDOM).chain(NETWORK).chain(PROCESS) {
            assert!(number(n).is_some(), "{n}");
        }
    }

    #[test]
    fn suggestions() {
        assert_eq!(closest("opnat", 1), vec!["openat"]);
        assert!(closest("qqqqqqqqqqqq", 3).is_empty());
    }

    #[test]
    fn categories() {
        assert_eq!(category("connect"), Category::Network);
        assert_eq!(category("bpf"), Category::Privilege);
        assert_eq!(category("getrandom"), Category::Random);
        assert_eq!(category("inotify_init1"), Category::Filesystem);
        assert_eq!(category("mlock"), Category::Other);
    }
}
