//! Opens for writing, and path operations, done by the supervisor for the guest (finding F). Judging a write-open
//! and then letting the kernel run it leaves a window: between the supervisor's reading of
//! the path (from guest memory, through the file system) and the kernel's, a sibling can
//! change either, and a path that was inside the grants reaches outside. Landlock still
//! refuses that write, but the refusal is nobody's report. So for `open`, `openat` and
//! `creat` with write intent, the supervisor opens the very path it judged, beneath the
//! grant it judged it under (`openat2` with `RESOLVE_BENEATH`: a symbolic link that leads out
//! fails with EXDEV, which is then reported), and hands the descriptor to the guest
//! (`SECCOMP_IOCTL_NOTIF_ADDFD`), as the call's result.
//!
//! The open is made as the guest would make it: with the guest's umask, without the
//! supervisor's capabilities (a root supervisor drops its effective set around the open, as
//! the guest has none), `O_NONBLOCK` only while opening (a FIFO must not block the
//! supervisor) and cleared after unless the guest asked for it, and `O_CLOEXEC` on the guest's
//! descriptor only if it asked. Paths under `/proc`, descriptors without a path and paths the
//! kernel will refuse anyway keep the old way (the call continues).
//!
//! The same holds for `openat2` without resolve flags of the guest's own, and for `mkdir`,
//! `rmdir`, `unlink`, `rename`, `symlink`, `link` (and their `*at` forms): the supervisor
//! reaches each path's directory beneath its grant and makes the call relative to it
//! (`mkdirat`, `unlinkat`, `renameat2`, `symlinkat`, `linkat`: the last name as resolved,
//! never followed again), and the guest's call returns what it returned; `truncate` is an
//! open beneath the grant and `ftruncate` (a length past the guest's RLIMIT_FSIZE is left to
//! the kernel, which answers EFBIG and SIGXFSZ). An `openat2` that the guest confined to its
//! directory descriptor itself (`RESOLVE_BENEATH`, `RESOLVE_IN_ROOT`), that directory in a
//! grant, is opened from that directory with the guest's own resolve flags ([`Within`]).
//! Other resolve flags of the guest's own, and `linkat` with `AT_EMPTY_PATH`, keep the old
//! way.

use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;

use super::paths::{self, Grants};
use crate::guest_memory::GuestMemory;
use crate::sys::{self, Notif};

/// What the guest asked to open, as read once from its memory and judged granted.
#[derive(Debug)]
pub struct Target {
    pub syscall: &'static str,
    /// The path as the guest named it (for a report).
    pub shown: String,
    /// Where to open it, or the error it meets.
    pub how: paths::GrantedOpen,
    pub flags: u64,
    pub mode: u64,
    /// An `openat2` the guest confined to its directory itself: opened from there.
    pub within: Option<Within>,
}

/// An `openat2` whose own resolve flags confine it to the guest's directory descriptor
/// (`RESOLVE_BENEATH`, `RESOLVE_IN_ROOT`), that directory lying in a grant: the supervisor
/// reaches the directory beneath its grant (the target's `how`), checks it is the guest's,
/// and opens the guest's path from it with the guest's resolve flags, as the kernel would
/// have; the result cannot leave that directory, so it cannot leave the grant.
#[derive(Debug)]
pub struct Within {
    /// The guest's directory as the supervisor reaches it (`/proc/PID/fd/N`, `/proc/PID/cwd`).
    pub guest_dir: std::path::PathBuf,
    /// The path as the guest gave it.
    pub path: CString,
    /// The guest's resolve flags.
    pub resolve: u64,
}

/// The open's outcome.
#[derive(Debug)]
pub enum Opened {
    /// The descriptor to hand over.
    Fd(OwnedFd),
    /// The error the guest's own open would have met.
    Errno(i32),
    /// The path led out of the grant between the judgement and the open.
    Escaped,
}

