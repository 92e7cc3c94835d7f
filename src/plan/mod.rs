//! Everything prepared in the parent before the fork: the resolved command, its argv and
//! environment as C strings, the path grants, the Landlock ruleset, the seccomp programs,
//! rlimits and namespace choices. The child reads this (through `confine::ChildSpec`) and
//! only makes system calls.

pub mod landlock;

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::policy::{
    self, Layer, Location, NetworkMode, OnViolation, PathRule, Policy, Toggle, VarContext, bpf,
};

/// A filesystem grant added on the command line (`--ro`/`--rw`).
#[derive(Debug, Clone)]
pub struct ExtraGrant {
    pub path: PathBuf,
    pub write: bool,
}

impl ExtraGrant {
    /// The grants of `--ro` and `--rw` flags.
    pub fn from_flags(ro: &[PathBuf], rw: &[PathBuf]) -> Vec<ExtraGrant> {
        let ro = ro.iter().map(|p| ExtraGrant {
            path: p.clone(),
            write: false,
        });
        ro.chain(rw.iter().map(|p| ExtraGrant {
            path: p.clone(),
            write: true,
        }))
        .collect()
    }
}

/// What the caller asks for, beyond the policy.
#[derive(Debug, Clone, Default)]
pub struct PlanRequest {
    pub argv: Vec<String>,
    pub grants: Vec<ExtraGrant>,
    /// Extra environment for the guest (e.g. the protocol's descriptor numbers).
    pub extra_env: Vec<(String, String)>,
    /// The guest is a prefork zygote: it must fork (RLIMIT_NPROC is not applied; the
    /// supervisor allows only its forks), and opens may be watched after preload.
    pub zygote: bool,
    /// The guest is a `serve` session's (exec mode): RLIMIT_CPU is `limits.session_cpu`, the
    /// session's whole life; `limits.cpu` is each call's, which the session measures.
    pub session: bool,
    /// `wfjail learn`: everything is readable (Landlock), every open goes to the supervisor,
    /// which records it; writes stay confined to the policy's grants.
    pub learn: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("no command given: write it after `--`, e.g. `wfjail run -- /usr/bin/python3 -c pass`")]
    NoCommand,
    #[error("command not found: {cmd} (searched PATH={path})")]
    NotFound { cmd: String, path: String },
    #[error("{path}: {reason}")]
    NotExecutable { path: String, reason: String },
    #[error(
        "{path} is not readable under policy {policy}: grant it with --ro {dir} (or a parent \
         directory such as the interpreter's install prefix)"
    )]
    NotGranted {
        path: String,
        dir: String,
        policy: String,
    },
    #[error("--{flag} {path}: {source}")]
    MissingGrant {
        flag: &'static str,
        path: String,
        source: std::io::Error,
    },
    #[error("{at}: {message}")]
    Variable { at: Location, message: String },
    #[error("{0}")]
    Policy(#[from] policy::PolicyError),
    #[error(
        "Landlock is required by policy {policy} but unavailable here: {why}; run `wfjail check`"
    )]
    LandlockRequired { policy: String, why: String },
    #[error("{0}")]
    Landlock(#[from] landlock::LandlockError),
    #[error("compiling the seccomp filter: {0}")]
    Bpf(#[from] bpf::BpfError),
    #[error("argument or environment value contains a NUL byte: {0:?}")]
    Nul(String),
}

impl PlanError {
    /// wfjail's exit status for this error (docs/contract.md, "Statuses and exit codes").
    pub fn exit_code(&self) -> i32 {
        match self {
            PlanError::NotFound { .. } => 127,
            PlanError::NotExecutable { .. } | PlanError::NotGranted { .. } => 126,
            PlanError::NoCommand
            | PlanError::MissingGrant { .. }
            | PlanError::Variable { .. }
            | PlanError::Policy(_)
            | PlanError::Nul(_) => 2,
            PlanError::LandlockRequired { .. } | PlanError::Landlock(_) | PlanError::Bpf(_) => 125,
        }
    }
}

/// The guest program image: argv and envp as C strings with their pointer arrays.
pub struct ExecImage {
    pub path: CString,
    #[allow(dead_code)]
    argv: Vec<CString>,
    #[allow(dead_code)]
    envp: Vec<CString>,
    pub argv_ptrs: Vec<*const libc::c_char>,
    pub envp_ptrs: Vec<*const libc::c_char>,
}

impl ExecImage {
    fn new(
        path: &Path,
        argv: &[String],
        env: &BTreeMap<String, String>,
    ) -> Result<Self, PlanError> {
        let cstr = |s: &[u8]| {
            CString::new(s).map_err(|_| PlanError::Nul(String::from_utf8_lossy(s).into()))
        };
        let path = cstr(path.as_os_str().as_bytes())?;
        let argv: Vec<CString> = argv
            .iter()
            .map(|a| cstr(a.as_bytes()))
            .collect::<Result<_, _>>()?;
        let envp: Vec<CString> = env
            .iter()
            .map(|(k, v)| cstr(format!("{k}={v}").as_bytes()))
            .collect::<Result<_, _>>()?;
        let ptrs = |v: &[CString]| {
            v.iter()
                .map(|c| c.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect()
        };
        let argv_ptrs = ptrs(&argv);
        let envp_ptrs = ptrs(&envp);
        Ok(ExecImage {
            path,
            argv,
            envp,
            argv_ptrs,
            envp_ptrs,
        })
    }

    /// The address the child passes to `execve` as its path (used by the fallback filter).
    pub fn path_address(&self) -> u64 {
        self.path.as_ptr() as u64
    }
}

/// The prepared confinement of one execution.
pub struct Plan {
    /// The policy's name (reports, hints).
    pub policy_name: String,
    pub on_violation: OnViolation,
    pub namespaces: policy::NamespaceRules,
    /// The layers the policy requires (`namespaces` standing for each namespace).
    pub required: Vec<Layer>,
    /// `[process] address_randomization = "deny"`: the child pins its layout.
    pub no_aslr: bool,
    pub network: NetworkMode,
    pub limits: policy::Limits,
    /// The command as resolved (absolute path) and its arguments.
    pub command: PathBuf,
    pub argv: Vec<String>,
    /// For `#!` scripts: the interpreter the kernel will run.
    pub script_interpreter: Option<PathBuf>,
    pub exec: ExecImage,
    pub env: BTreeMap<String, String>,
    pub uid_map: Vec<u8>,
    pub gid_map: Vec<u8>,
    pub rlimits: Vec<(libc::c_int, u64)>,
    pub landlock: Option<(OwnedFd, landlock::LandlockInfo)>,
    /// Why Landlock is absent, when it is.
    pub landlock_missing: Option<String>,
    pub seccomp_notify: Vec<libc::sock_filter>,
    /// The program with in-filter actions, for a child whose listener the kernel refuses;
    /// `None` when the listener is sure to install (`sys::user_notification_certain`), and
    /// then a refused listener stops the start instead (`confine::apply`).
    pub seccomp_fallback: Option<Vec<libc::sock_filter>>,
    /// Stacked on the guest's filter under `limits.disk` (`bpf::no_send_fds`).
    pub seccomp_no_send_fds: Option<Vec<libc::sock_filter>>,
    /// What the filter's knobs decided beside it: the supervisor's checks, the answers, the
    /// vDSO patch (`policy::rules`).
    pub rules: policy::rules::RuleSet,
    /// Where each program holds `bpf::SELF_PID`, for the child to write its pid over.
    pub self_pid_slots: (Vec<usize>, Vec<usize>),
    pub last_cap: u32,
    pub read: Vec<PathBuf>,
    pub write: Vec<PathBuf>,
    /// Directories listed only (`[filesystem] list`): entries, not contents.
    pub list: Vec<PathBuf>,
    /// `on_violation = "warn"` in `wfjail run`: Landlock lets every path through, and the
    /// supervisor judges each open against `read` and `write` (a file the policy would refuse
    /// is read or written, and reported).
    pub warn_files: bool,
    /// Policy paths that do not exist on this host (skipped, listed in the report).
    pub skipped: Vec<String>,
    /// `wfjail learn`: the grants of the policy as written (before everything was made
    /// readable for the learning run), read and write.
    pub base_grants: Option<(Vec<PathBuf>, Vec<PathBuf>)>,
    /// `serve --merge-pages`: the child opts into same-page merging before its exec (a
    /// zygote's; set by its start, never by a policy).
    pub merge_pages: bool,
    /// Arguments of the command that name files the guest may not read (a script given to
    /// an interpreter outside the grants): named in the report if the guest fails.
    pub unreadable_args: Vec<PathBuf>,
}

impl Plan {
    /// Whether the policy requires `layer`.
    pub fn requires(&self, layer: Layer) -> bool {
        self.required.contains(&layer)
    }
}

/// The hostname a guest sees in its UTS namespace.
pub const HOSTNAME: &[u8] = b"wfjail";

/// Resolves `cmd` like `execvp` would, in `path_env`.
pub fn resolve_command(cmd: &str, path_env: &str) -> Result<PathBuf, PlanError> {
    let candidate = |p: PathBuf| -> Result<PathBuf, PlanError> {
        let meta = std::fs::metadata(&p).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                PlanError::NotFound {
                    cmd: cmd.to_string(),
                    path: path_env.to_string(),
                }
            } else {
                PlanError::NotExecutable {
                    path: p.display().to_string(),
                    reason: e.to_string(),
                }
            }
        })?;
        if meta.is_dir() {
            return Err(PlanError::NotExecutable {
                path: p.display().to_string(),
                reason: "is a directory".into(),
            });
        }
        if meta.permissions().mode() & 0o111 == 0 {
            return Err(PlanError::NotExecutable {
                path: p.display().to_string(),
                reason: "permission denied: not executable (chmod +x, or run it through its interpreter)".into(),
            });
        }
        Ok(p)
    };
    if cmd.contains('/') {
        return candidate(PathBuf::from(cmd)).map_err(|e| match e {
            PlanError::NotFound { cmd, .. } => PlanError::NotFound {
                cmd,
                path: "(not searched: the command has a '/')".into(),
            },
            e => e,
        });
    }
    for dir in path_env.split(':').filter(|d| !d.is_empty()) {
        let p = Path::new(dir).join(cmd);
        if let Ok(meta) = std::fs::metadata(&p)
            && meta.is_file()
            && meta.permissions().mode() & 0o111 != 0
        {
            return Ok(p);
        }
    }
    Err(PlanError::NotFound {
        cmd: cmd.to_string(),
        path: path_env.to_string(),
    })
}

