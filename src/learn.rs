//! `wfjail learn`: drafts the policy a command needs, from one run that could read anything.
//!
//! The learning run (`run::run` with `RunOptions::learn`) has the base policy's writes,
//! `on_violation = "warn"` (every call the base denies proceeds and is recorded, privileged
//! ones excepted), everything readable, and every open sent to the supervisor. It gives the
//! program nothing a reviewed policy would not: every write grant is a throw-away copy
//! ([`Throwaway`], in wfjail's own mount namespace), and network calls and file metadata
//! changes are refused and recorded (`Decisions::refuse_outside_effects`). From what it
//! recorded, [`draft`] writes a policy that `extends` the base and adds what the run used
//! beyond it, each with a comment naming the call that needed it:
//!
//! * files read outside the base's grants: their directories, read-only (a directory opened
//!   itself is granted as is; devices one by one; the guest's own `/proc` is left out);
//! * writes outside the base's grants (which failed: learning never writes where the base
//!   does not let it): the directories they were in, read-write;
//! * each other category the base denied: the setting that allows it (`[network] mode`,
//!   `[process] threads`, `[time] sleep`, `[random] getrandom`...), or the syscall in
//!   `[syscalls] allow`; privileged calls, which no policy may allow, as a comment.
//!
//! No grant is `/`, a system directory as a whole, a device beyond the usual ones, the home
//! directory, or a directory above a file the run wrote (`floor`): those are listed in a
//! comment instead. A draft is a start, not a verdict: `wfjail learn` runs the command again
//! under it (with throw-away copies, without the network) and says whether that run passes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::policy::syscalls::{self, Category};
use crate::report::{Learned, Violation};

/// One grant of the draft and the calls that needed it.
#[derive(Debug, Default)]
struct Needed {
    /// The first call, shown.
    first: String,
    more: usize,
}

impl Needed {
    fn add(&mut self, call: String) {
        if self.first.is_empty() {
            self.first = call;
        } else {
            self.more += 1;
        }
    }

    fn comment(&self) -> String {
        if self.more == 0 {
            self.first.clone()
        } else {
            format!("{} (+{} more)", self.first, self.more)
        }
    }
}

/// The path of a recorded filesystem violation (`PATH (read)`, `PATH (write)`), if it has one.
fn recorded_path(v: &Violation) -> Option<(PathBuf, bool)> {
    let (path, write) = if let Some(p) = v.args.strip_suffix(" (read)") {
        (p, false)
    } else if let Some(p) = v.args.strip_suffix(" (write)") {
        (p, true)
    } else {
        return None;
    };
    path.starts_with('/').then(|| (PathBuf::from(path), write))
}

fn covered(path: &Path, grants: &[PathBuf]) -> bool {
    grants.iter().any(|g| path.starts_with(g))
}

/// What `path`, read by the run, is on the host: `(path, is a directory)`, canonical. `None`
/// for what needs no grant (the guest's own `/proc`, a path that does not exist here).
fn read_target(path: &Path) -> Option<(PathBuf, bool)> {
    if path.starts_with("/proc") {
        return None;
    }
    host_path(path)
        .ok()
        .filter(|(real, _)| !real.starts_with("/proc"))
}

/// What `path`, named by the run, is on the host: `(canonical path, is a directory)`. Resolved
/// without /proc's magic links (`RESOLVE_NO_MAGICLINKS`): `/dev/stdin`, `/dev/fd/N` and the
/// like lead through `/proc/self`, which here is wfjail, not the run, and would name the files
/// wfjail's own descriptors are (ELOOP instead).
fn host_path(path: &Path) -> Result<(PathBuf, bool), nix::errno::Errno> {
    use std::os::fd::AsFd;
    let root = std::fs::File::open("/").map_err(|_| nix::errno::Errno::EACCES)?;
    let fd = crate::sys::openat2(
        root.as_fd(),
        &cstring(path),
        (libc::O_PATH | libc::O_CLOEXEC) as u64,
        0,
        libc::RESOLVE_NO_MAGICLINKS,
    )?;
    let file = std::fs::File::from(fd);
    let dir = file
        .metadata()
        .map_err(|_| nix::errno::Errno::EACCES)?
        .is_dir();
    use std::os::fd::AsRawFd;
    let real = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .map_err(|_| nix::errno::Errno::EACCES)?;
    // A path the kernel shows with " (deleted)" or a pseudo file's name is no grant.
    if !real.is_absolute() || real.to_string_lossy().ends_with(" (deleted)") {
        return Err(nix::errno::Errno::ENOENT);
    }
    Ok((real, dir))
}

