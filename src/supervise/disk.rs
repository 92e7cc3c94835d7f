//! `limits.disk`: what a guest adds, in all, under its write grants. `limits.file_size`
//! (RLIMIT_FSIZE) bounds each file; nothing in the kernel bounds their sum on a host
//! directory, so the supervisor measures it, against a baseline taken before the guest starts:
//!
//! * the blocks allocated under the write grants: regular files, directories' own blocks and
//!   symbolic links (their blocks, at least their target's length), each inode once, walked
//!   with directory descriptors (`openat`/`fstatat` relative to the directory, never a path
//!   from the root, so depth is no hiding place), without following symbolic links or
//!   crossing into other file systems;
//! * the files the guest (and the processes it started, and those of its pids cgroup) holds
//!   that the walk does not find: open for writing, or unlinked (no name left) on a grant's file system and held by a
//!   descriptor (in any thread's table: `/proc/TID/fd`) or only by a mapping
//!   (`/proc/TID/maps` of a thread that still has the address space, measured through
//!   `/proc/TID/map_files`).
//!
//! Sampled while the guest runs (at least every [`SAMPLE_EVERY`], less often when walks are
//! slow); over the limit, the guest is killed and the status is `limit`, limit `disk`. A
//! guest can overshoot by what it writes between two samples.
//!
//! What cannot be judged is a refusal, never a pass: a walk that meets more than
//! [`MAX_ENTRIES`] entries, directories deeper than [`MAX_DEPTH`], a directory it cannot open
//! or read, or an unlinked file on a grant's file system mapped by the guest that the
//! supervisor may not measure (`/proc/PID/map_files` needs `CAP_CHECKPOINT_RESTORE` or
//! `CAP_SYS_ADMIN`): the guest is killed as over the limit (and write grants like that at the
//! start refuse the run).

use std::collections::HashSet;
use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{FileStat, Mode, SFlag, fstat, fstatat};

/// The longest a guest runs between two samples.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// The most entries one walk of the write grants visits.
pub const MAX_ENTRIES: usize = 100_000;
/// The deepest a walk goes below a grant (one open directory per level).
pub const MAX_DEPTH: usize = 256;
/// The most processes of the guest whose descriptors and mappings one sample reads.
const MAX_PROCESSES: usize = 4096;
/// Walks take at most this share of the supervisor's time (the interval grows with them).
const WALK_SHARE: u32 = 20;

#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error(
        "more than {MAX_ENTRIES} files and directories under the write grants ({0}): limits.disk cannot account them; grant a smaller directory"
    )]
    TooMany(PathBuf),
    #[error(
        "directories more than {MAX_DEPTH} levels deep under the write grant {0}: limits.disk cannot account them; grant a shallower directory"
    )]
    TooDeep(PathBuf),
    #[error(
        "a directory {depth} levels below the write grant {grant} cannot be read ({errno}): limits.disk cannot account it; make it readable by wfjail"
    )]
    Unreadable {
        grant: PathBuf,
        depth: usize,
        errno: Errno,
    },
    #[error(
        "the guest maps an unlinked file on a write grant's file system that wfjail may not measure ({0}): limits.disk cannot account it; run wfjail with CAP_CHECKPOINT_RESTORE, or do not keep unlinked files mapped"
    )]
    Unmeasurable(Errno),
    #[error(
        "the descriptors or mappings of a process of the guest cannot be read ({0}; a guest that made itself not dumpable makes them root's): limits.disk cannot account what it holds; run wfjail as root"
    )]
    Hidden(Errno),
}

/// An error reading a process's `/proc` files: `None` when the process or thread is gone,
/// else that they are hidden from wfjail ("cannot judge").
fn hidden(e: &std::io::Error) -> Option<DiskError> {
    match e.raw_os_error() {
        Some(libc::ENOENT | libc::ESRCH) => None,
        errno => Some(DiskError::Hidden(Errno::from_raw(
            errno.unwrap_or(libc::EIO),
        ))),
    }
}

/// Blocks and entries seen by one walk.
#[derive(Debug, Default)]
struct Walk {
    bytes: u64,
    entries: usize,
    inodes: HashSet<(u64, u64)>,
    /// The file systems of the grants.
    devs: HashSet<u64>,
    /// The grants walked.
    roots: Vec<PathBuf>,
}

/// One directory on the walk's path: its descriptor and its subdirectories left to visit.
struct Level {
    dir: OwnedFd,
    subdirs: Vec<CString>,
}