/// The interpreter named on a `#!` line, if `path` is a script.
fn script_interpreter(path: &Path) -> Option<PathBuf> {
    use std::io::Read;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(path).ok()?.read(&mut head).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let end = line.iter().position(|&b| b == b'\n').unwrap_or(line.len());
    let interp = line[..end]
        .split(|b| b.is_ascii_whitespace())
        .find(|s| !s.is_empty())?;
    Some(PathBuf::from(OsStr::from_bytes(interp)))
}

/// Whether `path` lies under one of `grants` (all canonical).
pub fn covered(path: &Path, grants: &[PathBuf]) -> bool {
    grants.iter().any(|g| path.starts_with(g))
}

/// The guest's environment per the policy's `[env]`.
fn guest_env(policy: &Policy, extra: &[(String, String)]) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    if policy.env.clear {
        for k in &policy.env.keep {
            if let Ok(v) = std::env::var(k) {
                env.insert(k.clone(), v);
            }
        }
    } else {
        env.extend(std::env::vars());
    }
    env.extend(policy.env.set.iter().map(|(k, v)| (k.clone(), v.clone())));
    env.extend(extra.iter().cloned());
    env
}

/// Expands and canonicalizes policy grants; missing paths are skipped and returned.
/// The other directories `${exe_dir}` stands for (see `VarContext::exe_dir_also`): the
/// command's real directory, when a symlink led there (pyenv's shims, a venv's `python`), and
/// a virtualenv's base interpreter directory (`home = DIR` in `../pyvenv.cfg`), both of whose
/// `..` hold the standard library the venv's interpreter imports.
/// The `pyvenv.cfg` of the virtualenv `command` belongs to (`bin/../pyvenv.cfg`), if any.
fn venv_config(command: &Path) -> Option<PathBuf> {
    let cfg = std::path::absolute(command)
        .ok()?
        .parent()?
        .parent()?
        .join("pyvenv.cfg");
    std::fs::canonicalize(cfg).ok().filter(|c| c.is_file())
}