/// The read grants for what the run read: a directory it opened as such, a directory two or
/// more of whose files it read, and otherwise the one file (so that reading `/etc/hostname`
/// does not grant `/etc`). A directory [`floor`] refuses is never the grant of the files in
/// it: they are granted one by one. What `floor` refuses is put in `refused`.
fn read_grants(
    targets: Vec<(PathBuf, bool, String)>,
    refused: &mut BTreeMap<(PathBuf, &'static str), (&'static str, Needed)>,
) -> BTreeMap<PathBuf, Needed> {
    let mut dirs: BTreeMap<PathBuf, Needed> = BTreeMap::new();
    let mut files_in: BTreeMap<PathBuf, Vec<(PathBuf, String)>> = BTreeMap::new();
    let mut grant = |path: PathBuf, call: String, dirs: &mut BTreeMap<PathBuf, Needed>| match floor(
        &path, false,
    ) {
        Some(why) => refused
            .entry((path, "read"))
            .or_insert_with(|| (why, Needed::default()))
            .1
            .add(call),
        None => dirs.entry(path).or_default().add(call),
    };
    for (path, is_dir, call) in targets {
        if is_dir {
            grant(path, call, &mut dirs);
        } else if let Some(parent) = path.parent().filter(|_| !path.starts_with("/dev")) {
            files_in
                .entry(parent.to_path_buf())
                .or_default()
                .push((path, call));
        } else {
            grant(path, call, &mut dirs);
        }
    }
    for (dir, mut files) in files_in {
        files.dedup_by(|a, b| a.0 == b.0);
        let distinct: std::collections::BTreeSet<&PathBuf> = files.iter().map(|f| &f.0).collect();
        if distinct.len() >= 2 && floor(&dir, false).is_none() {
            let entry = dirs.entry(dir).or_default();
            for (_, call) in files {
                entry.add(call);
            }
        } else {
            for (file, call) in files {
                grant(file, call, &mut dirs);
            }
        }
    }
    dirs
}

/// The devices a draft may grant: the usual ones, which hold no data of the host's.
const USUAL_DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
];

/// The roots of the system's file system: a draft grants none of them (nor `/`), only what
/// lies below.
const SYSTEM_ROOTS: &[&str] = &[
    "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32", "/media",
    "/mnt", "/opt", "/proc", "/root", "/run", "/sbin", "/snap", "/srv", "/sys", "/tmp", "/usr",
    "/var",
];

/// Where the system's own files are: a draft never grants writing anything below them.
const SYSTEM_FILES: &[&str] = &[
    "/bin", "/boot", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/sbin", "/usr",
];

/// Why a draft never grants `path` (canonical; `write`: for writing), or `None` when it may.
/// A learning run is a possibly hostile program's: what it touched is no reason to give it
/// the whole file system, a system directory, the kernel's interfaces, a device beyond the
/// usual ones, or the home directory.
fn floor(path: &Path, write: bool) -> Option<&'static str> {
    let under = |roots: &[&str]| roots.iter().any(|r| path.starts_with(r));
    let Some(text) = path.to_str() else {
        return Some("a name that is not UTF-8, which a policy cannot spell");
    };
    if text.contains('$') {
        // No escape for it: `${home}` in a grant stands for another path, and a bare `$` is
        // an error.
        return Some(
            "a `$` in its path, which a policy reads as a variable (${cwd}, ${home}, ${exe_dir}) and would make another path",
        );
    }
    if path == Path::new("/") {
        Some("the whole file system")
    } else if SYSTEM_ROOTS.iter().any(|r| path == Path::new(r)) {
        Some("a system directory as a whole")
    } else if path.starts_with("/proc") || path.starts_with("/sys") {
        Some("the kernel's interfaces")
    } else if path.starts_with("/dev") && !USUAL_DEVICES.iter().any(|d| path == Path::new(d)) {
        Some("a device beyond the usual ones (null, zero, full, random, urandom, tty)")
    } else if write && under(SYSTEM_FILES) {
        Some("the system's own files")
    } else if std::env::var_os("HOME")
        .and_then(|h| std::fs::canonicalize(h).ok())
        .is_some_and(|home| home.starts_with(path))
    {
        Some("the home directory (keys and credentials included), or a directory that holds it")
    } else if path.parent() == Some(Path::new("/home")) {
        // Another user's (HOME is root's /root under sudo): as much a home as ours.
        Some("a home directory (keys and credentials included)")
    } else if write && in_dot_directory(path) {
        Some(
            "a home's dot-directory (keys, shell start-up files, autostart: what runs unconfined later)",
        )
    } else if write && path == Path::new("/var/tmp") {
        Some("a directory every user shares (their files, like /tmp's)")
    } else {
        None
    }
}

/// Whether `path` lies in a dot-directory of a home (`$HOME`, `/root`, `/home/NAME`):
/// `~/.ssh`, `~/.config/autostart`...
fn in_dot_directory(path: &Path) -> bool {
    let home = std::env::var_os("HOME").and_then(|h| std::fs::canonicalize(h).ok());
    let homes = home.into_iter().chain([PathBuf::from("/root")]).chain(
        path.ancestors()
            .find(|a| a.parent() == Some(Path::new("/home")))
            .map(Path::to_path_buf),
    );
    homes.into_iter().any(|h| {
        path.strip_prefix(&h)
            .ok()
            .and_then(|rest| rest.components().next())
            .is_some_and(|c| c.as_os_str().as_encoded_bytes().starts_with(b"."))
    })
}

