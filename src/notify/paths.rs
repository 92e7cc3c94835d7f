//! Which file-system writes the policy grants, judged the way Landlock judges them: by the
//! identity (device, inode) of the granted directories and files, so that a path reached
//! through a bind mount or a symlink is treated like its target.
//!
//! A guest's path is resolved here by hand, one component at a time, as bytes (a file name
//! need not be UTF-8): symlinks are followed with `readlink` even when their target does not
//! exist (a dangling link in a `--rw` directory may point outside it), at most
//! [`MAX_SYMLINKS`] of them like the kernel, and `/proc/self` and `/proc/thread-self` name the
//! guest, not the supervisor. What cannot be resolved is judged by the deepest directory that
//! could be: inside the grants the kernel decides (it will say ENOENT or ENOTDIR); outside,
//! the write cannot be judged, and that is a violation.

use std::collections::{HashSet, VecDeque};
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

/// Symlinks followed in one resolution before it is ELOOP (the kernel's limit).
pub const MAX_SYMLINKS: u32 = 40;

/// The granted directories of one execution, by (device, inode): its write grants, and under
/// `warn` its read grants too (a path is judged against them the way Landlock would).
#[derive(Debug, Clone, Default)]
pub struct Grants {
    ids: HashSet<(u64, u64)>,
    /// Directories whose subdirectories may be opened (listed) but no file (`[filesystem]
    /// list`): only read grants judged under `warn` have any.
    list_ids: HashSet<(u64, u64)>,
}

/// An open inside the grants, as the supervisor makes it ([`Grants::granted_target`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrantedOpen {
    /// Open resolved path `.1` beneath granted directory (or granted file) `.0`.
    Beneath(PathBuf, PathBuf),
    /// The path stops resolving below a grant: the open fails with this errno.
    Fails(i32),
    /// Outside the grants, or not to be judged: a violation (`decode.rs` words it).
    Refused,
    /// Left to the kernel: a path under `/proc`, a descriptor without a path.
    Kernel,
}

/// How a write to one path is judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathJudgement {
    /// Inside the grants, or bound to fail in the kernel below a granted directory.
    Granted,
    /// Outside the grants: the path as resolved.
    Outside(PathBuf),
    /// Cannot be told (a component outside the grants could not be resolved): why.
    CannotJudge(String),
}

fn id_of(p: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

/// What resolving a path gave.
#[derive(Debug, PartialEq, Eq)]
enum Resolved {
    /// Every directory resolved: the path of the final name (which may not exist) and, when
    /// it exists, its identity.
    Full(PathBuf, Option<(u64, u64)>),
    /// Stopped at existing directory `.0`: `.1` says why.
    Partial(PathBuf, String, i32),
    /// A descriptor without a path (pipe, socket, anonymous inode) reached through
    /// `/proc/PID/fd/N`: the guest already holds it.
    Pseudo,
}

enum Part {
    Root,
    Up,
    Name(OsString),
}

fn parts(p: &Path) -> impl Iterator<Item = Part> + '_ {
    p.components().filter_map(|c| match c {
        Component::RootDir | Component::Prefix(_) => Some(Part::Root),
        Component::CurDir => None,
        Component::ParentDir => Some(Part::Up),
        Component::Normal(n) => Some(Part::Name(n.to_os_string())),
    })
}

/// Whether `p` is inside some process's `/proc/PID` directory, where symlinks are "magic":
/// the kernel jumps to the file behind them, which may have no path at all.
fn in_proc_pid(p: &Path) -> bool {
    let mut c = p.components();
    c.next() == Some(Component::RootDir)
        && c.next() == Some(Component::Normal(OsStr::new("proc")))
        && matches!(c.next(), Some(Component::Normal(n))
            if !n.is_empty() && n.as_bytes().iter().all(u8::is_ascii_digit))
}

/// Whether the guest (global pid `pid`) sees a `/proc` of its own (`namespaces.mount`): its
/// `/proc` is then another file system than ours.
fn has_private_proc(pid: u32) -> bool {
    let theirs = id_of(Path::new(&format!("/proc/{pid}/root/proc")));
    theirs.is_some_and(|t| Some(t.0) != id_of(Path::new("/proc")).map(|o| o.0))
}