fn exe_dirs_also(command: &Path, canonical: &Path, venv_cfg: Option<&Path>) -> Vec<String> {
    let mut dirs = Vec::new();
    let dir = std::path::absolute(command)
        .ok()
        .and_then(|c| c.parent().map(Path::to_path_buf));
    if let Some(real) = canonical.parent()
        && Some(real) != dir.as_deref()
    {
        dirs.push(real.display().to_string());
    }
    if let Some(cfg) = venv_cfg.and_then(|c| std::fs::read_to_string(c).ok()) {
        for line in cfg.lines() {
            if let Some((key, value)) = line.split_once('=')
                && key.trim() == "home"
            {
                let home = value.trim();
                if home.starts_with('/') && !dirs.iter().any(|d| d == home) {
                    dirs.push(home.to_string());
                }
            }
        }
    }
    dirs
}

fn expand_grants(
    rules: &[PathRule],
    ctx: &VarContext,
    out: &mut Vec<PathBuf>,
    skipped: &mut Vec<String>,
) -> Result<(), PlanError> {
    // A grant written with ${exe_dir} is given once per directory it stands for.
    let mut expanded: Vec<(PathRule, VarContext)> = Vec::new();
    for r in rules {
        expanded.push((r.clone(), ctx.clone()));
        if r.value.0.contains("${exe_dir}") {
            for d in &ctx.exe_dir_also {
                let mut c = ctx.clone();
                c.exe_dir = Some(d.clone());
                expanded.push((r.clone(), c));
            }
        }
    }
    for (r, ctx) in &expanded {
        let (r, ctx) = (r, ctx);
        let p = r.value.expand(ctx).map_err(|message| PlanError::Variable {
            at: r.at.clone(),
            message,
        })?;
        match std::fs::canonicalize(&p) {
            Ok(c) => {
                if let Some(why) = too_wide(&r.value, &c, ctx) {
                    return Err(PlanError::Variable {
                        at: r.at.clone(),
                        message: why,
                    });
                }
                if !out.contains(&c) {
                    out.push(c)
                }
            }
            Err(_) => skipped.push(p),
        }
    }
    Ok(())
}

