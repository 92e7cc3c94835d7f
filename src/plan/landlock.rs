//! Builds the Landlock ruleset in the parent. The child only calls `landlock_restrict_self`
//! with the descriptor this returns.

use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd,
    Ruleset, RulesetAttr, RulesetCreatedAttr, Scope,
};

/// The newest Landlock ABI wfjail was tested on. Rulesets handle what this ABI (or the
/// kernel's, when older) defines and nothing newer: rust-landlock documents building from
/// the running kernel's version as fit for tests only, since an ABI wfjail has never seen
/// may handle rights whose denial its guests were never tested against. Raise it after the
/// test suite passes on a kernel with the newer ABI (`tests/suite/platform/landlock_abi.rs`
/// fails until then).
pub const PINNED_ABI: u32 = 7;

/// What the kernel offers and what the ruleset handles.
#[derive(Debug, Clone)]
pub struct LandlockInfo {
    /// The ABI the ruleset was built for: the kernel's, at most [`PINNED_ABI`].
    pub abi: u32,
    /// The running kernel's Landlock ABI.
    pub kernel_abi: u32,
    /// TCP bind/connect handled (denied) — ABI >= 4 and the policy asks for it.
    pub tcp: bool,
    /// Abstract unix sockets and signals scoped to the sandbox — ABI >= 6.
    pub scoped: bool,
    /// Grants under `/proc` with their access rights, for the child to add again on its
    /// private `/proc` (a rule holds an inode, and the host's `/proc` is not the guest's).
    pub proc_rules: Vec<(CString, u64)>,
}

#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    #[error("Landlock ruleset: {0}")]
    Ruleset(#[from] landlock::RulesetError),
    #[error("opening {path} for a Landlock rule: {source}")]
    Path {
        path: PathBuf,
        source: landlock::PathFdError,
    },
}

/// Whether `path` is a directory (rules on files may only carry file rights).
fn is_dir(path: &Path) -> bool {
    std::fs::metadata(path).map(|m| m.is_dir()).unwrap_or(false)
}

/// The ABI a ruleset is built for on a kernel offering `kernel_abi`: best-effort up to the
/// pinned one.
pub fn enforced_abi(kernel_abi: u32) -> u32 {
    kernel_abi.min(PINNED_ABI)
}

/// Why Landlock is missing when `landlock_create_ruleset` fails with `e`, and what would
/// enable it. ENOSYS on a kernel of 5.13 or later while this process runs under a seccomp
/// filter is that filter's answer (runtime profiles older than Landlock answer ENOSYS for
/// calls they do not name), not the kernel's.
pub fn why_missing(e: nix::errno::Errno) -> (String, &'static str) {
    use nix::errno::Errno;
    let release = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut parts = release
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let version = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    let filtered = crate::procfs::seccomp_mode() == Some(2);
    match e {
        Errno::ENOSYS if version >= (5, 13) && filtered => (
            format!(
                "landlock_create_ruleset answers ENOSYS on Linux {release}, which has Landlock \
                 since 5.13: this container's seccomp profile hides it (a profile older than \
                 Landlock, e.g. Docker 20.10.0 to 20.10.17)"
            ),
            "a runtime whose profile allows landlock_create_ruleset, landlock_add_rule and \
             landlock_restrict_self (Docker 20.10.18 and later), or run with a profile that \
             does (`--security-opt seccomp=FILE`)",
        ),
        Errno::ENOSYS => (
            "this kernel has no Landlock".into(),
            "Linux >= 5.13 built with CONFIG_SECURITY_LANDLOCK=y",
        ),
        Errno::EOPNOTSUPP => (
            "Landlock is built in but disabled".into(),
            "add `landlock` to the kernel's lsm= boot parameter",
        ),
        Errno::EPERM => (
            "a seccomp profile (e.g. an old container runtime's) denies the landlock syscalls"
                .into(),
            "a container runtime whose default profile allows landlock_* (Docker >= 20.10.18, \
             recent containerd), or a custom profile",
        ),
        e => (
            format!("landlock_create_ruleset: {e}"),
            "see https://docs.kernel.org/userspace-api/landlock.html",
        ),
    }
}

/// Creates a ruleset for the kernel's ABI `kernel_abi` (at most [`PINNED_ABI`]) granting
/// read+execute under `read`, listing directories (their entries, not their files) under
/// `list`, everything under `write`; with `deny_tcp` all TCP bind/connect is denied (no rule
/// grants any port).
pub fn build(
    kernel_abi: u32,
    read: &[PathBuf],
    list: &[PathBuf],
    write: &[PathBuf],
    deny_tcp: bool,
) -> Result<(OwnedFd, LandlockInfo), LandlockError> {
    let abi = enforced_abi(kernel_abi);
    let v = ABI::from(abi as i32);
    let all = AccessFs::from_all(v);
    let read_access = AccessFs::from_read(v);
    let file_access = AccessFs::from_file(v);
    let tcp = deny_tcp && abi >= 4;
    let scoped = abi >= 6;

    // HardRequirement: we asked for exactly what this ABI has; anything less is a bug to see.
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(all)?;
    if tcp {
        ruleset = ruleset.handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)?;
    }
    if scoped {
        ruleset = ruleset.scope(Scope::AbstractUnixSocket | Scope::Signal)?;
    }
    let mut created = ruleset.create()?;
    let mut proc_rules = Vec::new();
    let mut add = |path: &PathBuf, access: BitFlags<AccessFs>| -> Result<(), LandlockError> {
        let fd = PathFd::new(path).map_err(|source| LandlockError::Path {
            path: path.clone(),
            source,
        })?;
        // Asked of the descriptor just opened, not of the path again (a second walk of it).
        let access = if nix::sys::stat::fstat(&fd)
            .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR)
        {
            access
        } else {
            access & file_access
        };
        if path.starts_with("/proc")
            && let Ok(c) = CString::new(path.as_os_str().as_bytes())
        {
            proc_rules.push((c, access.bits()));
        }
        created.as_mut().add_rule(PathBeneath::new(fd, access))?;
        Ok(())
    };
    for p in read {
        // Read paths never get ioctl on devices: isatty() and friends still work on pipes.
        add(p, read_access)?;
    }
    for p in list {
        // A file has no entries: the plan refuses one here, and nothing is granted on it.
        if is_dir(p) {
            add(p, AccessFs::ReadDir.into())?;
        }
    }
    for p in write {
        add(p, all)?;
    }
    let fd: Option<OwnedFd> = created.into();
    let fd = fd.ok_or(LandlockError::Ruleset(
        landlock::RulesetError::CreateRuleset(landlock::CreateRulesetError::MissingHandledAccess),
    ))?;
    Ok((
        fd,
        LandlockInfo {
            abi,
            kernel_abi,
            tcp,
            scoped,
            proc_rules,
        },
    ))
}
