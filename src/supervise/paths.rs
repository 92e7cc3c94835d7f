//! Which file-system writes the policy grants, judged the way Landlock judges them: by the
//! identity (device, inode) of the granted directories and files, so that a path reached
//! through a bind mount or a symlink is treated like its target.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The write grants of one execution.
#[derive(Debug, Clone, Default)]
pub struct WriteGrants {
    ids: HashSet<(u64, u64)>,
}

fn id_of(p: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

impl WriteGrants {
    pub fn new(paths: &[PathBuf]) -> Self {
        WriteGrants {
            ids: paths.iter().filter_map(|p| id_of(p)).collect(),
        }
    }

    /// Whether writing `path` (absolute, as the guest named it after joining its base) is
    /// granted. `follow`: the call follows a final symlink (open does; unlink does not).
    /// Unknown is answered `true`: Landlock still decides, we only lose the report.
    pub fn covers(&self, path: &Path, follow: bool) -> bool {
        let target = if follow {
            std::fs::canonicalize(path).ok()
        } else {
            None
        };
        let start = match target {
            Some(t) => t,
            None => match (path.parent(), path.file_name()) {
                (Some(parent), Some(name)) => match std::fs::canonicalize(parent) {
                    Ok(p) => p.join(name),
                    Err(_) => return true, // the kernel will fail it (ENOENT) anyway
                },
                _ => return true,
            },
        };
        // The file itself (a granted device such as /dev/null), then each ancestor.
        let mut cur: Option<&Path> = Some(&start);
        while let Some(p) = cur {
            if let Some(id) = id_of(p)
                && self.ids.contains(&id)
            {
                return true;
            }
            cur = p.parent();
        }
        false
    }
}

/// The directory a guest's relative path starts from: its cwd or the directory behind `dirfd`.
pub fn base_dir(pid: u32, dirfd: i32, path: &str) -> Option<PathBuf> {
    if path.starts_with('/') {
        return Some(PathBuf::from("/"));
    }
    let link = if dirfd == libc::AT_FDCWD {
        format!("/proc/{pid}/cwd")
    } else {
        format!("/proc/{pid}/fd/{dirfd}")
    };
    std::fs::read_link(link).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_by_identity() {
        let dir = std::env::temp_dir().join(format!("wfjail-paths-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::os::unix::fs::symlink(&dir, dir.with_extension("link")).ok();
        let g = WriteGrants::new(std::slice::from_ref(&dir));
        assert!(g.covers(&dir.join("new-file"), true));
        assert!(g.covers(&dir.join("sub/x"), true));
        assert!(
            g.covers(&dir.with_extension("link").join("x"), true),
            "through a symlink"
        );
        assert!(!g.covers(Path::new("/etc/passwd-new"), true));
        let null = WriteGrants::new(&[PathBuf::from("/dev/null")]);
        assert!(null.covers(Path::new("/dev/null"), true));
        assert!(!null.covers(Path::new("/dev/zero"), true));
        std::fs::remove_file(dir.with_extension("link")).ok();
        std::fs::remove_dir_all(&dir).ok();
    }
}