/// The directory a denied write was in; never a directory above it: when that directory
/// does not exist, the reason.
fn write_grant(path: &Path) -> Result<PathBuf, &'static str> {
    let dir = path.parent().ok_or("the whole file system")?;
    match host_path(dir) {
        Ok((real, true)) => Ok(real),
        Err(nix::errno::Errno::ELOOP) => Err(
            "its path leads through /proc's links (/dev/fd, /dev/stdin...), which name wfjail's own descriptors here, not the run's",
        ),
        _ => Err(
            "its directory does not exist, and a draft grants no directory above the file (create the directory and learn again)",
        ),
    }
}

/// Keeps only the outermost of `grants` (one inside another adds nothing); the calls of an
/// inner one are counted at the outer one.
fn outermost(grants: BTreeMap<PathBuf, Needed>) -> BTreeMap<PathBuf, Needed> {
    let keys: Vec<PathBuf> = grants.keys().cloned().collect();
    let mut kept: BTreeMap<PathBuf, Needed> = BTreeMap::new();
    let mut inner: Vec<(PathBuf, usize)> = Vec::new();
    for (p, needed) in grants {
        match keys.iter().find(|k| **k != p && p.starts_with(k)) {
            Some(outer) => inner.push((outer.clone(), 1 + needed.more)),
            None => {
                kept.insert(p, needed);
            }
        }
    }
    for (outer, calls) in inner {
        // The outermost ancestor is kept (an ancestor of an ancestor is one too).
        if let Some((_, n)) = kept.iter_mut().find(|(k, _)| outer.starts_with(k)) {
            n.more += calls;
        }
    }
    kept
}