/// Why a grant made from `${cwd}` or `${home}` is refused: it came out as `/`, or as the home
/// directory or one of its ancestors (a workflow must not read the whole file system, nor
/// keys and credentials kept at home).
fn too_wide(template: &policy::PathTemplate, grant: &Path, ctx: &VarContext) -> Option<String> {
    let var = ["cwd", "home"]
        .into_iter()
        .find(|v| template.0.contains(&format!("${{{v}}}")))?;
    let home = ctx
        .home
        .as_deref()
        .and_then(|h| std::fs::canonicalize(h).ok());
    let what = if grant == Path::new("/") {
        "/, the whole file system".to_string()
    } else if home.as_deref().is_some_and(|h| h.starts_with(grant)) {
        format!(
            "{}, {} (keys and credentials included)",
            grant.display(),
            if home.as_deref() == Some(grant) {
                "the home directory"
            } else {
                "which holds the home directory"
            }
        )
    } else {
        return None;
    };
    let fix = if var == "cwd" {
        "run from the directory of the workflow code (cd into it), or name that directory instead of ${cwd}"
    } else {
        "name a directory below ${home} instead"
    };
    Some(format!(
        "{:?} would grant {what} to the guest; {fix}",
        template.0
    ))
}

/// The highest capability number of this kernel.
fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        // Only when the file cannot be read: the probe asks the kernel about every
        // capability, a call each.
        .unwrap_or_else(|| {
            caps::runtime::thread_all_supported()
                .len()
                .saturating_sub(1) as u32
        })
}

