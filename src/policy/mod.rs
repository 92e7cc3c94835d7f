//! Policies: plain data read from TOML, layered with `extends`, validated, and compiled to a
//! seccomp program here in the parent. Nothing in this module touches the process it runs in.
//!
//! ```
//! let p = wfjail::policy::load("strict").unwrap();
//! assert_eq!(p.time.sleep, wfjail::policy::Toggle::Deny);
//! ```

pub mod bpf;
mod error;
mod model;
pub mod syscall_table;
pub mod syscalls;
mod values;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Serialize;
use toml::Spanned;

pub use error::{Location, PolicyError};
pub use model::{Layer, NetworkMode, OnViolation, Toggle};
pub use values::{Dur, PathTemplate, Size, SyscallName, VarContext};

/// The built-in policies, embedded in the binary from `policies/*.toml`.
pub const BUILTINS: &[(&str, &str)] = &[
    ("default", include_str!("../../policies/default.toml")),
    ("strict", include_str!("../../policies/strict.toml")),
    (
        "temporal-python",
        include_str!("../../policies/temporal-python.toml"),
    ),
    ("permissive", include_str!("../../policies/permissive.toml")),
];

/// How deep `extends` may nest.
pub const MAX_EXTENDS_DEPTH: usize = 8;

/// A value and where it was written (serializes as the bare value).
#[derive(Debug, Clone)]
pub struct At<T> {
    pub value: T,
    pub at: Location,
}

impl<T: Serialize> Serialize for At<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.value.serialize(s)
    }
}

/// A path grant and where it was written.
pub type PathRule = At<PathTemplate>;

/// A fully resolved policy: `extends` applied, defaults filled in, validated. Serializes in the
/// policy-file format (so `wfjail policy show` output is itself a valid policy).
#[derive(Debug, Clone, Serialize)]
pub struct Policy {
    /// The built-in name or the file path it was loaded from.
    #[serde(skip)]
    pub name: String,
    pub description: String,
    pub require: BTreeSet<Layer>,
    pub on_violation: OnViolation,
    pub filesystem: FilesystemRules,
    pub network: NetworkRules,
    pub process: ProcessRules,
    pub time: TimeRules,
    pub random: RandomRules,
    pub syscalls: SyscallRules,
    pub limits: Limits,
    pub env: EnvRules,
    pub namespaces: NamespaceRules,
    pub zygote: ZygoteRules,
}