/// The guest's pid in its own PID namespace (the last of `NSpid`).
fn pid_in_namespace(pid: u32) -> Option<u32> {
    crate::procfs::ns_pid(pid).map(|p| p as u32)
}

/// `path` with a `/proc/PID` of the guest (global `pid`) named the way the guest names it:
/// in a private `/proc`, by its pid in its own namespace.
fn as_guest_sees(pid: u32, path: PathBuf) -> PathBuf {
    let ours = PathBuf::from(format!("/proc/{pid}"));
    match path.strip_prefix(&ours) {
        Ok(rest) if has_private_proc(pid) => match pid_in_namespace(pid) {
            Some(n) => PathBuf::from(format!("/proc/{n}")).join(rest),
            None => path,
        },
        _ => path,
    }
}

/// Resolves absolute `path` as the guest (global pid `pid`) would. `follow`: the call
/// follows a final symlink.
///
/// `/proc/self` is the guest. `/proc/N` is host pid N when the guest shares our `/proc`;
/// with a private `/proc` it is pid N of the guest's namespace, which is resolved only when
/// it is the guest itself (anything else cannot be judged from here).
fn resolve(pid: u32, path: &Path, follow: bool) -> Resolved {
    let mut queue: VecDeque<Part> = parts(path).collect();
    let mut cur = PathBuf::from("/");
    let mut links = 0;
    let mut private_proc = None;
    while let Some(part) = queue.pop_front() {
        let name = match part {
            Part::Root => {
                cur = PathBuf::from("/");
                continue;
            }
            Part::Up => {
                cur.pop(); // `cur` is resolved, so its parent is what ".." reaches
                continue;
            }
            Part::Name(n) => n,
        };
        // /proc/self and /proc/thread-self are the guest's, not ours.
        let name = if cur == Path::new("/proc") && name == "self" {
            OsString::from(pid.to_string())
        } else if cur == Path::new("/proc") && name == "thread-self" {
            queue.push_front(Part::Name(pid.to_string().into()));
            queue.push_front(Part::Name("task".into()));
            OsString::from(pid.to_string())
        } else if cur == Path::new("/proc")
            && !name.is_empty()
            && name.as_bytes().iter().all(u8::is_ascii_digit)
            && *private_proc.get_or_insert_with(|| has_private_proc(pid))
        {
            let theirs = std::str::from_utf8(name.as_bytes())
                .ok()
                .and_then(|n| n.parse::<u32>().ok());
            if theirs.is_none() || theirs != pid_in_namespace(pid) {
                return Resolved::Partial(
                    cur,
                    format!(
                        "/proc/{}: another process of the guest's PID namespace",
                        name.to_string_lossy()
                    ),
                    libc::ENOENT,
                );
            }
            OsString::from(pid.to_string())
        } else {
            name
        };
        let last = queue.is_empty();
        let cand = cur.join(&name);
        let meta = match std::fs::symlink_metadata(&cand) {
            Ok(m) => m,
            Err(e) if last && e.kind() == io::ErrorKind::NotFound => {
                return Resolved::Full(cand, None);
            }
            Err(e) => {
                let errno = e.raw_os_error().unwrap_or(libc::ENOENT);
                return Resolved::Partial(cur, format!("{}: {e}", cand.display()), errno);
            }
        };
        if meta.file_type().is_symlink() && (!last || follow) {
            links += 1;
            if links > MAX_SYMLINKS {
                return Resolved::Partial(
                    cur,
                    format!("{}: too many symlinks", cand.display()),
                    libc::ELOOP,
                );
            }
            let target = match std::fs::read_link(&cand) {
                Ok(t) => t,
                Err(e) => {
                    let errno = e.raw_os_error().unwrap_or(libc::ENOENT);
                    return Resolved::Partial(cur, format!("{}: {e}", cand.display()), errno);
                }
            };
            let mut target = target.into_os_string();
            if in_proc_pid(&cand) {
                // A magic link: the kernel goes to the file itself. A path we can follow; a
                // deleted file is judged by its directory; a pipe or socket has no path.
                let bytes = target.as_bytes();
                if bytes.first() != Some(&b'/') {
                    if last {
                        return Resolved::Pseudo;
                    }
                    return Resolved::Partial(
                        cur,
                        format!("{}: not a directory", cand.display()),
                        libc::ENOTDIR,
                    );
                }
                if let Some(live) = bytes.strip_suffix(b" (deleted)") {
                    target = OsStr::from_bytes(live).to_os_string();
                }
            }
            let target = PathBuf::from(target);
            for p in parts(&target).collect::<Vec<_>>().into_iter().rev() {
                queue.push_front(p);
            }
            continue;
        }
        if last {
            return Resolved::Full(cand, Some((meta.dev(), meta.ino())));
        }
        if !meta.is_dir() {
            return Resolved::Partial(
                cur,
                format!("{}: not a directory", cand.display()),
                libc::ENOTDIR,
            );
        }
        cur = cand;
    }
    // Ended on a directory ("/", "/rw/..", "/rw/.").
    let id = id_of(&cur);
    Resolved::Full(cur, id)
}

