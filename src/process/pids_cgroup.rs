//! A pids cgroup per guest: `limits.processes` where `RLIMIT_NPROC` cannot bind. The kernel
//! exempts host root from the process limit, so a guest whose uid is host root (wfjail run
//! as root) could fork without bound once a policy allows forks or threads. A cgroup's
//! `pids.max` counts every task born in it, whoever owns it.
//!
//! The guest must be born inside (moving it after `clone` would race its first forks), and
//! cgroup v1 has no `CLONE_INTO_CGROUP`: wfjail moves itself into the new cgroup for the
//! `clone` and back out at once ([`PidsCgroup::born_inside`]), then sets the limit. Used by
//! `run` and exec-mode serve sessions; the cgroup is removed when dropped, after the guest
//! is reaped (stragglers, which only a guest without a PID namespace can leave, are killed).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Why no pids cgroup could be made here.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error(
        "no pids controller is mounted (cgroup v1 `pids`, or cgroup v2 with `pids` in the root's cgroup.controllers)"
    )]
    NoController,
    #[error(
        "cgroup v2: wfjail runs in {0}, not in the root cgroup, and a child cgroup with the pids controller needs a delegated subtree"
    )]
    NotRoot(String),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

/// `limits.processes` when only a pids cgroup can enforce it: the policy sets it, allows
/// forks or threads (otherwise the filter already stops them; under `warn` it lets them
/// through), and wfjail runs as root.
pub fn needed(policy: &crate::policy::Policy) -> Option<u64> {
    use crate::policy::{OnViolation, Toggle};
    let forks = policy.process.subprocess == Toggle::Allow
        || policy.process.threads == Toggle::Allow
        || policy.on_violation == OnViolation::Warn;
    (forks && nix::unistd::geteuid().is_root())
        .then_some(policy.limits.processes)
        .flatten()
}

/// The cgroup for a guest of `policy` when one is [`needed`]: `None` when not, else the
/// cgroup or why none could be made.
pub fn for_policy(policy: &crate::policy::Policy) -> Option<Result<PidsCgroup, CgroupError>> {
    needed(policy).map(|_| PidsCgroup::create())
}

/// Applies the limit once the guest is born in `cg`: `Ok` when it binds, else why not (for
/// `layers.degraded`).
pub fn apply(
    policy: &crate::policy::Policy,
    cg: &Option<Result<PidsCgroup, CgroupError>>,
) -> Option<Result<(), String>> {
    let max = needed(policy)?;
    Some(match cg {
        Some(Ok(c)) => c.limit(max).map_err(|e| e.to_string()),
        Some(Err(e)) => Err(e.to_string()),
        None => Err("no cgroup was made".into()),
    })
}

/// One guest's pids cgroup (removed on drop).
#[derive(Debug)]
pub struct PidsCgroup {
    dir: PathBuf,
    /// The `cgroup.procs` of the cgroup wfjail came from.
    home: PathBuf,
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> CgroupError + '_ {
    move |source| CgroupError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn write(path: &Path, text: &str) -> Result<(), CgroupError> {
    std::fs::write(path, text).map_err(io_err(path))
}

/// This process's cgroup in the pids hierarchy (cgroup v1 `pids`, or the v2 root).
fn locate() -> Result<PathBuf, CgroupError> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(io_err(Path::new("/proc/self/mountinfo")))?;
    let cgroups = std::fs::read_to_string("/proc/self/cgroup")
        .map_err(io_err(Path::new("/proc/self/cgroup")))?;
    let mut v2_mount = None;
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let fields: Vec<&str> = left.split(' ').collect();
        let theirs: Vec<&str> = right.split(' ').collect();
        let (Some(root), Some(mount), Some(fstype), Some(opts)) =
            (fields.get(3), fields.get(4), theirs.first(), theirs.get(2))
        else {
            continue;
        };
        if *fstype == "cgroup" && opts.split(',').any(|o| o == "pids") {
            // v1: our cgroup in that hierarchy, relative to the mount's root.
            // `ID:CONTROLLERS:PATH` lines; ours is the one naming pids.
            let path = cgroups
                .lines()
                .find_map(|l| {
                    let mut parts = l.splitn(3, ':');
                    let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
                    controllers.split(',').any(|c| c == "pids").then_some(path)
                })
                .ok_or(CgroupError::NoController)?;
            let rel = path.strip_prefix(root).unwrap_or(path);
            return Ok(Path::new(mount).join(rel.trim_start_matches('/')));
        }
        if *fstype == "cgroup2" {
            v2_mount = Some(PathBuf::from(mount));
        }
    }
    let mount = v2_mount.ok_or(CgroupError::NoController)?;
    let path = cgroups
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or(CgroupError::NoController)?;
    // Moving back out of a child cgroup is refused in a non-root v2 cgroup that has
    // controllers enabled for its children ("no internal processes").
    if path != "/" {
        return Err(CgroupError::NotRoot(path.to_string()));
    }
    let controllers = std::fs::read_to_string(mount.join("cgroup.controllers"))
        .map_err(io_err(&mount.join("cgroup.controllers")))?;
    if !controllers.split_whitespace().any(|c| c == "pids") {
        return Err(CgroupError::NoController);
    }
    write(&mount.join("cgroup.subtree_control"), "+pids")?;
    Ok(mount)
}

impl PidsCgroup {
    /// A new, empty pids cgroup next to wfjail's own (not limited yet: see
    /// [`PidsCgroup::limit`]).
    pub fn create() -> Result<Self, CgroupError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let ours = locate()?;
        let name = format!(
            "wfjail-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let dir = ours.join(name);
        std::fs::create_dir(&dir).map_err(io_err(&dir))?;
        let cg = PidsCgroup {
            dir,
            home: ours.join("cgroup.procs"),
        };
        // Probe now that we may write where the guest will be charged.
        write(&cg.dir.join("pids.max"), "max")?;
        Ok(cg)
    }

    /// Runs `f` (the `clone`) with this process inside the cgroup, so that the child is
    /// born there, then moves this process back where it was. An error means this process
    /// could not enter the cgroup and `f` did not run.
    pub fn born_inside<T>(&self, f: impl FnOnce() -> T) -> Result<T, CgroupError> {
        let me = std::process::id().to_string();
        write(&self.procs(), &me)?;
        let out = f();
        // Leaving the cgroup we could enter cannot fail in v1 or the v2 root; were it to,
        // wfjail would stay charged there until it exits, with the child already running.
        let _ = write(&self.home, &me);
        Ok(out)
    }

    /// Its `cgroup.procs`: the guest and everything it started, wherever their parents went.
    pub fn procs(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// Bounds the tasks of the cgroup (the guest and everything it starts) to `max`.
    pub fn limit(&self, max: u64) -> Result<(), CgroupError> {
        write(&self.dir.join("pids.max"), &max.to_string())
    }
}

impl Drop for PidsCgroup {
    fn drop(&mut self) {
        let me = std::process::id();
        for _ in 0..100 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            // Tasks left behind (a guest without a PID namespace can leave some): the
            // guest's own descendants, never wfjail.
            if let Ok(procs) = std::fs::read_to_string(self.procs()) {
                for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                    if pid as u32 != me {
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(pid),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                    }
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_say_what_is_missing() {
        assert!(CgroupError::NoController.to_string().contains("pids"));
        assert!(
            CgroupError::NotRoot("/user.slice".into())
                .to_string()
                .contains("/user.slice")
        );
    }
}