/// What an inode takes: its blocks; a symbolic link at least its target's length.
fn cost(st: &FileStat) -> u64 {
    let blocks = (st.st_blocks.max(0) as u64).saturating_mul(512);
    if st.st_mode & SFlag::S_IFMT.bits() == SFlag::S_IFLNK.bits() {
        blocks.max(st.st_size.max(0) as u64)
    } else {
        blocks
    }
}

fn kind(st: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits())
}

/// Opens directory `name` in `dir` (`None`: it went away or was replaced meanwhile).
fn open_dir(dir: &OwnedFd, name: &CStr) -> Result<Option<OwnedFd>, Errno> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    match openat(dir.as_fd(), name, flags, Mode::empty()) {
        Ok(fd) => Ok(Some(fd)),
        // Removed, or replaced by a file or a link, since it was listed: not there to count.
        Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => Ok(None),
        Err(e) => Err(e),
    }
}

impl Walk {
    fn add(&mut self, st: &FileStat) {
        if self.inodes.insert((st.st_dev, st.st_ino)) {
            self.bytes = self.bytes.saturating_add(cost(st));
        }
    }

    fn visit(&mut self, root: &Path) -> Result<(), DiskError> {
        let unreadable = |depth, errno| DiskError::Unreadable {
            grant: root.to_path_buf(),
            depth,
            errno,
        };
        let Ok(croot) = CString::new(root.as_os_str().as_bytes()) else {
            return Ok(()); // a grant is a canonical path, never with a NUL
        };
        let st = match nix::sys::stat::lstat(croot.as_c_str()) {
            Ok(st) => st,
            // A grant that does not exist (yet) holds nothing.
            Err(Errno::ENOENT | Errno::ENOTDIR) => return Ok(()),
            Err(e) => return Err(unreadable(0, e)),
        };
        self.devs.insert(st.st_dev);
        self.roots.push(root.to_path_buf());
        match kind(&st) {
            // The grant's own blocks too: a directory grows with its entries.
            SFlag::S_IFDIR => self.add(&st),
            SFlag::S_IFREG | SFlag::S_IFLNK => {
                self.add(&st);
                return Ok(());
            }
            _ => return Ok(()), // devices, sockets, FIFOs: no blocks of their own
        }
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let fd = nix::fcntl::open(croot.as_c_str(), flags, Mode::empty())
            .map_err(|e| unreadable(0, e))?;
        let dev = st.st_dev;
        let first = self.list(&fd, dev).map_err(|e| unreadable(0, e))?;
        let mut stack = vec![Level {
            dir: fd,
            subdirs: first,
        }];
        if self.entries > MAX_ENTRIES {
            return Err(DiskError::TooMany(root.to_path_buf()));
        }
        loop {
            let depth = stack.len();
            let Some(top) = stack.last_mut() else { break };
            let Some(name) = top.subdirs.pop() else {
                stack.pop();
                continue;
            };
            let Some(fd) = open_dir(&top.dir, &name).map_err(|e| unreadable(depth, e))? else {
                continue;
            };
            if fstat(fd.as_fd()).map_err(|e| unreadable(depth, e))?.st_dev != dev {
                continue; // a file system mounted there since it was listed
            }
            if depth >= MAX_DEPTH {
                return Err(DiskError::TooDeep(root.to_path_buf()));
            }
            let subdirs = self.list(&fd, dev).map_err(|e| unreadable(depth, e))?;
            if self.entries > MAX_ENTRIES {
                return Err(DiskError::TooMany(root.to_path_buf()));
            }
            stack.push(Level { dir: fd, subdirs });
        }
        Ok(())
    }

    /// Counts the entries of directory `fd` (on file system `dev`) and returns its
    /// subdirectories. Stops counting past [`MAX_ENTRIES`] (the caller then refuses).
    fn list(&mut self, fd: &OwnedFd, dev: u64) -> Result<Vec<CString>, Errno> {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let mut dir = Dir::openat(fd.as_fd(), c".", flags, Mode::empty())?;
        let mut subdirs = Vec::new();
        for e in dir.iter() {
            let e = e?;
            let name = e.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            self.entries += 1;
            if self.entries > MAX_ENTRIES {
                break;
            }
            let st = match fstatat(fd.as_fd(), name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(Errno::ENOENT) => continue, // removed since it was listed
                Err(e) => return Err(e),
            };
            if st.st_dev != dev {
                continue; // another file system mounted inside
            }
            match kind(&st) {
                SFlag::S_IFDIR => {
                    self.add(&st);
                    subdirs.push(name.to_owned());
                }
                SFlag::S_IFREG | SFlag::S_IFLNK => self.add(&st),
                _ => {}
            }
        }
        Ok(subdirs)
    }