/// The open that notification `n` asks for, when it is one the supervisor makes: a write-open
/// (`open`, `openat`, `creat`) of a path inside the grants. Reads the path once.
pub fn candidate(n: &Notif, mem: &dyn GuestMemory, name: &str, grants: &Grants) -> Option<Target> {
    let a = &n.args;
    let (syscall, dirfd, path_addr) = match name {
        "open" => ("open", libc::AT_FDCWD, a[0]),
        "openat" => ("openat", a[0] as i32, a[1]),
        // A `struct open_how` smaller than its first version: the kernel's EINVAL.
        "openat2" if a[3] >= 24 => ("openat2", a[0] as i32, a[1]),
        "creat" => ("creat", libc::AT_FDCWD, a[0]),
        _ => return None,
    };
    let super::decode::OpenArgs {
        flags,
        mode,
        resolve,
    } = super::decode::open_args(name, a, mem)?;
    if flags & super::decode::OPEN_WRITE_BITS == 0 || flags & libc::O_PATH as u64 != 0 {
        return None;
    }
    let raw = mem.read_path(path_addr).ok()?;
    if resolve != 0 {
        return within_dir(n.pid, dirfd, raw, flags, mode, resolve, grants);
    }
    let path = paths::guest_path(dirfd, &raw);
    // O_NOFOLLOW, and O_CREAT|O_EXCL, do not follow a final symlink.
    let excl = (libc::O_CREAT | libc::O_EXCL) as u64;
    let follow = flags & libc::O_NOFOLLOW as u64 == 0 && flags & excl != excl;
    Some(Target {
        syscall,
        shown: paths::display(n.pid, &path).display().to_string(),
        how: grants.granted_target(n.pid, &path, follow),
        flags,
        mode,
        within: None,
    })
}

/// An `openat2` with resolve flags of the guest's own: the supervisor's when they confine the
/// open to the guest's directory and that directory lies in a grant ([`Within`]). Other
/// resolve flags are rules the supervisor's own resolution does not follow: the kernel makes
/// those calls (judged first by `decode.rs`).
fn within_dir(
    pid: u32,
    dirfd: i32,
    raw: Vec<u8>,
    flags: u64,
    mode: u64,
    resolve: u64,
    grants: &Grants,
) -> Option<Target> {
    if resolve & (libc::RESOLVE_BENEATH | libc::RESOLVE_IN_ROOT) == 0 {
        return None;
    }
    let dir = paths::guest_dir(dirfd);
    let how = grants.granted_target(pid, &dir, true);
    if !matches!(how, paths::GrantedOpen::Beneath(..)) {
        return None;
    }
    let guest_dir = paths::display(pid, &dir);
    let rel = std::ffi::OsStr::from_bytes(&raw);
    let rel = Path::new(rel).strip_prefix("/").unwrap_or(Path::new(rel));
    Some(Target {
        syscall: "openat2",
        shown: paths::display(pid, &dir.join(rel)).display().to_string(),
        how,
        flags,
        mode,
        within: Some(Within {
            guest_dir,
            path: CString::new(raw).ok()?,
            resolve,
        }),
    })
}

/// The guest's file mode creation mask (`Umask:` of `/proc/PID/status`).
fn guest_umask(pid: u32) -> Option<u32> {
    u32::from_str_radix(crate::procfs::Status::of(pid)?.field("Umask")?, 8).ok()
}

/// Opens `t` for guest `pid` as described in the module's comment; `None` when it is left
/// to the kernel after all.
pub fn open(pid: u32, t: &Target) -> Option<Opened> {
    let (grant, resolved) = match &t.how {
        paths::GrantedOpen::Beneath(g, r) => (g, r),
        // Stopped below a grant while judged (a name missing, not a directory): the kernel's
        // answer for that path.
        paths::GrantedOpen::Fails(errno) => return Some(Opened::Errno(*errno)),
        paths::GrantedOpen::Refused | paths::GrantedOpen::Kernel => return None,
    };
    let (dirfd, rel, resolve) = match &t.within {
        Some(w) => match reach_guest_dir(grant, resolved, &w.guest_dir)? {
            Ok(dirfd) => (dirfd, w.path.clone(), w.resolve),
            Err(o) => return Some(o),
        },
        None => {
            let (dir, rel) = if grant == resolved {
                (resolved.parent()?, Path::new(resolved.file_name()?))
            } else {
                (grant.as_path(), resolved.strip_prefix(grant).ok()?)
            };
            if rel.as_os_str().is_empty() {
                return None;
            }
            let rel = CString::new(rel.as_os_str().as_bytes()).ok()?;
            let resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
            (open_dir(dir)?, rel, resolve)
        }
    };
    let umask = guest_umask(pid)?;
    let flags = t.flags | (libc::O_CLOEXEC | libc::O_NONBLOCK) as u64;
    // openat2 refuses a mode without O_CREAT or O_TMPFILE (open ignores it).
    let creates = t.flags & (libc::O_CREAT | libc::O_TMPFILE) as u64 != 0;
    let mode = if creates {
        t.mode & 0o7777 & !u64::from(umask)
    } else {
        0
    };
    let r = as_guest(|| sys::openat2(dirfd.as_fd(), &rel, flags, mode, resolve));
    Some(match r {
        Ok(fd) => {
            if t.flags & libc::O_NONBLOCK as u64 == 0 {
                let _ = sys::clear_nonblock(fd.as_fd());
            }
            Opened::Fd(fd)
        }
        // Out of the grant; under the guest's own confinement, the guest's own error.
        Err(Errno::EXDEV) if t.within.is_none() => Opened::Escaped,
        // Flags openat2 refuses and open ignores (unknown bits), or openat2 refused by a
        // container's profile (Linux < 5.6 or a profile that predates it): the kernel's call.
        Err(Errno::EINVAL | Errno::ENOSYS | Errno::EPERM) => return None,
        Err(e) => Opened::Errno(e as i32),
    })
}