/// `s` as a TOML basic string: `"` and `\` escaped, and every control character (TOML
/// refuses them raw, DEL included, which JSON's escaping leaves) and bidirectional control
/// ([`reorders`]) as `\uXXXX`.
fn toml_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() || reorders(c) => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The policy text that extends `base` (as `extends` names it) by what `learned` shows the
/// command used. `command` is shown in the header.
pub fn draft(base: &str, learned: &Learned, command: &[String]) -> String {
    let base_grants: Vec<PathBuf> = learned.read.iter().chain(&learned.write).cloned().collect();
    let mut read_targets: Vec<(PathBuf, bool, String)> = Vec::new();
    let mut writes: BTreeMap<PathBuf, Needed> = BTreeMap::new();
    let mut settings: BTreeMap<&'static str, (String, Needed)> = BTreeMap::new();
    let mut allow: BTreeMap<String, Needed> = BTreeMap::new();
    let mut never: BTreeMap<String, Needed> = BTreeMap::new();
    // Grants the run's calls asked for that a draft never makes ([`floor`]), and why.
    let mut refused: BTreeMap<(PathBuf, &'static str), (&'static str, Needed)> = BTreeMap::new();
    // A draft that allows threads leaves timed futex waits unjudged (threads wait for each
    // other that way: CPython's GIL), so those the learning run saw need no sleep grant.
    let threads = learned
        .violations
        .iter()
        .any(|v| v.category == Category::Thread);
    let mut started: u64 = 0;
    for v in &learned.violations {
        if threads && v.category == Category::Sleep && v.syscall.starts_with("futex") {
            continue;
        }
        let mut call = format!("{}({})", v.syscall, one_line(&v.args, 120));
        if refused_while_learning(v) {
            call.push_str(", refused while learning");
        }
        if let Some((path, write)) = recorded_path(v) {
            if write {
                if covered(&path, &learned.write) {
                    continue;
                }
                match write_grant(&path) {
                    Ok(g) => match floor(&g, true) {
                        None => writes.entry(g).or_default().add(call),
                        Some(why) => refused
                            .entry((g, "write"))
                            .or_insert_with(|| (why, Needed::default()))
                            .1
                            .add(call),
                    },
                    Err(why) => refused
                        .entry((path.parent().unwrap_or(&path).to_path_buf(), "write"))
                        .or_insert_with(|| (why, Needed::default()))
                        .1
                        .add(call),
                }
            } else if !covered(&path, &base_grants)
                && let Some((real, is_dir)) = read_target(&path)
                && !covered(&real, &base_grants)
            {
                read_targets.push((real, is_dir, call));
            }
            continue;
        }
        let setting = match v.category {
            Category::Network => Some(("network", "[network]\nmode = \"allow\"")),
            Category::Thread => Some(("threads", "[process]\nthreads = \"allow\"")),
            Category::Subprocess => Some(("subprocess", "[process]\nsubprocess = \"allow\"")),
            Category::Exec => Some(("exec", "[process]\nexec = \"allow\"")),
            Category::Sleep => Some(("sleep", "[time]\nsleep = \"allow\"")),
            Category::Clock => Some(("clock", "[time]\nclock = \"real\"")),
            Category::Random => Some(("random", "[random]\ngetrandom = \"allow\"")),
            _ => None,
        };
        if let Some((key, text)) = setting {
            settings
                .entry(key)
                .or_insert_with(|| (text.to_string(), Needed::default()))
                .1
                .add(call.clone());
            if matches!(v.category, Category::Thread | Category::Subprocess) {
                started += u64::from(v.count);
            }
        } else if (v.action == crate::report::Action::Warned || refused_while_learning(v))
            && v.category != Category::Privilege
            && syscalls::number(&v.syscall).is_some()
            && !syscalls::always_denied(&v.syscall)
            && !syscalls::BASE_ALLOWLIST.iter().any(|a| a.name == v.syscall)
        {
            allow.entry(v.syscall.clone()).or_default().add(call);
        } else {
            never.entry(v.syscall.clone()).or_default().add(call);
        }
    }
    // Threads and processes count against limits.processes (RLIMIT_NPROC, or a pids
    // cgroup): a base that allows one task (strict, default) would refuse what the draft
    // allows. Room for twice what the run started, at least 16.
    if started > 0
        && let Some(max) = learned.processes
    {
        let need = (2 * (started + 1)).max(16);
        if need > max {
            settings.insert(
                "processes",
                (
                    format!("[limits]\nprocesses = {need}"),
                    Needed {
                        first: format!(
                            "the run started {started} thread(s) or process(es); the base allows {max} task(s) in all"
                        ),
                        more: 0,
                    },
                ),
            );
        }
    }
    let reads = outermost(read_grants(read_targets, &mut refused));
    let writes = outermost(writes);

    let mut out = String::new();
    out.push_str(&format!(
        "# Drafted by `wfjail learn` from one run of: {}\n# Each grant says which call needed it. Review before use: a grant can be wider than the\n# run needed (a file's whole directory), and a run that wrote nowhere new learned no writes.\n",
        one_line(&command.join(" "), 200)
    ));
    out.push_str(&format!("extends = {}\n", toml_str(base)));
    if !reads.is_empty() || !writes.is_empty() {
        out.push_str("\n[filesystem]\n");
        for (name, list) in [("read", &reads), ("write", &writes)] {
            if list.is_empty() {
                continue;
            }
            out.push_str(&format!("{name} = [\n"));
            for (path, needed) in list {
                out.push_str(&format!(
                    "    {},  # {}\n",
                    toml_str(&path.display().to_string()),
                    one_line(&needed.comment(), 200)
                ));
            }
            out.push_str("]\n");
        }
    }
    // Settings, grouped by their table ([process] once).
    let mut tables: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (text, needed) in settings.values() {
        let (table, line) = text.split_once('\n').unwrap_or((text, ""));
        tables
            .entry(table)
            .or_default()
            .push(format!("{line}  # {}", one_line(&needed.comment(), 200)));
    }
    if !allow.is_empty() {
        let names: Vec<String> = allow
            .iter()
            .map(|(n, needed)| {
                format!(
                    "    {},  # {}",
                    toml_str(n),
                    one_line(&needed.comment(), 200)
                )
            })
            .collect();
        tables
            .entry("[syscalls]")
            .or_default()
            .push(format!("allow = [\n{}\n]", names.join("\n")));
    }
    for (table, lines) in &tables {
        out.push_str(&format!("\n{table}\n"));
        for l in lines {
            out.push_str(l);
            out.push('\n');
        }
    }
    if !refused.is_empty() {
        out.push_str(
            "\n# Not granted: a draft never grants these, whatever the run touched. Grant them\n# yourself (narrower if you can) only if the command must have them:\n",
        );
        for ((path, what), (why, needed)) in &refused {
            out.push_str(&format!(
                "#   {} ({what}): {why}; {}\n",
                toml_str(&path.display().to_string()),
                one_line(&needed.comment(), 200)
            ));
        }
    }
    if !never.is_empty() {
        out.push_str("\n# Denied whatever a policy says (they could weaken the sandbox):\n");
        for (name, needed) in &never {
            out.push_str(&format!(
                "#   {name}: {}\n",
                one_line(&needed.comment(), 200)
            ));
        }
    }
    out
}

/// The learning run's policy from the base's: `warn` (every call the base denies proceeds and
/// is recorded), and what [`contain`] gives both runs. Network calls and file metadata
/// changes the base allows outright (`[syscalls] allow`) are withdrawn, so that they are
/// refused and recorded like the ones it denies: the learning run can open any file for
/// reading, and Landlock does not check metadata changes, so a base's `fchmod` would reach
/// every file the user owns, not only those a run of the base can open. (The verifying run,
/// whose reads are the draft's, keeps what the base allows.)
pub fn learning_policy(base: &crate::policy::Policy) -> crate::policy::Policy {
    let mut learning = base.clone();
    learning.on_violation = crate::policy::OnViolation::Warn;
    // Threads and processes the run starts are let through and recorded: the base's process
    // limit would stop them before they are seen (the draft raises it when it allows them).
    // MAX_TASKS bounds them instead, so that a fork bomb cannot fill the host.
    learning.limits.processes = Some(base.limits.processes.unwrap_or(0).max(MAX_TASKS));
    learning
        .syscalls
        .allow
        .retain(|a| !syscalls::category(&a.value.0).reaches_outside());
    contain(&mut learning);
    learning
}