/// The paths one execution may read and write: the policy's grants expanded for its command,
/// and the command line's (`--ro`/`--rw`).
#[derive(Debug, Clone, Default)]
pub struct Grants {
    pub read: Vec<PathBuf>,
    pub write: Vec<PathBuf>,
    /// Directories listed only.
    pub list: Vec<PathBuf>,
    /// Policy paths that do not exist on this host.
    pub skipped: Vec<String>,
}

/// The grants of `req` under `policy`, without the rest of a plan (what `wfjail learn`'s
/// throwaway copy of the write grants needs).
pub fn grants(policy: &Policy, req: &PlanRequest) -> Result<Grants, PlanError> {
    let cmd = req.argv.first().ok_or(PlanError::NoCommand)?;
    let path_env = std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into());
    let command = resolve_command(cmd, &path_env)?;
    let canonical_cmd = std::fs::canonicalize(&command).unwrap_or_else(|_| command.clone());
    grants_of(policy, req, &command, &canonical_cmd)
}

fn grants_of(
    policy: &Policy,
    req: &PlanRequest,
    command: &Path,
    canonical_cmd: &Path,
) -> Result<Grants, PlanError> {
    // Looked up once: it is both a directory `${exe_dir}` stands for and a grant.
    let venv_cfg = venv_config(command);
    let ctx = VarContext {
        cwd: std::env::current_dir()
            .ok()
            .map(|p| p.display().to_string()),
        home: std::env::var("HOME").ok(),
        // Not canonical: a virtualenv's bin/python is a symlink to the system interpreter,
        // and its prefix (bin/..) is the virtualenv, not /usr.
        exe_dir: std::path::absolute(command)
            .ok()
            .and_then(|c| c.parent().map(|p| p.display().to_string())),
        exe_dir_also: exe_dirs_also(command, canonical_cmd, venv_cfg.as_deref()),
    };
    let mut read = Vec::new();
    let mut write = Vec::new();
    let mut list = Vec::new();
    let mut skipped = Vec::new();
    expand_grants(&policy.filesystem.read, &ctx, &mut read, &mut skipped)?;
    expand_grants(&policy.filesystem.write, &ctx, &mut write, &mut skipped)?;
    expand_grants(&policy.filesystem.list, &ctx, &mut list, &mut skipped)?;
    // Landlock lists directories only: a file here would be a rule without any right.
    if let Some(r) = policy.filesystem.list.iter().find(|r| {
        r.value
            .expand(&ctx)
            .is_ok_and(|p| std::fs::metadata(p).is_ok_and(|m| !m.is_dir()))
    }) {
        return Err(PlanError::Variable {
            at: r.at.clone(),
            message: format!(
                "{:?} is not a directory: [filesystem] list takes directories (grant a file with read)",
                r.value.0
            ),
        });
    }
    // A virtualenv's interpreter reads `pyvenv.cfg` before anything else (site.py): without
    // it, it cannot start at all. Reading it tells the guest nothing it does not run with.
    if let Some(cfg) = venv_cfg
        && !read.contains(&cfg)
    {
        read.push(cfg);
    }
    for g in &req.grants {
        let flag = if g.write { "rw" } else { "ro" };
        let c = std::fs::canonicalize(&g.path).map_err(|source| PlanError::MissingGrant {
            flag,
            path: g.path.display().to_string(),
            source,
        })?;
        if policy::rules::getrandom::withholds_entropy(policy)
            && policy::covers_random_device(&c.to_string_lossy())
        {
            return Err(PlanError::MissingGrant {
                flag,
                path: g.path.display().to_string(),
                source: std::io::Error::other(
                    "would make /dev/urandom readable, but the policy denies randomness; grant single devices instead",
                ),
            });
        }
        let list = if g.write { &mut write } else { &mut read };
        if !list.contains(&c) {
            list.push(c);
        }
    }
    Ok(Grants {
        read,
        write,
        list,
        skipped,
    })
}