/// A path operation (`mkdir`, `unlink`, `rmdir`, `rename`, `symlink` and their `*at`
/// forms) the supervisor makes for the guest: each path it names, read once, resolved, and
/// judged inside the grants, its directory to be reached beneath its grant.
#[derive(Debug)]
pub struct PathRequest {
    pub syscall: &'static str,
    /// Each named path: as shown in a report, and where it was judged.
    pub paths: Vec<(String, paths::GrantedOpen)>,
    /// The link's target (`symlink`), as the guest gave it.
    pub target: Option<Vec<u8>>,
    /// `mkdir`'s mode, `unlinkat`'s and `renameat2`'s flags.
    pub mode_or_flags: u64,
}

/// The path operation notification `n` asks for, when it is one the supervisor makes.
pub fn candidate_op(
    n: &Notif,
    mem: &dyn GuestMemory,
    name: &str,
    grants: &Grants,
) -> Option<PathRequest> {
    let a = &n.args;
    let (syscall, extra): (&'static str, u64) = match name {
        "mkdir" => ("mkdir", a[1]),
        "mkdirat" => ("mkdirat", a[2]),
        "rmdir" => ("rmdir", libc::AT_REMOVEDIR as u64),
        "unlink" => ("unlink", 0),
        "unlinkat" => ("unlinkat", a[2]),
        "rename" => ("rename", 0),
        "renameat" => ("renameat", 0),
        "renameat2" => ("renameat2", a[4]),
        "symlink" => ("symlink", 0),
        "symlinkat" => ("symlinkat", 0),
        "link" => ("link", 0),
        // AT_EMPTY_PATH (the descriptor itself) is the kernel's; AT_SYMLINK_FOLLOW is
        // applied here when the source is resolved.
        "linkat" if a[4] & libc::AT_EMPTY_PATH as u64 == 0 => ("linkat", a[4]),
        "truncate" => ("truncate", a[1]),
        _ => return None,
    };
    let target = match syscall {
        "symlink" | "symlinkat" => Some(mem.read_path(a[0]).ok()?),
        _ => None,
    };
    let mut paths = Vec::new();
    for &(dirfd_arg, path_arg, follows) in crate::policy::decisions::watched_paths(name) {
        let raw = mem.read_path(a[path_arg]).ok()?;
        let follow = match (syscall, path_arg) {
            ("linkat", 1) => extra & libc::AT_SYMLINK_FOLLOW as u64 != 0,
            _ => follows,
        };
        let dirfd = dirfd_arg.map_or(libc::AT_FDCWD, |i| a[i] as i32);
        let path = paths::guest_path(dirfd, &raw);
        let shown = paths::display(n.pid, &path).display().to_string();
        paths.push((shown, grants.granted_target(n.pid, &path, follow)));
    }
    Some(PathRequest {
        syscall,
        paths,
        target,
        mode_or_flags: extra,
    })
}