    /// Adds what `pid` holds that the walk did not find: files open for writing, and unlinked
    /// files on a grant's file system held by a descriptor or a mapping.
    fn held_by(&mut self, pid: i32) -> Result<(), DiskError> {
        // Every thread's descriptor table: a thread started without CLONE_FILES has one of
        // its own, which `/proc/PID/fd` (the leader's) does not show.
        let tasks = tasks(pid);
        for task in &tasks {
            let fds = match std::fs::read_dir(format!("{task}/fd")) {
                Ok(fds) => fds,
                Err(e) => match hidden(&e) {
                    None => continue, // the thread is gone
                    Some(err) => return Err(err),
                },
            };
            for fd in fds.flatten() {
                let Ok(m) = std::fs::metadata(fd.path()) else {
                    continue; // closed meanwhile
                };
                if self.inodes.contains(&(m.dev(), m.ino())) {
                    continue; // counted already (the walk's files): no /proc reads for it
                }
                if self.unlinked(&m, &fd.path()) || (m.is_file() && writable(task, &fd.file_name()))
                {
                    self.add_meta(&m);
                }
            }
            // Its working directory holds a directory as a descriptor does.
            let cwd = PathBuf::from(format!("{task}/cwd"));
            if let Ok(m) = std::fs::metadata(&cwd)
                && self.unlinked(&m, &cwd)
            {
                self.add_meta(&m);
            }
        }
        // The address space, the threads' in common, through one that still has it: a leader
        // that has exited (its threads live on) shows no mappings.
        let mut found = None;
        for t in &tasks {
            match std::fs::read_to_string(format!("{t}/maps")) {
                Ok(m) if m.is_empty() => {}
                Ok(m) => {
                    found = Some((t, m));
                    break;
                }
                Err(e) => {
                    if let Some(err) = hidden(&e) {
                        return Err(err);
                    }
                }
            }
        }
        let Some((task, maps)) = found else {
            return Ok(()); // the process is gone
        };
        for line in maps.lines() {
            let Some(m) = Mapping::parse(line) else {
                continue;
            };
            if !m.deleted
                || !self.devs.contains(&m.dev)
                || !self.was_granted(m.path)
                || self.inodes.contains(&(m.dev, m.ino))
            {
                continue;
            }
            match std::fs::metadata(format!("{task}/map_files/{}", m.range)) {
                Ok(meta) if meta.is_file() && meta.nlink() == 0 => self.add_meta(&meta),
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {} // unmapped meanwhile
                Err(e) => {
                    let errno = Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO));
                    return Err(DiskError::Unmeasurable(errno));
                }
            }
        }
        Ok(())
    }

    /// Whether `m`, reached through the `/proc` link `link`, is a file or a directory with
    /// no name left that was under a grant. Directories too: one emptied and removed while
    /// held keeps its blocks (a directory does not shrink with its entries). A path the
    /// kernel cannot show (longer than a page: a directory buried below PATH_MAX after the
    /// file was unlinked in it) cannot be told apart: it counts.
    fn unlinked(&self, m: &std::fs::Metadata, link: &Path) -> bool {
        (m.is_file() || m.is_dir())
            && m.nlink() == 0
            && self.devs.contains(&m.dev())
            && std::fs::read_link(link).map_or_else(
                |e| e.raw_os_error() != Some(libc::ENOENT),
                |shown| self.was_granted(&shown.as_os_str().to_string_lossy()),
            )
    }

    /// Whether an unlinked file, shown by the kernel as `shown` (its last path and
    /// ` (deleted)`), was under a grant: the guest can neither rename nor link a file out of
    /// its grants, so one it made and unlinked was last there. A file unlinked elsewhere (a
    /// library the host upgraded while the guest maps it) is not the guest's. The kernel
    /// shows a newline in a path as `\012`: a grant with one cannot be told apart, and every
    /// unlinked file on its file system counts.
    fn was_granted(&self, shown: &str) -> bool {
        let path = Path::new(shown.strip_suffix(" (deleted)").unwrap_or(shown));
        self.roots
            .iter()
            .any(|r| r.as_os_str().as_bytes().contains(&b'\n') || path.starts_with(r))
    }

    fn add_meta(&mut self, m: &std::fs::Metadata) {
        if self.inodes.insert((m.dev(), m.ino())) {
            self.bytes = self.bytes.saturating_add(m.blocks().saturating_mul(512));
        }
    }
}

/// The `/proc` directories of `pid`'s threads, `/proc/TID` (each thread's own view, with
/// `map_files`, which `/proc/PID/task/TID` lacks), the process's own when it has none left
/// to list.
fn tasks(pid: i32) -> Vec<String> {
    let mut tasks: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .map(|t| format!("/proc/{}", t.file_name().to_string_lossy()))
                .collect()
        })
        .unwrap_or_default();
    if tasks.is_empty() {
        tasks.push(format!("/proc/{pid}"));
    }
    tasks
}