impl Grants {
    pub fn new(paths: &[PathBuf]) -> Self {
        Grants {
            ids: paths.iter().filter_map(|p| id_of(p)).collect(),
            list_ids: HashSet::new(),
        }
    }

    /// Read grants `paths`, and `list`: directories beneath which a directory may be opened.
    pub fn with_list(paths: &[PathBuf], list: &[PathBuf]) -> Self {
        Grants {
            list_ids: list.iter().filter_map(|p| id_of(p)).collect(),
            ..Grants::new(paths)
        }
    }

    /// Whether `p` (resolved, existing) is a directory beneath a `list` grant.
    fn listed(&self, p: &Path) -> bool {
        !self.list_ids.is_empty()
            && std::fs::metadata(p).is_ok_and(|m| m.is_dir())
            && p.ancestors()
                .any(|a| id_of(a).is_some_and(|id| self.list_ids.contains(&id)))
    }

    /// Whether `dir` (resolved, existing) or one of its ancestors is granted.
    fn covers_dir(&self, dir: &Path) -> bool {
        self.covering(dir).is_some()
    }

    /// The granted directory `dir` (resolved, existing) is, or lies under.
    fn covering<'p>(&self, dir: &'p Path) -> Option<&'p Path> {
        dir.ancestors()
            .find(|p| id_of(p).is_some_and(|id| self.ids.contains(&id)))
    }

    /// Judges a write to `path` (absolute; `/proc/self` means guest `pid`). `follow`: the call
    /// follows a final symlink (open does; unlink does not). `pseudo`: the verdict when the
    /// path is a descriptor without a path (a pipe reopened through `/proc/self/fd/N`).
    pub fn judge(&self, pid: u32, path: &Path, follow: bool, pseudo: bool) -> PathJudgement {
        match resolve(pid, path, follow) {
            Resolved::Pseudo if pseudo => PathJudgement::Granted,
            Resolved::Pseudo => PathJudgement::CannotJudge("not a file (a pipe or socket)".into()),
            Resolved::Full(p, id) => {
                // The file itself (a granted device such as /dev/null), then each ancestor.
                let granted = id.is_some_and(|id| self.ids.contains(&id))
                    || p.parent().is_some_and(|d| self.covers_dir(d))
                    || (id.is_some() && self.listed(&p));
                if granted {
                    PathJudgement::Granted
                } else {
                    PathJudgement::Outside(as_guest_sees(pid, p))
                }
            }
            // The kernel stops where we stopped: below a granted directory it is its call.
            Resolved::Partial(at, _, _) if self.covers_dir(&at) => PathJudgement::Granted,
            Resolved::Partial(_, why, _) => PathJudgement::CannotJudge(why),
        }
    }

    /// For an open of `path` that [`Grants::judge`] grants: the granted directory (or
    /// the granted file itself) it lies under and the path as resolved, both as the
    /// supervisor names them, so that the supervisor can open it without leaving the grant
    /// (`opener.rs`); or the error the open meets where the path stops resolving below a
    /// grant (a name missing, or not a directory, while it was judged). `None` when there
    /// is nothing to open that way: a path outside the grants or under `/proc`, a descriptor
    /// without a path.
    pub fn granted_target(&self, pid: u32, path: &Path, follow: bool) -> GrantedOpen {
        match resolve(pid, path, follow) {
            Resolved::Full(p, _) if p.starts_with("/proc") => GrantedOpen::Kernel,
            Resolved::Full(p, id) => {
                if id.is_some_and(|id| self.ids.contains(&id)) {
                    return GrantedOpen::Beneath(p.clone(), p);
                }
                let dir = p
                    .parent()
                    .and_then(|parent| self.covering(parent))
                    .map(Path::to_path_buf);
                match dir {
                    Some(dir) => GrantedOpen::Beneath(dir, p),
                    None => GrantedOpen::Refused,
                }
            }
            Resolved::Pseudo => GrantedOpen::Kernel,
            Resolved::Partial(at, _, _) if at.starts_with("/proc") => GrantedOpen::Kernel,
            // What the kernel answers where a path stops below a grant; anything else (a
            // link read back as no link: the path changed while it was resolved) is refused.
            Resolved::Partial(at, _, errno)
                if self.covers_dir(&at)
                    && matches!(
                        errno,
                        libc::ENOENT | libc::ENOTDIR | libc::ELOOP | libc::ENAMETOOLONG
                    ) =>
            {
                GrantedOpen::Fails(errno)
            }
            Resolved::Partial(..) => GrantedOpen::Refused,
        }
    }

    /// Whether writing `path` is granted (see [`Grants::judge`]); a path that cannot be
    /// judged is not.
    pub fn covers(&self, path: &Path, follow: bool) -> bool {
        self.judge(std::process::id(), path, follow, true) == PathJudgement::Granted
    }
}