/// The directory of `resolved` reached beneath `grant`, and its last name; `None` where the
/// path is not below a granted directory (a granted file itself: left to the kernel).
fn parent_beneath(grant: &Path, resolved: &Path) -> Option<Result<(OwnedFd, CString), Opened>> {
    let parent = resolved.parent()?;
    let name = CString::new(resolved.file_name()?.as_bytes()).ok()?;
    let rel = parent.strip_prefix(grant).ok()?;
    let grant_fd = open_dir(grant)?;
    if rel.as_os_str().is_empty() {
        return Some(Ok((grant_fd, name)));
    }
    let rel = CString::new(rel.as_os_str().as_bytes()).ok()?;
    let flags = (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64;
    Some(
        match sys::openat2_beneath(grant_fd.as_fd(), &rel, flags, 0) {
            Ok(fd) => Ok((fd, name)),
            Err(Errno::EXDEV) => Err(Opened::Escaped),
            Err(Errno::EINVAL | Errno::ENOSYS | Errno::EPERM) => return None,
            Err(e) => Err(Opened::Errno(e as i32)),
        },
    )
}

/// Makes path operation `r` for guest `pid` beneath its grants: `Ok` (the call returns 0),
/// the error the guest's call would meet, or [`Opened::Escaped`]; `None` when it is left
/// to the kernel (a path not below a granted directory, a refused one, `/proc`).
pub fn path_op(pid: u32, r: &PathRequest) -> Option<Result<(), Opened>> {
    if r.syscall == "truncate" {
        return truncate(pid, r); // an open beneath the grant, not a directory's
    }
    let mut dirs = Vec::with_capacity(2);
    for (_, how) in &r.paths {
        match how {
            paths::GrantedOpen::Beneath(grant, resolved) if grant != resolved => {
                match parent_beneath(grant, resolved)? {
                    Ok(d) => dirs.push(d),
                    Err(e) => return Some(Err(e)),
                }
            }
            paths::GrantedOpen::Fails(errno) => return Some(Err(Opened::Errno(*errno))),
            _ => return None,
        }
    }
    let umask = guest_umask(pid)?;
    let (dir, name) = dirs.first()?;
    let target = r.target.as_ref().and_then(|t| CString::new(t.clone()).ok());
    let op = match r.syscall {
        "mkdir" | "mkdirat" => sys::PathOp::Mkdir {
            name,
            mode: (r.mode_or_flags as u32) & 0o7777 & !umask,
        },
        "rmdir" | "unlink" | "unlinkat" => sys::PathOp::Unlink {
            name,
            flags: r.mode_or_flags as i32,
        },
        "rename" | "renameat" | "renameat2" => {
            let (to_dir, to) = dirs.get(1)?;
            sys::PathOp::Rename {
                from: name,
                to_dir: to_dir.as_fd(),
                to,
                flags: r.mode_or_flags as u32,
            }
        }
        "symlink" | "symlinkat" => sys::PathOp::Symlink {
            target: target.as_deref()?,
            name,
        },
        // The source was resolved (followed or not, as the guest asked): linked as it is.
        "link" | "linkat" => {
            let (to_dir, to) = dirs.get(1)?;
            sys::PathOp::Link {
                from: name,
                to_dir: to_dir.as_fd(),
                to,
            }
        }
        _ => return None,
    };
    let result = as_guest(|| sys::path_op(dir.as_fd(), &op));
    Some(match result {
        Ok(()) => Ok(()),
        Err(Errno::EXDEV) if r.syscall.starts_with("rename") => Err(Opened::Errno(libc::EXDEV)),
        Err(Errno::ENOSYS) => return None,
        Err(e) => Err(Opened::Errno(e as i32)),
    })
}

/// `truncate(path, length)` beneath the grant: an open for writing (the permission truncate
/// needs), then `ftruncate`. A length past the guest's RLIMIT_FSIZE is the kernel's (it
/// fails the guest's own call with EFBIG and SIGXFSZ, which the supervisor's must not skip).
fn truncate(pid: u32, r: &PathRequest) -> Option<Result<(), Opened>> {
    let (grant, resolved) = match &r.paths.first()?.1 {
        paths::GrantedOpen::Beneath(g, r) => (g, r),
        paths::GrantedOpen::Fails(errno) => return Some(Err(Opened::Errno(*errno))),
        _ => return None,
    };
    let len = r.mode_or_flags as i64;
    let limit = sys::file_size_limit(pid)?;
    if len < 0 || limit.is_some_and(|l| len as u64 > l) {
        return None;
    }
    let t = Target {
        syscall: "truncate",
        shown: String::new(),
        how: paths::GrantedOpen::Beneath(grant.clone(), resolved.clone()),
        flags: libc::O_WRONLY as u64,
        mode: 0,
        within: None,
    };
    Some(match open(pid, &t)? {
        Opened::Fd(fd) => as_guest(|| sys::ftruncate_regular(fd.as_fd(), len))
            .map_err(|e| Opened::Errno(e as i32)),
        other => Err(other),
    })
}

/// The guest's directory `guest_dir` (a `/proc/PID/...` link), judged to be `dir` in `grant`:
/// reached beneath the grant and checked to be the same directory (a sibling may have moved
/// another one to its name meanwhile: `Escaped`, refused and reported).
fn reach_guest_dir(grant: &Path, dir: &Path, guest_dir: &Path) -> Option<Result<OwnedFd, Opened>> {
    use std::os::unix::fs::MetadataExt;
    let g = open_dir(grant)?;
    let reached = match dir.strip_prefix(grant).ok()? {
        rel if rel.as_os_str().is_empty() => g,
        rel => {
            let rel = CString::new(rel.as_os_str().as_bytes()).ok()?;
            let flags = (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64;
            match sys::openat2_beneath(g.as_fd(), &rel, flags, 0) {
                Ok(fd) => fd,
                Err(Errno::EXDEV) => return Some(Err(Opened::Escaped)),
                Err(Errno::EINVAL | Errno::ENOSYS | Errno::EPERM) => return None,
                Err(e) => return Some(Err(Opened::Errno(e as i32))),
            }
        }
    };
    let theirs = std::fs::metadata(guest_dir).ok()?;
    let ours = nix::sys::stat::fstat(&reached).ok()?;
    if (theirs.dev(), theirs.ino()) != (ours.st_dev, ours.st_ino) {
        return Some(Err(Opened::Escaped));
    }
    Some(Ok(reached))
}

/// A directory, as a handle to resolve beneath (`O_PATH`).
fn open_dir(dir: &Path) -> Option<OwnedFd> {
    use nix::fcntl::OFlag;
    nix::fcntl::open(
        dir,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .ok()
}

/// Runs `f` as the guest would make the call: without capabilities (a root supervisor has
/// CAP_DAC_OVERRIDE; the guest has none) and without a umask of ours (the guest's is applied
/// to the mode by the caller).
fn as_guest<T>(f: impl FnOnce() -> T) -> T {
    let dropped = drop_effective_caps();
    let old = sys::set_umask(0);
    let r = f();
    sys::set_umask(old);
    if let Some(saved) = dropped {
        let _ = caps::set(None, caps::CapSet::Effective, &saved);
    }
    r
}

/// Empties this thread's effective capability set when it has one; the set to restore.
fn drop_effective_caps() -> Option<caps::CapsHashSet> {
    let saved = caps::read(None, caps::CapSet::Effective).ok()?;
    if saved.is_empty() {
        return None;
    }
    caps::clear(None, caps::CapSet::Effective).ok()?;
    Some(saved)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::path::PathBuf;

    #[test]
    fn an_open_never_leaves_its_grant_whatever_a_link_became() {
        let dir = std::env::temp_dir().join(format!("wfjail-opener-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("grant/sub")).unwrap();
        let t = |rel: &str| Target {
            syscall: "openat",
            shown: rel.into(),
            how: paths::GrantedOpen::Beneath(dir.join("grant"), dir.join("grant").join(rel)),
            flags: (libc::O_WRONLY | libc::O_CREAT) as u64,
            mode: 0o666,
            within: None,
        };
        let me = std::process::id();
        // Inside: opened, with the umask applied.
        let Some(Opened::Fd(_)) = open(me, &t("sub/a")) else {
            panic!("inside the grant")
        };
        assert!(dir.join("grant/sub/a").exists());
        // `sub` judged a directory, then swapped for a link out of the grant: EXDEV.
        std::fs::remove_dir_all(dir.join("grant/sub")).unwrap();
        std::os::unix::fs::symlink(dir.as_path(), dir.join("grant/sub")).unwrap();
        assert!(
            matches!(open(me, &t("sub/escaped")), Some(Opened::Escaped)),
            "a link that leads out"
        );
        assert!(!dir.join("escaped").exists());
        // The kernel's own errors come back as they are.
        assert!(matches!(
            open(me, &t("missing/x")),
            Some(Opened::Errno(libc::ENOENT))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_guest_directory_replaced_after_judgement_is_not_opened_from() {
        let dir = std::env::temp_dir().join(format!("wfjail-within-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("grant/sub")).unwrap();
        let (grant, sub) = (dir.join("grant"), dir.join("grant/sub"));
        // What the guest's descriptor names, held open as the guest would hold it.
        let held = std::fs::File::open(&sub).unwrap();
        let theirs = PathBuf::from(format!("/proc/self/fd/{}", held.as_raw_fd()));
        let t = Target {
            syscall: "openat2",
            shown: "a".into(),
            how: paths::GrantedOpen::Beneath(grant.clone(), sub.clone()),
            flags: (libc::O_WRONLY | libc::O_CREAT) as u64,
            mode: 0o600,
            within: Some(Within {
                guest_dir: theirs,
                path: CString::new("/a").unwrap(),
                resolve: libc::RESOLVE_IN_ROOT,
            }),
        };
        let me = std::process::id();
        let Some(Opened::Fd(_)) = open(me, &t) else {
            panic!("the guest's directory, in the grant")
        };
        assert!(sub.join("a").exists());
        // Another directory moved to its name: not the guest's, refused.
        std::fs::rename(&sub, grant.join("moved")).unwrap();
        std::fs::create_dir(&sub).unwrap();
        assert!(matches!(open(me, &t), Some(Opened::Escaped)));
        drop(held);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