#[derive(Debug, Clone, Serialize)]
pub struct ZygoteRules {
    pub reads_after_preload: Toggle,
    pub preload: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct FilesystemRules {
    pub read: Vec<PathRule>,
    pub write: Vec<PathRule>,
}

#[derive(Debug, Clone, Serialize)]
pub struct NetworkRules {
    pub mode: NetworkMode,
}

#[derive(Debug, Clone, Serialize)]
pub struct ProcessRules {
    pub threads: Toggle,
    pub subprocess: Toggle,
    pub exec: Toggle,
}

#[derive(Debug, Clone, Serialize)]
pub struct TimeRules {
    pub sleep: Toggle,
}

#[derive(Debug, Clone, Serialize)]
pub struct RandomRules {
    pub getrandom: Toggle,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct SyscallRules {
    pub allow: Vec<At<SyscallName>>,
    pub deny: Vec<At<SyscallName>>,
}

impl SyscallRules {
    pub fn allows(&self, name: &str) -> bool {
        self.allow.iter().any(|a| a.value.0 == name)
    }
    pub fn denies(&self, name: &str) -> bool {
        self.deny.iter().any(|a| a.value.0 == name)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Limits {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Dur>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<Size>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Dur>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub open_files: Option<At<u64>>,
    pub output: Size,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file_size: Option<Size>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub processes: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct EnvRules {
    pub clear: bool,
    pub keep: Vec<String>,
    pub set: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct NamespaceRules {
    pub user: bool,
    pub net: bool,
    pub pid: bool,
    pub ipc: bool,
    pub uts: bool,
    /// A mount namespace with `/proc` mounted from the guest's PID namespace.
    pub mount: bool,
}

/// Output captured when no policy in the chain sets `limits.output`.
pub const DEFAULT_OUTPUT: u64 = 16 << 20;
/// The fewest open files a policy may set (the guest needs its standard streams, the
/// protocol pipes, and room to open its own files).
pub const MIN_OPEN_FILES: u64 = 16;

impl Policy {
    fn empty(name: &str) -> Self {
        Policy {
            name: name.to_string(),
            description: String::new(),
            require: BTreeSet::new(),
            on_violation: OnViolation::Deny,
            filesystem: FilesystemRules::default(),
            network: NetworkRules {
                mode: NetworkMode::None,
            },
            process: ProcessRules {
                threads: Toggle::Deny,
                subprocess: Toggle::Deny,
                exec: Toggle::Deny,
            },
            time: TimeRules {
                sleep: Toggle::Allow,
            },
            random: RandomRules {
                getrandom: Toggle::Allow,
            },
            syscalls: SyscallRules::default(),
            limits: Limits {
                timeout: None,
                memory: None,
                cpu: None,
                open_files: None,
                output: Size(DEFAULT_OUTPUT),
                file_size: None,
                processes: None,
            },
            env: EnvRules {
                clear: true,
                keep: vec![],
                set: BTreeMap::new(),
            },
            zygote: ZygoteRules {
                reads_after_preload: Toggle::Allow,
                preload: vec![],
            },
            namespaces: NamespaceRules {
                user: true,
                net: true,
                pid: true,
                ipc: true,
                uts: true,
                mount: true,
            },
        }
    }

    /// Whether `layer` is required, `namespaces` standing for each namespace.
    pub fn requires(&self, layer: Layer) -> bool {
        self.require.contains(&layer)
            || (matches!(
                layer,
                Layer::UserNs
                    | Layer::NetNs
                    | Layer::PidNs
                    | Layer::IpcNs
                    | Layer::UtsNs
                    | Layer::MountNs
            ) && self.require.contains(&Layer::Namespaces))
    }

    /// The policy as TOML, in the file format.
    pub fn to_toml(&self) -> String {
        let mut out = format!(
            "# policy {} (resolved: extends applied, defaults filled in)\n",
            self.name
        );
        out.push_str(&toml::to_string_pretty(self).unwrap_or_else(|e| format!("# {e}\n")));
        out
    }
}

/// Where a policy text came from.
#[derive(Debug, Clone)]
enum Origin {
    Builtin(&'static str),
    File(PathBuf),
    /// A text handed to [`from_source`] under this name: no file behind it.
    Text(String),
}

impl Origin {
    fn display(&self) -> String {
        match self {
            Origin::Builtin(n) => format!("builtin:{n}"),
            Origin::File(p) => p.display().to_string(),
            Origin::Text(n) => n.clone(),
        }
    }
}

fn builtin_names() -> String {
    BUILTINS
        .iter()
        .map(|(n, _)| *n)
        .collect::<Vec<_>>()
        .join(", ")
}

fn builtin(name: &str) -> Option<(&'static str, &'static str)> {
    BUILTINS.iter().find(|(n, _)| *n == name).copied()
}

/// Whether `spec` names a file rather than a built-in.
fn looks_like_path(spec: &str) -> bool {
    spec.contains('/') || spec.ends_with(".toml")
}

/// Loads a policy by built-in name or path, resolving `extends`.
pub fn load(spec: &str) -> Result<Policy, PolicyError> {
    let origin = if looks_like_path(spec) {
        Origin::File(PathBuf::from(spec))
    } else if let Some((name, _)) = builtin(spec) {
        Origin::Builtin(name)
    } else {
        let near: Vec<&str> = BUILTINS
            .iter()
            .map(|(n, _)| *n)
            .filter(|n| strsim::jaro_winkler(spec, n) > 0.8)
            .collect();
        let hint = if near.is_empty() {
            String::new()
        } else {
            format!("; did you mean {}?", near.join(", "))
        };
        return Err(PolicyError::UnknownBuiltin {
            name: spec.to_string(),
            builtins: builtin_names(),
            hint,
        });
    };
    let mut chain = Vec::new();
    load_chain(origin, None, &mut chain)?;
    let name = match builtin(spec) {
        Some((n, _)) if !looks_like_path(spec) => n.to_string(),
        _ => spec.to_string(),
    };
    assemble(&name, &chain)
}

/// Parses a policy from `source`, called `name` in messages, without touching the file
/// system: its `extends` may name a built-in only (a path is an error). The same parsing and
/// validation as [`load`]; the fuzz targets (fuzz/) use it.
pub fn from_source(name: &str, source: &str) -> Result<Policy, PolicyError> {
    let mut chain = Vec::new();
    parse_chain(
        Origin::Text(name.to_string()),
        source.to_string(),
        None,
        &mut chain,
    )?;
    assemble(name, &chain)
}

/// The policy that `chain` (from [`load_chain`]) describes, validated.
fn assemble(
    name: &str,
    chain: &[(Origin, String, model::PolicyFile)],
) -> Result<Policy, PolicyError> {
    let mut policy = Policy::empty(name);
    // Oldest ancestor first, so that each file overrides what it extends.
    for (origin, source, file) in chain.iter().rev() {
        apply(&mut policy, &origin.display(), source, file)?;
    }
    validate(&policy)?;
    Ok(policy)
}

/// Parses one file and, recursively, what it extends. `chain` receives (origin, source, file)
/// from the requested file down to the root ancestor.
fn load_chain(
    origin: Origin,
    referenced_at: Option<Location>,
    chain: &mut Vec<(Origin, String, model::PolicyFile)>,
) -> Result<(), PolicyError> {
    let display = origin.display();
    let source = match &origin {
        Origin::Builtin(name) => builtin(name).map(|(_, t)| t.to_string()).unwrap_or_default(),
        Origin::File(path) => std::fs::read_to_string(path).map_err(|e| match &referenced_at {
            Some(at) => PolicyError::Invalid {
                at: at.clone(),
                message: format!(
                    "cannot read {}: {e}; paths in `extends` are relative to the file that has them",
                    path.display()
                ),
            },
            None => PolicyError::Unreadable {
                file: display.clone(),
                builtins: builtin_names(),
                source: e,
            },
        })?,
        Origin::Text(_) => String::new(),
    };
    parse_chain(origin, source, referenced_at, chain)
}

/// [`load_chain`] once the text of `origin` is read.
fn parse_chain(
    origin: Origin,
    source: String,
    referenced_at: Option<Location>,
    chain: &mut Vec<(Origin, String, model::PolicyFile)>,
) -> Result<(), PolicyError> {
    let display = origin.display();
    // Cycle check on a stable identity (canonical path or built-in name).
    let identity = identity(&origin);
    if let Some(pos) = chain.iter().position(|(o, _, _)| identity_eq(o, &identity)) {
        let mut names: Vec<String> = chain[pos..].iter().map(|(o, _, _)| o.display()).collect();
        names.push(display.clone());
        return Err(PolicyError::Cycle {
            at: referenced_at.unwrap_or_else(|| Location::start_of(&display)),
            chain: names.join(" -> "),
        });
    }
    if chain.len() >= MAX_EXTENDS_DEPTH {
        return Err(PolicyError::TooDeep {
            at: referenced_at.unwrap_or_else(|| Location::start_of(&display)),
            max: MAX_EXTENDS_DEPTH,
        });
    }
    let file: model::PolicyFile =
        toml::from_str(&source).map_err(|e| PolicyError::from_toml(&display, &source, &e))?;
    let extends = file.extends.clone();
    chain.push((origin.clone(), source.clone(), file));
    if let Some(ext) = extends {
        let at = Location::of_span(&display, &source, ext.span());
        let target = ext.into_inner();
        let next = if !looks_like_path(&target) {
            match builtin(&target) {
                Some((n, _)) => Origin::Builtin(n),
                None => {
                    return Err(PolicyError::Invalid {
                        at,
                        message: format!(
                            "unknown built-in {target:?}: use one of {} or a relative path ending in .toml",
                            builtin_names()
                        ),
                    });
                }
            }
        } else {
            let base = match &origin {
                Origin::File(p) => p.parent().map(Path::to_path_buf).unwrap_or_default(),
                Origin::Builtin(_) => PathBuf::from("."),
                Origin::Text(_) => {
                    return Err(PolicyError::Invalid {
                        at,
                        message: format!(
                            "a policy given as text extends a built-in only, not {target:?}"
                        ),
                    });
                }
            };
            Origin::File(base.join(&target))
        };
        load_chain(next, Some(at), chain)?;
    }
    Ok(())
}

fn identity(origin: &Origin) -> Origin {
    match origin {
        Origin::File(p) => Origin::File(std::fs::canonicalize(p).unwrap_or_else(|_| p.clone())),
        b => b.clone(),
    }
}

fn identity_eq(a: &Origin, b: &Origin) -> bool {
    match (identity(a), b) {
        (Origin::Builtin(x), Origin::Builtin(y)) => x == *y,
        (Origin::File(x), Origin::File(y)) => x == *y,
        (Origin::Text(x), Origin::Text(y)) => x == *y,
        _ => false,
    }
}

fn push_unique<T: PartialEq>(list: &mut Vec<T>, item: T) {
    if !list.contains(&item) {
        list.push(item);
    }
}

/// Parses each of `items` with `parse` and appends the located values to `list`, skipping
/// values already there. An error points at the element.
fn append_located<T: PartialEq>(
    list: &mut Vec<At<T>>,
    file: &str,
    source: &str,
    items: Option<&Vec<Spanned<String>>>,
    parse: impl Fn(&str) -> Result<T, String>,
) -> Result<(), PolicyError> {
    for s in items.into_iter().flatten() {
        let at = Location::of_span(file, source, s.span());
        let value = parse(s.get_ref()).map_err(|message| PolicyError::Invalid {
            at: at.clone(),
            message,
        })?;
        if !list.iter().any(|x| x.value == value) {
            list.push(At { value, at });
        }
    }
    Ok(())
}

/// Layers one parsed file over `p`: scalars and `require` replace, other lists append, maps
/// merge.
fn apply(
    p: &mut Policy,
    file: &str,
    source: &str,
    f: &model::PolicyFile,
) -> Result<(), PolicyError> {
    // `f` is borrowed: clone the parts we keep.
    if let Some(d) = &f.description {
        p.description = d.clone();
    }
    // `require` states this policy's whole requirement, so it replaces what it extends:
    // that is how a policy makes a layer best-effort again (and `policy show` tells).
    if let Some(layers) = &f.require {
        p.require = layers.iter().map(|l| *l.get_ref()).collect();
    }
    if let Some(v) = f.on_violation {
        p.on_violation = v;
    }
    if let Some(fs) = &f.filesystem {
        append_located(
            &mut p.filesystem.read,
            file,
            source,
            fs.read.as_ref(),
            PathTemplate::parse,
        )?;
        append_located(
            &mut p.filesystem.write,
            file,
            source,
            fs.write.as_ref(),
            PathTemplate::parse,
        )?;
    }
    if let Some(mode) = f.network.as_ref().and_then(|n| n.mode) {
        p.network.mode = mode;
    }
    if let Some(pr) = &f.process {
        if let Some(v) = pr.threads {
            p.process.threads = v;
        }
        if let Some(v) = pr.subprocess {
            p.process.subprocess = v;
        }
        if let Some(v) = pr.exec {
            p.process.exec = v;
        }
    }
    if let Some(v) = f.time.as_ref().and_then(|t| t.sleep) {
        p.time.sleep = v;
    }
    if let Some(v) = f.random.as_ref().and_then(|r| r.getrandom) {
        p.random.getrandom = v;
    }
    if let Some(sc) = &f.syscalls {
        append_located(
            &mut p.syscalls.allow,
            file,
            source,
            sc.allow.as_ref(),
            SyscallName::parse,
        )?;
        append_located(
            &mut p.syscalls.deny,
            file,
            source,
            sc.deny.as_ref(),
            SyscallName::parse,
        )?;
    }
    if let Some(l) = &f.limits {
        let t = &mut p.limits;
        t.timeout = l.timeout.or(t.timeout);
        t.memory = l.memory.or(t.memory);
        t.cpu = l.cpu.or(t.cpu);
        if let Some(n) = &l.open_files {
            t.open_files = Some(At {
                value: *n.get_ref(),
                at: Location::of_span(file, source, n.span()),
            });
        }
        t.output = l.output.unwrap_or(t.output);
        t.file_size = l.file_size.or(t.file_size);
        t.processes = l.processes.or(t.processes);
    }
    if let Some(e) = &f.env {
        if let Some(c) = e.clear {
            p.env.clear = c;
        }
        for k in e.keep.iter().flatten() {
            push_unique(&mut p.env.keep, k.clone());
        }
        for (k, v) in e.set.iter().flatten() {
            p.env.set.insert(k.clone(), v.clone());
        }
    }
    if let Some(z) = &f.zygote {
        if let Some(v) = z.reads_after_preload {
            p.zygote.reads_after_preload = v;
        }
        for m in z.preload.iter().flatten() {
            push_unique(&mut p.zygote.preload, m.clone());
        }
    }
    if let Some(n) = &f.namespaces {
        let t = &mut p.namespaces;
        t.user = n.user.unwrap_or(t.user);
        t.net = n.net.unwrap_or(t.net);
        t.pid = n.pid.unwrap_or(t.pid);
        t.ipc = n.ipc.unwrap_or(t.ipc);
        t.uts = n.uts.unwrap_or(t.uts);
        t.mount = n.mount.unwrap_or(t.mount);
    }
    Ok(())
}

/// Checks that hold whatever the run: conflicting or forbidden settings.
fn validate(p: &Policy) -> Result<(), PolicyError> {
    for At {
        value: SyscallName(name),
        at,
    } in &p.syscalls.allow
    {
        let why = if syscalls::always_denied(name) {
            Some(
                "is always denied: it could weaken or escape the sandbox (see docs/security.md)"
                    .to_string(),
            )
        } else if let Some(base) = syscalls::BASE_ALLOWLIST
            .iter()
            .find(|a| a.name == name && a.rule != syscalls::ArgRule::Any)
        {
            Some(format!(
                "is already allowed with argument checks ({}); allowing it outright would drop them",
                base.why
            ))
        } else if syscalls::PROCESS.contains(&name.as_str()) {
            Some("is governed by [process] threads/subprocess/exec; set those instead".to_string())
        } else if syscalls::NETWORK.contains(&name.as_str()) {
            Some("is governed by [network] mode; set mode = \"allow\" instead".to_string())
        } else if syscalls::SLEEP.contains(&name.as_str()) {
            Some("is governed by [time] sleep; set sleep = \"allow\" instead".to_string())
        } else if syscalls::RANDOM.contains(&name.as_str()) {
            Some("is governed by [random] getrandom; set getrandom = \"allow\" instead".to_string())
        } else if p.syscalls.denies(name) {
            Some("is in both [syscalls] allow and deny; keep it in one".to_string())
        } else {
            None
        };
        if let Some(why) = why {
            return Err(PolicyError::Invalid {
                at: at.clone(),
                message: format!("{name} {why}"),
            });
        }
    }
    if let Some(At { value: n, at }) = &p.limits.open_files
        && *n < MIN_OPEN_FILES
    {
        return Err(PolicyError::Invalid {
            at: at.clone(),
            message: format!("{n} is too low: use at least {MIN_OPEN_FILES}"),
        });
    }
    if p.random.getrandom == Toggle::Deny {
        for rule in p.filesystem.read.iter().chain(&p.filesystem.write) {
            if covers_random_device(&rule.value.0) {
                return Err(PolicyError::Invalid {
                    at: rule.at.clone(),
                    message: format!(
                        "{:?} makes /dev/urandom readable, but [random] getrandom = \"deny\"; grant single devices such as \"/dev/null\" instead",
                        rule.value.0
                    ),
                });
            }
        }
    }
    Ok(())
}

/// Whether granting `path` would make `/dev/random` or `/dev/urandom` readable.
pub fn covers_random_device(path: &str) -> bool {
    let p = path.trim_end_matches('/');
    ["", "/dev", "/dev/random", "/dev/urandom"].contains(&p)
}

/// Checks one file (and what it extends) without running anything: `wfjail policy validate`.
pub fn validate_file(path: &Path) -> Result<Policy, PolicyError> {
    let spec = path.to_string_lossy();
    if looks_like_path(&spec) {
        load(&spec)
    } else {
        load(&format!("./{spec}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_source_parses_like_load_without_files() {
        let p = from_source("t.toml", "extends = \"strict\"\non_violation = \"kill\"\n").unwrap();
        assert_eq!(p.name, "t.toml");
        assert_eq!(p.on_violation, OnViolation::Kill);
        let e = from_source("t.toml", "extends = \"./other.toml\"\n").unwrap_err();
        assert!(e.to_string().contains("built-in only"), "{e}");
        assert!(from_source("t.toml", "[limits]\nmemory = \"lots\"\n").is_err());
    }
}