/// The absolute path the guest names with `path` relative to `dirfd`: through its cwd or
/// descriptor in `/proc/self`, which [`Grants::judge`] resolves as the guest's.
pub fn guest_path(dirfd: i32, path: &[u8]) -> PathBuf {
    let path = Path::new(OsStr::from_bytes(path));
    if path.is_absolute() {
        return path.to_path_buf();
    }
    guest_dir(dirfd).join(path)
}

/// The directory `dirfd` names for the guest (`AT_FDCWD`: its cwd), through `/proc/self`.
pub fn guest_dir(dirfd: i32) -> PathBuf {
    if dirfd == libc::AT_FDCWD {
        PathBuf::from("/proc/self/cwd")
    } else {
        PathBuf::from(format!("/proc/self/fd/{dirfd}"))
    }
}

/// `path` as the guest (global pid `pid`) meant it, for reports: a `/proc/self/cwd` or
/// `/proc/self/fd/N` prefix replaced by what it points to, when that is a path.
pub fn display(pid: u32, path: &Path) -> PathBuf {
    let Ok(rest) = path.strip_prefix("/proc/self") else {
        return path.to_path_buf();
    };
    let proc = PathBuf::from(format!("/proc/{pid}"));
    let mut c = rest.components();
    let prefix = match (c.next(), c.clone().next()) {
        (Some(Component::Normal(n)), _) if n == "cwd" => proc.join(n),
        (Some(Component::Normal(n)), Some(Component::Normal(fd))) if n == "fd" => {
            c.next();
            proc.join(n).join(fd)
        }
        _ => return path.to_path_buf(),
    };
    match std::fs::read_link(&prefix) {
        Ok(t) if t.is_absolute() && c.as_path().as_os_str().is_empty() => t,
        Ok(t) if t.is_absolute() => t.join(c.as_path()),
        _ => path.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("wfjail-paths-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn grants_by_identity() {
        let dir = scratch("id");
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        symlink(&dir, dir.with_extension("link")).ok();
        let g = Grants::new(std::slice::from_ref(&dir));
        assert!(g.covers(&dir.join("new-file"), true));
        assert!(g.covers(&dir.join("sub/x"), true));
        assert!(
            g.covers(&dir.with_extension("link").join("x"), true),
            "through a symlink"
        );
        assert!(!g.covers(Path::new("/etc/passwd-new"), true));
        let null = Grants::new(&[PathBuf::from("/dev/null")]);
        assert!(null.covers(Path::new("/dev/null"), true));
        assert!(!null.covers(Path::new("/dev/zero"), true));
        std::fs::remove_file(dir.with_extension("link")).ok();
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn dangling_symlinks_are_followed() {
        let root = scratch("dangling");
        let (rw, out) = (root.join("rw"), root.join("out"));
        std::fs::create_dir_all(&rw).unwrap();
        std::fs::create_dir_all(&out).unwrap();
        symlink(out.join("missing"), rw.join("abs")).unwrap();
        symlink("../out/missing", rw.join("rel")).unwrap();
        symlink("inside-missing", rw.join("in")).unwrap();
        symlink("loop", rw.join("loop")).unwrap();
        let g = Grants::new(std::slice::from_ref(&rw));
        let me = std::process::id();
        for l in ["abs", "rel"] {
            assert_eq!(
                g.judge(me, &rw.join(l), true, true),
                PathJudgement::Outside(out.join("missing")),
                "{l}"
            );
            // unlink/rename do not follow: the link itself is in the grants.
            assert_eq!(
                g.judge(me, &rw.join(l), false, true),
                PathJudgement::Granted
            );
        }
        assert_eq!(
            g.judge(me, &rw.join("in"), true, true),
            PathJudgement::Granted
        );
        assert!(matches!(
            g.judge(me, &rw.join("loop/x"), true, true),
            PathJudgement::Granted // ELOOP below a granted directory: the kernel's call
        ));
        let g_out = Grants::new(std::slice::from_ref(&out));
        assert!(matches!(
            g_out.judge(me, &rw.join("loop"), true, true),
            PathJudgement::CannotJudge(w) if w.contains("too many symlinks")
        ));
        std::fs::remove_dir_all(&root).ok();
    }

    #[test]
    fn missing_directories_are_judged_by_the_deepest_existing_one() {
        let root = scratch("missing");
        let rw = root.join("rw");
        std::fs::create_dir_all(&rw).unwrap();
        std::fs::write(root.join("file"), "").unwrap();
        let g = Grants::new(std::slice::from_ref(&rw));
        let me = std::process::id();
        assert_eq!(
            g.judge(me, &rw.join("no/such/x"), true, true),
            PathJudgement::Granted
        );
        assert_eq!(
            g.judge(me, &rw.join("no/../../escape"), true, true),
            PathJudgement::Granted,
            "the kernel stops at rw/no (ENOENT)"
        );
        assert!(matches!(
            g.judge(me, &root.join("no/x"), true, true),
            PathJudgement::CannotJudge(_)
        ));
        assert!(matches!(
            g.judge(me, &root.join("file/x"), true, true),
            PathJudgement::CannotJudge(w) if w.contains("not a directory")
        ));
        assert_eq!(
            g.judge(me, &rw.join("../x"), true, true),
            PathJudgement::Outside(root.join("x"))
        );
        std::fs::remove_dir_all(&root).ok();
    }

    #[test]
    fn non_utf8_names_are_kept() {
        let root = scratch("bytes");
        let rw = root.join("rw");
        let odd = root.join(OsStr::from_bytes(b"caf\xe9"));
        std::fs::create_dir_all(&rw).unwrap();
        std::fs::create_dir_all(&odd).unwrap();
        // A lossy copy of the name ("caf\u{fffd}") does not exist; the real one does.
        symlink(&rw, odd.join("to-rw")).unwrap();
        let g = Grants::new(std::slice::from_ref(&rw));
        let me = std::process::id();
        assert_eq!(
            g.judge(me, &odd.join("to-rw/x"), true, true),
            PathJudgement::Granted
        );
        assert_eq!(
            g.judge(me, &odd.join("x"), true, true),
            PathJudgement::Outside(odd.join("x"))
        );
        std::fs::remove_dir_all(&root).ok();
    }

    #[test]
    fn proc_self_is_the_guest() {
        let root = scratch("proc");
        let g = Grants::new(std::slice::from_ref(&root));
        // Our own cwd is not granted; "the guest" (this process, by pid) is checked through
        // /proc/PID, which must give the same answer as /proc/self.
        let me = std::process::id();
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(
            g.judge(me, Path::new("/proc/self/cwd/x"), true, true),
            PathJudgement::Outside(cwd.join("x"))
        );
        // A pipe behind /proc/self/fd/N has no path: reopening it is the pseudo verdict.
        let (r, w) = nix::unistd::pipe().unwrap();
        let p = PathBuf::from(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&w)
        ));
        assert_eq!(g.judge(me, &p, true, true), PathJudgement::Granted);
        assert!(matches!(
            g.judge(me, &p, true, false),
            PathJudgement::CannotJudge(_)
        ));
        drop((r, w));
        assert_eq!(
            display(me, &guest_path(libc::AT_FDCWD, b"a/b")),
            cwd.join("a/b")
        );
        std::fs::remove_dir_all(&root).ok();
    }
}