/// Prepares one execution of `req.argv` under `policy`.
pub fn build(policy: &Policy, req: &PlanRequest) -> Result<Plan, PlanError> {
    let cmd = req.argv.first().ok_or(PlanError::NoCommand)?;
    let path_env = std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into());
    let command = resolve_command(cmd, &path_env)?;
    let canonical_cmd = std::fs::canonicalize(&command).unwrap_or_else(|_| command.clone());
    let interpreter = script_interpreter(&canonical_cmd);
    crate::timing::mark("plan: command");

    let Grants {
        mut read,
        write,
        list,
        skipped,
    } = grants_of(policy, req, &command, &canonical_cmd)?;
    crate::timing::mark("plan: grants");
    // The command (and a script's interpreter) must be readable, or exec fails with EACCES:
    // say so now, with the fix, instead of after a fork.
    let landlock_abi = crate::sys::landlock_abi();
    // Warn: a call the policy denies runs and is reported. For files that means Landlock
    // lets every path through while the supervisor judges each open against the grants. Not
    // for learn (writes outside the base fail there by design), nor in serve (a zygote's own
    // reads are no session's to report; sessions are judged by the zygote's router).
    let warn_files =
        policy.on_violation == OnViolation::Warn && !req.learn && !req.session && !req.zygote;
    if landlock_abi.is_ok() && !req.learn && !warn_files {
        let granted: Vec<PathBuf> = read.iter().chain(&write).cloned().collect();
        // The command is canonical already (or could not be made so, which a second try
        // would not change); a script's interpreter is made canonical here.
        let interpreter_canonical = interpreter
            .as_ref()
            .map(|i| std::fs::canonicalize(i).unwrap_or_else(|_| i.clone()));
        for exe in std::iter::once(&canonical_cmd).chain(interpreter_canonical.as_ref()) {
            if !covered(exe, &granted) {
                return Err(PlanError::NotGranted {
                    path: exe.display().to_string(),
                    dir: exe.parent().unwrap_or(Path::new("/")).display().to_string(),
                    policy: policy.name.clone(),
                });
            }
        }
    }

    // Learning: what the policy grants is kept for the draft; the run may read anything.
    let base_grants = req.learn.then(|| (read.clone(), write.clone()));
    if req.learn {
        read.push(PathBuf::from("/"));
    }
    // Arguments that are files outside the grants, for the report's hint.
    let unreadable_args: Vec<PathBuf> = if landlock_abi.is_ok() {
        let granted: Vec<PathBuf> = read.iter().chain(&write).cloned().collect();
        req.argv
            .iter()
            .skip(1)
            .filter_map(|a| std::fs::canonicalize(a).ok())
            .filter(|p| p.is_file() && !covered(p, &granted))
            .collect()
    } else {
        vec![]
    };
    let env = guest_env(policy, &req.extra_env);
    let exec = ExecImage::new(&command, &req.argv, &env)?;
    crate::timing::mark("plan: checks, env, exec image");

    // Landlock.
    let deny_tcp =
        policy.network.mode == NetworkMode::None && policy.on_violation != OnViolation::Warn;
    let (landlock, landlock_missing) = match landlock_abi {
        Ok(abi) if warn_files => {
            let everything = [PathBuf::from("/")];
            (
                Some(landlock::build(abi, &[], &[], &everything, deny_tcp)?),
                None,
            )
        }
        Ok(abi) => (
            Some(landlock::build(abi, &read, &list, &write, deny_tcp)?),
            None,
        ),
        Err(e) => {
            let (what, enable) = landlock::why_missing(e);
            let why = format!("{what}; to enable: {enable}");
            if policy.requires(Layer::Landlock) {
                return Err(PlanError::LandlockRequired {
                    policy: policy.name.clone(),
                    why,
                });
            }
            (None, Some(why))
        }
    };

    crate::timing::mark("plan: landlock");
    // Seccomp: both programs, so the child can fall back without calling us.
    let watch_reads = req.learn
        || warn_files
        || (req.zygote && policy.zygote.reads_after_preload == Toggle::Deny);
    let seccomp_notify = match policy::prebuilt::notify_program(policy, req.zygote, watch_reads) {
        Some(program) => program,
        None => bpf::compile(policy, bpf::Mode::Notify, None, req.zygote, watch_reads)?,
    };
    // The fall-back program only where the listener may be refused: compiling it was ~0.05 ms
    // of every run on a host where it is never used.
    let seccomp_fallback = if crate::sys::user_notification_certain() {
        None
    } else {
        Some(bpf::compile(
            policy,
            bpf::Mode::Fallback,
            Some(exec.path_address()),
            req.zygote,
            watch_reads,
        )?)
    };
    let self_pid_slots = (
        bpf::self_pid_slots(&seccomp_notify),
        seccomp_fallback
            .as_deref()
            .map_or_else(Vec::new, bpf::self_pid_slots),
    );

    crate::timing::mark("plan: seccomp");
    use nix::sys::resource::Resource;
    let l = &policy.limits;
    let wanted = [
        (Resource::RLIMIT_AS, l.memory.map(|m| m.0)),
        (
            Resource::RLIMIT_CPU,
            // A zygote lives as long as the server: each child takes the session's limit after
            // its fork.
            if req.session { l.session_cpu } else { l.cpu }
                .filter(|_| !req.zygote)
                .map(|c| c.0.as_secs_f64().ceil() as u64),
        ),
        (
            Resource::RLIMIT_NOFILE,
            l.open_files.as_ref().map(|n| n.value),
        ),
        (Resource::RLIMIT_FSIZE, l.file_size.map(|f| f.0)),
        (Resource::RLIMIT_NPROC, l.processes.filter(|_| !req.zygote)),
    ];
    // A limit is an upper bound: where wfjail already runs under a lower hard limit, that one
    // stays (raising a hard limit needs a privilege the child does not keep).
    let rlimits = wanted
        .into_iter()
        .filter_map(|(r, v)| {
            let v = v?;
            let hard = nix::sys::resource::getrlimit(r).map_or(u64::MAX, |(_, hard)| hard);
            Some((r as libc::c_int, v.min(hard)))
        })
        .collect();

    let uid = nix::unistd::geteuid().as_raw();
    let gid = nix::unistd::getegid().as_raw();
    Ok(Plan {
        rules: policy::rules::RuleSet::compile(
            policy,
            policy::rules::Shape {
                zygote: req.zygote,
                watch_reads,
                learn: req.learn,
            },
        ),
        policy_name: policy.name.clone(),
        on_violation: policy.on_violation,
        namespaces: policy.namespaces,
        required: Layer::ALL
            .into_iter()
            .filter(|&l| policy.requires(l))
            .collect(),
        // Requiring the pinned layout asks for it.
        no_aslr: policy.process.address_randomization == Toggle::Deny
            || policy.requires(Layer::AddressLayout),
        network: policy.network.mode,
        limits: policy.limits.clone(),
        command: canonical_cmd,
        argv: req.argv.clone(),
        script_interpreter: interpreter,
        exec,
        env,
        uid_map: format!("{uid} {uid} 1\n").into_bytes(),
        gid_map: format!("{gid} {gid} 1\n").into_bytes(),
        rlimits,
        landlock,
        landlock_missing,
        seccomp_notify,
        seccomp_fallback,
        seccomp_no_send_fds: policy.limits.disk.is_some().then(bpf::no_send_fds),
        self_pid_slots,
        last_cap: last_cap(),
        read,
        write,
        list,
        skipped,
        merge_pages: false,
        unreadable_args,
        warn_files,
        base_grants,
    })
}
