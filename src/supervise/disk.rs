//! `limits.disk`: what a guest adds, in all, under its write grants. `limits.file_size`
//! (RLIMIT_FSIZE) bounds each file; nothing in the kernel bounds their sum on a host
//! directory, so the supervisor measures it: the blocks allocated under the write grants
//! (walked without following symbolic links or crossing into other file systems, each inode
//! once), plus the files the guest holds open for writing that the walk does not find
//! (unlinked ones), against a baseline taken before the guest starts. Sampled while the guest
//! runs (at least every [`SAMPLE_EVERY`], less often when walks are slow); over the limit,
//! the guest is killed and the status is `limit`, limit `disk`. A guest can overshoot by what
//! it writes between two samples.
//!
//! A walk that meets more than [`MAX_ENTRIES`] entries cannot judge: the guest is killed as
//! over the limit (and a write grant that large at the start refuses the run).

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The longest a guest runs between two samples.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// The most entries one walk of the write grants visits.
pub const MAX_ENTRIES: usize = 100_000;
/// Walks take at most this share of the supervisor's time (the interval grows with them).
const WALK_SHARE: u32 = 20;

#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error(
        "more than {MAX_ENTRIES} files and directories under the write grants ({0}): limits.disk cannot account them; grant a smaller directory"
    )]
    TooMany(PathBuf),
}

/// Blocks and entries seen by one walk.
#[derive(Debug, Default)]
struct Walk {
    bytes: u64,
    entries: usize,
    inodes: HashSet<(u64, u64)>,
}

impl Walk {
    fn add(&mut self, meta: &std::fs::Metadata) {
        if self.inodes.insert((meta.dev(), meta.ino())) {
            self.bytes = self.bytes.saturating_add(meta.blocks().saturating_mul(512));
        }
    }

    fn visit(&mut self, root: &Path) -> Result<(), DiskError> {
        let Ok(meta) = std::fs::symlink_metadata(root) else {
            return Ok(()); // a grant that does not exist (yet) holds nothing
        };
        if meta.is_file() {
            self.add(&meta);
            return Ok(());
        }
        if !meta.is_dir() {
            return Ok(()); // devices, sockets, links: no blocks of their own worth counting
        }
        let dev = meta.dev();
        let mut stack = vec![root.to_path_buf()];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                self.entries += 1;
                if self.entries > MAX_ENTRIES {
                    return Err(DiskError::TooMany(root.to_path_buf()));
                }
                let Ok(m) = e.metadata() else { continue }; // lstat: links not followed
                if m.dev() != dev {
                    continue; // another file system mounted inside
                }
                if m.is_dir() {
                    self.add(&m);
                    stack.push(e.path());
                } else if m.is_file() {
                    self.add(&m);
                }
            }
        }
        Ok(())
    }
}

/// Bytes under `grants`, plus files `pid` holds open for writing that are not under them
/// (deleted, or renamed away); `None` for `pid`: the grants only.
fn measure(grants: &[PathBuf], pid: Option<i32>) -> Result<u64, DiskError> {
    let mut walk = Walk::default();
    for g in grants {
        walk.visit(g)?;
    }
    if let Some(pid) = pid
        && let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd"))
    {
        for fd in fds.flatten() {
            let writable = std::fs::read_to_string(format!(
                "/proc/{pid}/fdinfo/{}",
                fd.file_name().to_string_lossy()
            ))
            .ok()
            .and_then(|info| {
                info.lines()
                    .find_map(|l| l.strip_prefix("flags:"))
                    .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
            })
            .is_some_and(|flags| flags & (libc::O_WRONLY | libc::O_RDWR) as u32 != 0);
            if writable
                && let Ok(m) = std::fs::metadata(fd.path())
                && m.is_file()
            {
                walk.add(&m);
            }
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
}

impl DiskAccount {
    /// Takes the baseline before the guest starts.
    pub fn new(grants: Vec<PathBuf>, limit: u64) -> Result<Self, DiskError> {
        let baseline = measure(&grants, None)?;
        Ok(DiskAccount {
            grants,
            limit,
            baseline,
            next: Instant::now(),
            interval: SAMPLE_EVERY,
            peak: 0,
        })
    }

    /// After the guest is gone: whether what it left under the grants is over the limit (a
    /// guest that wrote and exited between two samples).
    pub fn over_at_end(&mut self) -> bool {
        match measure(&self.grants, None) {
            Ok(now) => {
                let added = now.saturating_sub(self.baseline);
                self.peak = self.peak.max(added);
                added > self.limit
            }
            Err(_) => true,
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
        let over = match measure(&self.grants, Some(pid)) {
            Ok(now) => {
                let added = now.saturating_sub(self.baseline);
                self.peak = self.peak.max(added);
                added > self.limit
            }
            Err(_) => true,
        };
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
}