/// The most tasks (processes and threads together) the learning run may have at once. It lets
/// through the forks and threads the base denies, to see them; without a bound, a fork bomb
/// would fill the host's process table and memory. (A pids cgroup enforces it as root, where
/// RLIMIT_NPROC does not bind.)
pub const MAX_TASKS: u64 = 512;

/// What both runs of `wfjail learn` have, whatever the base or the draft says: no network
/// (an empty network namespace, and network calls refused by the supervisor), and a PID and an
/// IPC namespace of their own, required (a run that cannot have them does not start). The
/// learning run lets through what the base denies (`warn`), and the draft is not reviewed:
/// without those namespaces, a process the run forked would outlive learn, and a System V
/// IPC object it made would stay on the host. Landlock and seccomp user notification are
/// required too: without them, `warn` would let every write through to the host.
pub fn contain(policy: &mut crate::policy::Policy) {
    use crate::policy::Layer;
    policy.network.mode = crate::policy::NetworkMode::None;
    policy.namespaces.net = true;
    policy.namespaces.pid = true;
    policy.namespaces.ipc = true;
    policy.namespaces.mount = true;
    policy.require.extend([
        Layer::PidNs,
        Layer::IpcNs,
        Layer::Landlock,
        Layer::SeccompNotify,
    ]);
}

/// Why a learning or verifying run cannot keep its writes off the host.
#[derive(Debug, thiserror::Error)]
pub enum ThrowawayError {
    #[error(
        "learn keeps every write of the command off the host, in a mount namespace of its own \
         where each write grant is a throw-away copy; making that namespace failed ({0}): run \
         wfjail learn as root, or where unprivileged user namespaces are allowed"
    )]
    Namespace(nix::errno::Errno),
    #[error(
        "{path}: learn cannot back this write grant with a throw-away copy ({why}), and does not \
         let the command write to the host: {fix}"
    )]
    Grant {
        path: String,
        why: String,
        fix: &'static str,
    },
}

/// Gives wfjail (and every guest it starts from now on) a mount namespace of its own, where
/// no mount propagates back to the host. `wfjail learn` calls it once, before anything runs
/// (and while wfjail has one thread), so that [`Throwaway`] can lay copies over the write
/// grants that only its runs see. Without `CAP_SYS_ADMIN`, the namespace is made in a user
/// namespace of wfjail's own, its ids mapped to themselves (the guest's user namespace is
/// then made inside that one, with the same maps).
pub fn private_mounts() -> Result<(), ThrowawayError> {
    use nix::errno::Errno;
    match crate::sys::unshare(libc::CLONE_NEWNS) {
        Ok(()) => {}
        Err(Errno::EPERM) if !nix::unistd::geteuid().is_root() => {
            let (uid, gid) = (nix::unistd::geteuid(), nix::unistd::getegid());
            crate::sys::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS)
                .map_err(ThrowawayError::Namespace)?;
            crate::sys::write_file(c"/proc/self/setgroups", b"deny")
                .and_then(|()| {
                    crate::sys::write_file(
                        c"/proc/self/uid_map",
                        format!("{uid} {uid} 1\n").as_bytes(),
                    )
                })
                .and_then(|()| {
                    crate::sys::write_file(
                        c"/proc/self/gid_map",
                        format!("{gid} {gid} 1\n").as_bytes(),
                    )
                })
                .map_err(ThrowawayError::Namespace)?;
        }
        Err(e) => return Err(ThrowawayError::Namespace(e)),
    }
    crate::sys::mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None)
        .map_err(ThrowawayError::Namespace)
}

/// The write grants of one learning or verifying run, each covered by a throw-away copy in
/// wfjail's own mount namespace ([`private_mounts`]): a directory by an overlay whose upper
/// layer is a `tmpfs`, a file by a bind mount of a copy on that `tmpfs`. The run reads what
/// is there and writes into the copy; the copies go when this is dropped (and with wfjail's
/// namespace, whatever happens), and the host's files are never written. Devices (`/dev/null`)
/// are left as they are: nothing written to them lands in a file.
#[derive(Debug)]
pub struct Throwaway {
    /// What was mounted over, innermost last.
    mounted: Vec<std::ffi::CString>,
}

/// The file system of every throw-away copy (shown in `/proc/self/mountinfo`).
const THROWAWAY_SOURCE: &std::ffi::CStr = c"wfjail-learn";