/// Whether descriptor `fd` in the `/proc` directory `task` is open for writing.
fn writable(task: &str, fd: &std::ffi::OsStr) -> bool {
    std::fs::read_to_string(format!("{task}/fdinfo/{}", fd.to_string_lossy()))
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("flags:"))
                .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
        })
        .is_some_and(|flags| flags & (libc::O_WRONLY | libc::O_RDWR) as u32 != 0)
}

/// One line of `/proc/PID/maps` that maps a file.
#[derive(Debug, PartialEq, Eq)]
struct Mapping<'a> {
    /// `start-end`, the name of its `/proc/PID/map_files` entry.
    range: &'a str,
    dev: u64,
    ino: u64,
    /// The file has no name left (the kernel appends ` (deleted)` to its path).
    deleted: bool,
    /// Its path, as the kernel shows it.
    path: &'a str,
}

impl<'a> Mapping<'a> {
    fn parse(line: &'a str) -> Option<Self> {
        let mut f = line.splitn(6, ' ');
        let range = f.next()?;
        let (_perms, _offset) = (f.next()?, f.next()?);
        let (major, minor) = f.next()?.split_once(':')?;
        let ino: u64 = f.next()?.parse().ok()?;
        if ino == 0 {
            return None; // anonymous
        }
        let path = f.next().unwrap_or("").trim_start();
        Some(Mapping {
            range,
            dev: libc::makedev(
                u32::from_str_radix(major, 16).ok()?,
                u32::from_str_radix(minor, 16).ok()?,
            ),
            ino,
            deleted: path.ends_with(" (deleted)"),
            path,
        })
    }
}

/// `pid` and the processes it started, each once (at most [`MAX_PROCESSES`]).
fn family(pid: i32) -> Vec<i32> {
    let mut seen = vec![pid];
    let mut i = 0;
    while i < seen.len() && seen.len() < MAX_PROCESSES {
        let p = seen[i];
        i += 1;
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let Ok(children) = std::fs::read_to_string(t.path().join("children")) else {
                continue;
            };
            for c in children.split_whitespace().filter_map(|c| c.parse().ok()) {
                if !seen.contains(&c) && seen.len() < MAX_PROCESSES {
                    seen.push(c);
                }
            }
        }
    }
    seen
}

/// Bytes under `grants`, plus what `pid` and its descendants hold that is not under them
/// (unlinked, or renamed away); `None` for `pid`: the grants only. `procs`: the
/// `cgroup.procs` of the guest's own cgroup, whose processes are the guest's too (without a
/// PID namespace, one whose parent exited is no longer its descendant).
fn measure(grants: &[PathBuf], pid: Option<i32>, procs: Option<&Path>) -> Result<u64, DiskError> {
    let mut walk = Walk::default();
    for g in grants {
        walk.visit(g)?;
    }
    if let Some(pid) = pid {
        let mut all = family(pid);
        if let Some(text) = procs.and_then(|p| std::fs::read_to_string(p).ok()) {
            let me = std::process::id() as i32; // never wfjail's own files
            for p in text.lines().filter_map(|l| l.trim().parse().ok()) {
                if p != me && !all.contains(&p) && all.len() < MAX_PROCESSES {
                    all.push(p);
                }
            }
        }
        for p in all {
            walk.held_by(p)?;
        }
    }
    Ok(walk.bytes)
}

/// One guest's disk account.
#[derive(Debug)]
pub struct DiskAccount {
    grants: Vec<PathBuf>,
    limit: u64,
    baseline: u64,
    next: Instant,
    interval: Duration,
    /// The most the guest had added at any sample.
    pub peak: u64,
    /// Why a sample could not judge (the guest was then taken as over the limit).
    pub cannot_judge: Option<DiskError>,
    /// The `cgroup.procs` of the guest's pids cgroup, when it has one.
    procs: Option<PathBuf>,
}

impl DiskAccount {
    /// Takes the baseline before the guest starts.
    pub fn new(grants: Vec<PathBuf>, limit: u64) -> Result<Self, DiskError> {
        let baseline = measure(&grants, None, None)?;
        Ok(DiskAccount {
            grants,
            limit,
            baseline,
            next: Instant::now(),
            interval: SAMPLE_EVERY,
            peak: 0,
            cannot_judge: None,
            procs: None,
        })
    }