impl Throwaway {
    /// The most the copies of one run hold when the policy sets no `limits.disk`: they are in
    /// memory, and a run must not fill the host's.
    pub const DEFAULT_SIZE: u64 = 1 << 30;
    /// The copies hold one file or directory per this many bytes of their size...
    pub const BYTES_PER_INODE: u64 = 8 << 10;
    /// ...and at least this many.
    pub const MIN_INODES: u64 = 1024;

    /// Covers each of `write` (canonical paths, as `plan::build` expands them) with a
    /// throw-away copy; all the copies together hold at most `size` bytes (then ENOSPC). An
    /// error leaves nothing mounted.
    pub fn over(write: &[PathBuf], size: u64) -> Result<Throwaway, ThrowawayError> {
        use std::os::unix::ffi::OsStrExt;
        let mut targets: Vec<(PathBuf, bool)> = Vec::new();
        let mut sorted: Vec<&PathBuf> = write.iter().collect();
        sorted.sort();
        for p in sorted {
            if targets.iter().any(|(t, _)| p.starts_with(t)) {
                continue; // inside a copy already
            }
            let grant_error = |why: String| ThrowawayError::Grant {
                path: p.display().to_string(),
                why,
                fix: "grant a directory of your own instead",
            };
            let meta = std::fs::symlink_metadata(p).map_err(|e| grant_error(e.to_string()))?;
            if meta.is_dir() {
                if p.as_os_str()
                    .as_bytes()
                    .iter()
                    .any(|b| matches!(b, b',' | b':' | b'\\'))
                {
                    return Err(grant_error(
                        "a comma, colon or backslash in its path, which overlay options cannot name".into(),
                    ));
                }
                targets.push((p.clone(), true));
            } else if meta.is_file() {
                targets.push((p.clone(), false));
            } else if !USUAL_DEVICES.iter().any(|d| p == Path::new(d)) {
                // A device beyond /dev/null and its kind, a FIFO, a socket: nothing to copy,
                // and writing to it reaches whatever is behind it.
                return Err(grant_error(
                    "neither a directory nor a file, and not one of the usual devices".into(),
                ));
            }
            // /dev/null, /dev/zero...: nothing written to them lands anywhere.
        }
        let mut done = Throwaway { mounted: vec![] };
        if targets.is_empty() {
            return Ok(done);
        }
        // The tmpfs is mounted, filled and detached where no copy will cover it.
        let candidates = [
            std::env::temp_dir(),
            PathBuf::from("/run"),
            PathBuf::from("/dev/shm"),
            PathBuf::from("/tmp"),
        ];
        let Some(parent) = candidates
            .into_iter()
            .find(|c| c.is_dir() && !targets.iter().any(|(t, _)| c.starts_with(t)))
        else {
            return Err(ThrowawayError::Grant {
                path: targets[0].0.display().to_string(),
                why: "every directory for the copies ($TMPDIR, /run, /dev/shm, /tmp) lies under a write grant".into(),
                fix: "set TMPDIR to a directory outside the write grants",
            });
        };
        let scratch = parent.join(format!(
            "wfjail-learn-{}-{}",
            std::process::id(),
            SCRATCH.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let fail = |why: String| ThrowawayError::Grant {
            path: scratch.display().to_string(),
            why,
            fix: "check that wfjail may mount a tmpfs there (set TMPDIR elsewhere)",
        };
        {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&scratch)
                .map_err(|e| fail(e.to_string()))?;
        }
        let scratch_c = cstring(&scratch);
        let mounted = crate::sys::mount(
            Some(THROWAWAY_SOURCE),
            &scratch_c,
            Some(c"tmpfs"),
            libc::MS_NOSUID | libc::MS_NODEV,
            // (size=0 would be no limit at all.) Files without data take no size: their
            // number is bounded too (the kernel's default is half the host's RAM in pages).
            Some(
                &std::ffi::CString::new(format!(
                    "mode=0700,size={},nr_inodes={}",
                    size.max(1 << 16),
                    (size / Self::BYTES_PER_INODE).max(Self::MIN_INODES)
                ))
                .unwrap_or_default(),
            ),
        );
        if let Err(e) = mounted {
            let _ = std::fs::remove_dir(&scratch);
            return Err(fail(format!("mounting a tmpfs: {e}")));
        }
        let result = (|| {
            for (i, (target, dir)) in targets.iter().enumerate() {
                let target_c = cstring(target);
                let how = |e: String| ThrowawayError::Grant {
                    path: target.display().to_string(),
                    why: e,
                    fix: "grant a directory of your own instead",
                };
                if *dir {
                    let (upper, work) =
                        (scratch.join(format!("u{i}")), scratch.join(format!("w{i}")));
                    std::fs::create_dir(&upper).map_err(|e| how(e.to_string()))?;
                    std::fs::create_dir(&work).map_err(|e| how(e.to_string()))?;
                    let opts = format!(
                        "lowerdir={},upperdir={},workdir={}",
                        target.display(),
                        upper.display(),
                        work.display()
                    );
                    let opts = std::ffi::CString::new(opts).map_err(|e| how(e.to_string()))?;
                    crate::sys::mount(
                        Some(THROWAWAY_SOURCE),
                        &target_c,
                        Some(c"overlay"),
                        libc::MS_NOSUID | libc::MS_NODEV,
                        Some(&opts),
                    )
                    .map_err(|e| how(format!("mounting an overlay: {e}")))?;
                } else {
                    let copy = scratch.join(format!("f{i}"));
                    std::fs::copy(target, &copy).map_err(|e| how(e.to_string()))?;
                    crate::sys::mount(Some(&cstring(&copy)), &target_c, None, libc::MS_BIND, None)
                        .map_err(|e| how(format!("bind-mounting a copy: {e}")))?;
                }
                done.mounted.push(target_c);
            }
            Ok(())
        })();
        // The copies keep the tmpfs; nobody else needs to see it.
        let _ = crate::sys::umount_detach(&scratch_c);
        let _ = std::fs::remove_dir(&scratch);
        result.map(|()| done)
    }
}

impl Drop for Throwaway {
    fn drop(&mut self) {
        for target in self.mounted.iter().rev() {
            let _ = crate::sys::umount_detach(target);
        }
    }
}

static SCRATCH: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

fn cstring(p: &Path) -> std::ffi::CString {
    use std::os::unix::ffi::OsStrExt;
    // Paths from the file system hold no NUL byte.
    std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap_or_default()
}

/// A network call or a file metadata change (`chmod`, `utimensat`...) that the learning run
/// refused although a policy may allow it (`Decisions::refuse_outside_effects`).
fn refused_while_learning(v: &Violation) -> bool {
    v.action == crate::report::Action::Denied && syscalls::category(&v.syscall).reaches_outside()
}

/// Unicode's bidirectional controls: a text holding them shows in another order than it
/// reads (a draft is for review, and the paths in it are the program's).
fn reorders(c: char) -> bool {
    matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

fn one_line(s: &str, max: usize) -> String {
    let flat: String = s
        .chars()
        .map(|c| {
            if c.is_control() || reorders(c) {
                ' '
            } else {
                c
            }
        })
        .collect();
    if flat.chars().count() > max {
        flat.chars().take(max).collect::<String>() + "..."
    } else {
        flat
    }
}

/// What the verifying run does not get of an unreviewed draft: the network, the metadata
/// calls the base does not allow, and `warn` (a run that lets everything through verifies
/// nothing, and writes where Landlock would have refused). Returns what was withheld, for
/// the message when the run fails without it.
pub fn withhold_unreviewed(
    drafted: &mut crate::policy::Policy,
    base: &crate::policy::Policy,
) -> Vec<String> {
    let mut withheld = Vec::new();
    if drafted.network.mode != crate::policy::NetworkMode::None {
        withheld.push("the network".to_string());
    }
    contain(drafted);
    // The draft's limits.processes is twice what the learning run started (one after the
    // other, maybe): the unreviewed run has no more tasks at once than the learning run.
    let bound = base.limits.processes.unwrap_or(0).max(MAX_TASKS);
    if drafted.limits.processes.is_none_or(|p| p > bound) {
        if drafted.limits.processes.is_some() {
            withheld.push(format!("more than {bound} tasks at once"));
        }
        drafted.limits.processes = Some(bound);
    }
    if drafted.on_violation == crate::policy::OnViolation::Warn {
        drafted.on_violation = crate::policy::OnViolation::Deny;
    }
    drafted.syscalls.allow.retain(|a| {
        let name = a.value.0.as_str();
        if syscalls::category(name).reaches_outside() && !base.syscalls.allows(name) {
            withheld.push(name.to_string());
            return false;
        }
        true
    });
    withheld
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Action;

    /// What a learning run that read and wrote nothing granted recorded.
    fn learned(violations: Vec<Violation>) -> Learned {
        Learned {
            read: vec![],
            write: vec![],
            violations,
            processes: None,
        }
    }

    /// The `openat` calls a learning run recorded, one per argument text.
    fn opens(args: &[&str]) -> Vec<Violation> {
        args.iter()
            .map(|a| v(Category::Filesystem, "openat", a))
            .collect()
    }

    fn v(category: Category, syscall: &str, args: &str) -> Violation {
        Violation {
            category,
            syscall: syscall.into(),
            args: args.into(),
            action: Action::Warned,
            rule: String::new(),
            hint: String::new(),
            count: 1,
        }
    }

    #[test]
    fn a_draft_never_grants_the_root_a_system_directory_or_a_device_and_says_so() {
        let learned = learned(opens(&[
            "/wfjail-x (write)",
            "/etc/wfjail-x (write)",
            "/usr (read)",
            "/dev/kmsg (read)",
            "/dev/null (read)",
            "/ (read)",
        ]));
        let text = draft("default", &learned, &["x".into()]);
        crate::policy::from_source("d.toml", &text).unwrap();
        for refused in [
            "#   \"/\" (write): the whole file system; openat(/wfjail-x (write))",
            "#   \"/etc\" (write): a system directory as a whole; openat(/etc/wfjail-x (write))",
            "#   \"/dev/kmsg\" (read): a device beyond the usual ones",
            "#   \"/\" (read): the whole file system",
            "#   \"/usr\" (read): a system directory as a whole",
        ] {
            assert!(text.contains(refused), "{refused} in {text}");
        }
        assert!(text.contains("\"/dev/null\",  # openat"), "{text}");
        assert!(!text.contains("write = ["), "{text}");
        assert_eq!(
            floor(Path::new("/etc/app"), true),
            Some("the system's own files")
        );
        assert_eq!(floor(Path::new("/etc/app"), false), None);
        assert_eq!(floor(Path::new("/var/lib/app"), true), None);
        assert!(floor(Path::new("/home/someone"), false).is_some());
        assert_eq!(floor(Path::new("/home/someone/project"), true), None);
        assert!(floor(Path::new("/srv/a$b"), false).is_some());
        assert_eq!(toml_str("a\u{7f}\"\\\n"), "\"a\\u007f\\\"\\\\\\u000a\"");
    }

    #[test]
    fn network_and_metadata_calls_refused_while_learning_are_drafted_as_such() {
        let mut net = v(Category::Network, "socket", "AF_INET SOCK_STREAM");
        net.action = Action::Denied;
        let mut chmod = v(Category::Filesystem, "chmod", "/tmp/f");
        chmod.action = Action::Denied;
        let learned = learned(vec![net, chmod]);
        let text = draft("default", &learned, &["x".into()]);
        assert!(
            text.contains(
                "mode = \"allow\"  # socket(AF_INET SOCK_STREAM), refused while learning"
            ),
            "{text}"
        );
        assert!(
            text.contains("\"chmod\",  # chmod(/tmp/f), refused while learning"),
            "{text}"
        );
    }

    #[test]
    fn a_draft_with_threads_grants_no_sleep_for_timed_futex_waits() {
        let futex = v(Category::Sleep, "futex", "0xa5b8f0, 0x89, 0x0");
        let thread = v(Category::Thread, "clone", "CLONE_VM|CLONE_THREAD");
        let with = Learned {
            read: vec![],
            write: vec![],
            violations: vec![thread, futex.clone()],
            processes: Some(1),
        };
        let text = draft("strict", &with, &["python3".into()]);
        assert!(text.contains("threads = \"allow\""), "{text}");
        // strict allows one task: the thread needs room under limits.processes.
        assert!(text.contains("processes = 16"), "{text}");
        crate::policy::from_source("d.toml", &text).unwrap();
        assert!(!text.contains("sleep"), "{text}");
        // Without threads, a timed futex wait is Lock.acquire(timeout=...): a sleep.
        let without = Learned {
            read: vec![],
            write: vec![],
            violations: vec![futex],
            processes: None,
        };
        assert!(draft("strict", &without, &["python3".into()]).contains("sleep = \"allow\""));
    }

    #[test]
    fn a_draft_grants_what_the_run_used_beyond_the_base_and_says_why() {
        let learned = Learned {
            read: vec![PathBuf::from("/usr")],
            write: vec![PathBuf::from("/dev/null")],
            ..learned(
                [
                    opens(&[
                        "/usr/lib/os.py (read)",
                        "/etc/hostname (read)",
                        "/etc/hosts (read)",
                        "/proc/self/status (read)",
                        "/tmp/x/y.txt (write)",
                    ]),
                    vec![
                        v(Category::Sleep, "nanosleep", "0.2 s"),
                        v(Category::Other, "setpriority", "0, 0, 10"),
                    ],
                ]
                .concat(),
            )
        };
        let text = draft("default", &learned, &["/usr/bin/python3".into()]);
        let p = crate::policy::from_source("learned.toml", &text).unwrap();
        // Two files of /etc: each on its own, as /etc is a system directory.
        assert!(
            text.contains("\"/etc/hostname\",  # openat(/etc/hostname (read))")
                && text.contains("\"/etc/hosts\",  # openat(/etc/hosts (read))")
                && !text.contains("\"/etc\","),
            "{text}"
        );
        assert!(!text.contains("/usr/lib"), "inside the base: {text}");
        assert!(!text.contains("/proc"), "{text}");
        // /tmp/x does not exist: nothing above it is granted, and the draft says so.
        assert!(!text.contains("\"/tmp\","), "{text}");
        assert!(
            text.contains("#   \"/tmp/x\" (write): its directory does not exist"),
            "{text}"
        );
        assert_eq!(p.time.sleep, crate::policy::Toggle::Allow);
        assert!(p.syscalls.allow.iter().any(|a| a.value.0 == "setpriority"));
    }
}