    /// Samples also read the processes listed in `procs`, the `cgroup.procs` of the guest's
    /// pids cgroup: all of the guest's, wherever their parents went.
    pub fn watch_cgroup(&mut self, procs: PathBuf) {
        self.procs = Some(procs);
    }

    /// After the guest is gone: whether what it left under the grants is over the limit (a
    /// guest that wrote and exited between two samples).
    pub fn over_at_end(&mut self) -> bool {
        let m = measure(&self.grants, None, None);
        self.judge(m)
    }

    /// Whether measurement `m` is over the limit; one that could not judge is.
    fn judge(&mut self, m: Result<u64, DiskError>) -> bool {
        match m {
            Ok(now) => {
                let added = now.saturating_sub(self.baseline);
                self.peak = self.peak.max(added);
                added > self.limit
            }
            Err(e) => {
                self.cannot_judge = Some(e);
                true
            }
        }
    }

    /// How long until the next sample is due.
    pub fn due_in(&self) -> Duration {
        self.next.saturating_duration_since(Instant::now())
    }

    /// Samples when due: `true` when the guest is over the limit (or cannot be judged).
    pub fn over(&mut self, pid: i32) -> bool {
        if Instant::now() < self.next {
            return false;
        }
        let started = Instant::now();
        let m = measure(&self.grants, Some(pid), self.procs.as_deref());
        let over = self.judge(m);
        self.interval = SAMPLE_EVERY.max(started.elapsed() * WALK_SHARE);
        self.next = Instant::now() + self.interval;
        over
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_each_inode_once_and_ignores_what_was_there() {
        let dir = std::env::temp_dir().join(format!("wfjail-disk-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("before"), vec![1u8; 64 * 1024]).unwrap();
        let mut acct = DiskAccount::new(vec![dir.clone()], 100 * 1024).unwrap();
        assert!(!acct.over(std::process::id() as i32), "nothing added yet");
        std::fs::write(dir.join("sub/a"), vec![1u8; 60 * 1024]).unwrap();
        std::fs::hard_link(dir.join("sub/a"), dir.join("sub/b")).unwrap();
        acct.next = Instant::now();
        assert!(!acct.over(std::process::id() as i32), "60 KiB, once");
        std::fs::write(dir.join("c"), vec![1u8; 60 * 1024]).unwrap();
        acct.next = Instant::now();
        assert!(acct.over(std::process::id() as i32), "120 KiB > 100 KiB");
        assert!(acct.peak >= 120 * 1024);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn reads_a_mapping_of_an_unlinked_file() {
        let m = Mapping::parse(
            "7f01a000-7f01b000 r--s 00000000 fd:01 1234567                    /tmp/x/m0 (deleted)",
        )
        .unwrap();
        assert_eq!(
            m,
            Mapping {
                range: "7f01a000-7f01b000",
                dev: libc::makedev(0xfd, 1),
                ino: 1234567,
                deleted: true,
                path: "/tmp/x/m0 (deleted)",
            }
        );
        let m = Mapping::parse("55d0-55e0 r-xp 00000000 08:02 42 /usr/bin/python3.11").unwrap();
        assert!(!m.deleted);
        assert_eq!(
            Mapping::parse("7ffc-7ffd rw-p 00000000 00:00 0  [stack]"),
            None
        );
    }

    #[test]
    fn only_files_unlinked_under_a_grant_are_the_guests() {
        let walk = Walk {
            roots: vec![PathBuf::from("/tmp/g")],
            ..Walk::default()
        };
        assert!(walk.was_granted("/tmp/g/a/b (deleted)"));
        assert!(!walk.was_granted("/usr/lib/libpython3.so (deleted)"));
        assert!(
            !walk.was_granted("/tmp/gx/m (deleted)"),
            "by component, not by prefix"
        );
        let odd = Walk {
            roots: vec![PathBuf::from("/tmp/g\nh")],
            ..Walk::default()
        };
        assert!(odd.was_granted("/usr/lib/libpython3.so (deleted)"));
    }

    #[test]
    fn a_grant_that_grows_with_its_entries_counts() {
        // Empty files have no blocks; the directory that lists 2,000 long names has.
        let dir = std::env::temp_dir().join(format!("wfjail-disk-dir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut acct = DiskAccount::new(vec![dir.clone()], 1 << 30).unwrap();
        for i in 0..2000 {
            std::fs::File::create(dir.join(format!("{i}-{}", "n".repeat(200)))).unwrap();
        }
        acct.next = Instant::now();
        assert!(!acct.over(std::process::id() as i32));
        assert!(
            acct.peak >= 256 * 1024,
            "the grant's own blocks: {}",
            acct.peak
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
