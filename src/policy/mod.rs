//! Policies: plain data read from TOML, layered with `extends`, validated, and compiled to a
//! seccomp program here in the parent. Nothing in this module touches the process it runs in.
//!
//! ```
//! let p = wfjail::policy::load("strict").unwrap();
//! assert_eq!(p.time.sleep, wfjail::policy::Toggle::Deny);
//! ```

pub mod bpf;
pub mod decisions;
mod error;
mod model;
pub mod prebuilt;
pub mod rules;
pub mod syscall_table;
pub mod syscalls;
mod values;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Serialize;
use toml::Spanned;

pub use error::{Location, PolicyError};
pub use model::{ClockMode, Layer, NetworkMode, OnViolation, RandomMode, Toggle};
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
#[derive(Debug, Clone, PartialEq)]
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
#[derive(Debug, Clone, PartialEq, Serialize)]
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

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ZygoteRules {
    pub reads_after_preload: Toggle,
    pub preload: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FilesystemRules {
    pub read: Vec<PathRule>,
    pub write: Vec<PathRule>,
    /// Directories whose entries (names) may be listed, beneath too; no file read.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub list: Vec<PathRule>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NetworkRules {
    pub mode: NetworkMode,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProcessRules {
    pub threads: Toggle,
    pub subprocess: Toggle,
    pub exec: Toggle,
    pub address_randomization: Toggle,
    /// The CPU count the guest sees, when pinned.
    pub cpu_count: Option<At<u64>>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TimeRules {
    pub sleep: Toggle,
    pub clock: ClockMode,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RandomRules {
    pub getrandom: RandomMode,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
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

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Limits {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Dur>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<Size>,
    /// CPU time of one execution (`run`), or of one call (`serve` sessions).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Dur>,
    /// CPU time of a `serve` session over its whole life (RLIMIT_CPU of its guest).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_cpu: Option<Dur>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub open_files: Option<At<u64>>,
    pub output: Size,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file_size: Option<Size>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub processes: Option<u64>,
    /// What the guest may add, in all, under its write grants (`wfjail run`, sampled).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk: Option<Size>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EnvRules {
    pub clear: bool,
    pub keep: Vec<String>,
    pub set: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct NamespaceRules {
    pub user: bool,
    pub net: bool,
    pub pid: bool,
    pub ipc: bool,
    pub uts: bool,
    /// A mount namespace with `/proc` mounted from the guest's PID namespace.
    pub mount: bool,
}

impl ClockMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ClockMode::Real => "real",
            ClockMode::Virtual => "virtual",
            ClockMode::Deny => "deny",
        }
    }
}

impl RandomMode {
    pub fn as_str(self) -> &'static str {
        match self {
            RandomMode::Allow => "allow",
            RandomMode::Deny => "deny",
            RandomMode::Seeded => "seeded",
        }
    }
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
                address_randomization: Toggle::Allow,
                cpu_count: None,
            },
            time: TimeRules {
                sleep: Toggle::Allow,
                clock: ClockMode::Real,
            },
            random: RandomRules {
                getrandom: RandomMode::Allow,
            },
            syscalls: SyscallRules::default(),
            limits: Limits {
                timeout: None,
                memory: None,
                cpu: None,
                session_cpu: None,
                open_files: None,
                output: Size(DEFAULT_OUTPUT),
                file_size: None,
                disk: None,
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
#[derive(Debug, Clone, PartialEq, Eq)]
enum Origin {
    Builtin(&'static str),
    File(PathBuf),
    /// A text handed to [`from_source`] under this name: no file behind it.
    Text(String),
}

/// Whether a path's text starts like a built-in's name in messages (`builtin:`).
trait StartsWithBuiltin {
    fn starts_with_builtin(&self) -> bool;
}

impl StartsWithBuiltin for Path {
    fn starts_with_builtin(&self) -> bool {
        self.as_os_str().as_encoded_bytes().starts_with(b"builtin:")
    }
}

impl Origin {
    fn display(&self) -> String {
        match self {
            Origin::Builtin(n) => format!("builtin:{n}"),
            // A relative path that itself starts with "builtin:" would read as a built-in.
            Origin::File(p) if p.is_relative() && p.starts_with_builtin() => {
                format!("./{}", p.display())
            }
            Origin::File(p) => p.display().to_string(),
            Origin::Text(n) => n.clone(),
        }
    }
}

/// The text of a policy file, as a [`Sources`] gives it.
#[derive(Debug, Clone)]
pub struct SourceText {
    pub text: String,
    /// Names the file whatever path reached it: two paths with the same identity are one file
    /// (the `extends` cycle check compares identities).
    pub identity: PathBuf,
}

/// Where the policy files named on the command line and in `extends` are read from. The
/// parser joins a relative `extends` onto the directory of the file that has it and asks for
/// the result; reading is all a `Sources` does, so parsing, merging and validation make no
/// I/O of their own. [`FileSystem`] is what [`load`] uses; [`InMemory`] serves tests and the
/// fuzz targets.
pub trait Sources {
    /// The text of the file at `path` (as given on the command line, or an `extends` joined
    /// onto the including file's directory) and its identity.
    fn read(&self, path: &Path) -> std::io::Result<SourceText>;
}

/// Policy files on the file system; the identity is the canonical path.
#[derive(Debug, Clone, Copy, Default)]
pub struct FileSystem;

impl Sources for FileSystem {
    fn read(&self, path: &Path) -> std::io::Result<SourceText> {
        let text = std::fs::read_to_string(path)?;
        let identity = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        Ok(SourceText { text, identity })
    }
}

/// Policy files held in memory, by path. A path is looked up after lexical normalization
/// (`.` dropped, `dir/..` removed), which is also its identity; no symlinks here.
#[derive(Debug, Clone, Default)]
pub struct InMemory {
    files: BTreeMap<PathBuf, String>,
}

impl InMemory {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) the file at `path`.
    pub fn insert(&mut self, path: impl AsRef<Path>, text: impl Into<String>) -> &mut Self {
        self.files.insert(normalize(path.as_ref()), text.into());
        self
    }
}

impl Sources for InMemory {
    fn read(&self, path: &Path) -> std::io::Result<SourceText> {
        let identity = normalize(path);
        match self.files.get(&identity) {
            Some(text) => Ok(SourceText {
                text: text.clone(),
                identity,
            }),
            None => Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no such file",
            )),
        }
    }
}

/// `path` without `.` components and with each `name/..` pair removed (a leading `..` stays).
fn normalize(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out: Vec<Component<'_>> = Vec::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => match out.last() {
                Some(Component::Normal(_)) => {
                    out.pop();
                }
                Some(Component::RootDir | Component::Prefix(_)) => {}
                _ => out.push(c),
            },
            _ => out.push(c),
        }
    }
    out.iter().collect()
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

/// Loads a policy by built-in name or path, resolving `extends`, files read from the file
/// system.
pub fn load(spec: &str) -> Result<Policy, PolicyError> {
    load_from(spec, &FileSystem)
}

/// [`load`] with the files read from `sources`.
pub fn load_from(spec: &str, sources: &dyn Sources) -> Result<Policy, PolicyError> {
    // A built-in on its own: built from Rust generated from its file (`prebuilt`), the
    // same policy without parsing it again.
    if !looks_like_path(spec)
        && let Some(p) = prebuilt::get(spec)
    {
        return Ok(p);
    }
    load_parsed_from(spec, sources)
}

/// A built-in parsed from its TOML (what `prebuilt` is generated from and checked against).
#[cfg(test)]
fn load_parsed(name: &str) -> Result<Policy, PolicyError> {
    load_parsed_from(name, &FileSystem)
}

/// [`load_from`], always parsing.
fn load_parsed_from(spec: &str, sources: &dyn Sources) -> Result<Policy, PolicyError> {
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
    load_chain(origin, None, sources, &mut chain)?;
    let name = match builtin(spec) {
        Some((n, _)) if !looks_like_path(spec) => n.to_string(),
        _ => spec.to_string(),
    };
    assemble(&name, &chain)
}

/// Parses a policy from `source`, called `name` in messages, without touching the file
/// system: its `extends` may name a built-in only (a path is an error). The same parsing and
/// validation as [`load`]; the fuzz targets (fuzz/) use it. For `extends` of files, use
/// [`load_from`] with [`InMemory`] sources.
pub fn from_source(name: &str, source: &str) -> Result<Policy, PolicyError> {
    let mut chain = Vec::new();
    let origin = Origin::Text(name.to_string());
    let link = Link {
        identity: origin.clone(),
        origin,
        source: source.to_string(),
    };
    // No file is ever asked for: a text's path `extends` is refused before reading.
    parse_chain(link, None, &InMemory::new(), &mut chain)?;
    assemble(name, &chain)
}

/// One policy text of an `extends` chain, before parsing.
struct Link {
    origin: Origin,
    /// What the cycle check compares: the built-in, the file's [`SourceText::identity`], or
    /// the text's name.
    identity: Origin,
    source: String,
}

/// A parsed link of an `extends` chain.
type Parsed = (Link, model::PolicyFile);

/// The policy that `chain` (from [`load_chain`]) describes, validated.
fn assemble(name: &str, chain: &[Parsed]) -> Result<Policy, PolicyError> {
    let mut policy = Policy::empty(name);
    // Oldest ancestor first, so that each file overrides what it extends.
    for (link, file) in chain.iter().rev() {
        apply(&mut policy, &link.origin.display(), &link.source, file)?;
    }
    validate(&policy)?;
    Ok(policy)
}

/// Reads one file from `sources` and parses it and, recursively, what it extends. `chain`
/// receives the links from the requested file down to the root ancestor.
fn load_chain(
    origin: Origin,
    referenced_at: Option<Location>,
    sources: &dyn Sources,
    chain: &mut Vec<Parsed>,
) -> Result<(), PolicyError> {
    let link = match &origin {
        Origin::Builtin(name) => Link {
            source: builtin(name)
                .map(|(_, t)| t.to_string())
                .unwrap_or_default(),
            identity: origin.clone(),
            origin,
        },
        Origin::File(path) => {
            let read = sources.read(path).map_err(|e| match &referenced_at {
                Some(at) => PolicyError::Invalid {
                    at: at.clone(),
                    message: format!(
                        "cannot read {}: {e}; paths in `extends` are relative to the file that has them",
                        path.display()
                    ),
                },
                None => PolicyError::Unreadable {
                    file: origin.display(),
                    builtins: builtin_names(),
                    source: e,
                },
            })?;
            Link {
                identity: Origin::File(read.identity),
                source: read.text,
                origin,
            }
        }
        Origin::Text(_) => Link {
            identity: origin.clone(),
            origin,
            source: String::new(),
        },
    };
    parse_chain(link, referenced_at, sources, chain)
}

/// [`load_chain`] once the text of the link is read.
fn parse_chain(
    link: Link,
    referenced_at: Option<Location>,
    sources: &dyn Sources,
    chain: &mut Vec<Parsed>,
) -> Result<(), PolicyError> {
    let display = link.origin.display();
    if let Some(pos) = chain.iter().position(|(l, _)| l.identity == link.identity) {
        let mut names: Vec<String> = chain[pos..]
            .iter()
            .map(|(l, _)| l.origin.display())
            .collect();
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
    let file: model::PolicyFile = toml::from_str(&link.source)
        .map_err(|e| PolicyError::from_toml(&display, &link.source, &e))?;
    let extends = file.extends.clone();
    let at_of = |span| Location::of_span(&display, &link.source, span);
    let next = match extends {
        None => None,
        Some(ext) => {
            let at = at_of(ext.span());
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
                let base = match &link.origin {
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
            Some((next, at))
        }
    };
    chain.push((link, file));
    if let Some((next, at)) = next {
        load_chain(next, Some(at), sources, chain)?;
    }
    Ok(())
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
        // What this policy takes away from what it extends, before it adds its own.
        for d in fs.drop.iter().flatten() {
            let at = Location::of_span(file, source, d.span());
            let path =
                PathTemplate::parse(d.get_ref()).map_err(|message| PolicyError::Invalid {
                    at: at.clone(),
                    message,
                })?;
            let fsr = &mut p.filesystem;
            let before = fsr.read.len() + fsr.write.len() + fsr.list.len();
            fsr.read.retain(|r| r.value != path);
            fsr.write.retain(|r| r.value != path);
            fsr.list.retain(|r| r.value != path);
            if fsr.read.len() + fsr.write.len() + fsr.list.len() == before {
                let granted: Vec<String> = p
                    .filesystem
                    .read
                    .iter()
                    .chain(&p.filesystem.write)
                    .chain(&p.filesystem.list)
                    .map(|r| format!("{:?}", r.value.0))
                    .collect();
                return Err(PolicyError::Invalid {
                    at,
                    message: format!(
                        "drop {:?} takes nothing away: the policies this one extends do not grant it as written (they grant {})",
                        path.0,
                        if granted.is_empty() {
                            "nothing".to_string()
                        } else {
                            granted.join(", ")
                        }
                    ),
                });
            }
        }
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
        append_located(
            &mut p.filesystem.list,
            file,
            source,
            fs.list.as_ref(),
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
        if let Some(v) = pr.address_randomization {
            p.process.address_randomization = v;
        }
        if let Some(n) = &pr.cpu_count {
            p.process.cpu_count = Some(At {
                value: *n.get_ref(),
                at: Location::of_span(file, source, n.span()),
            });
        }
    }
    if let Some(v) = f.time.as_ref().and_then(|t| t.sleep) {
        p.time.sleep = v;
    }
    if let Some(v) = f.time.as_ref().and_then(|t| t.clock) {
        p.time.clock = v;
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
        t.session_cpu = l.session_cpu.or(t.session_cpu);
        if let Some(n) = &l.open_files {
            t.open_files = Some(At {
                value: *n.get_ref(),
                at: Location::of_span(file, source, n.span()),
            });
        }
        t.output = l.output.unwrap_or(t.output);
        t.file_size = l.file_size.or(t.file_size);
        t.processes = l.processes.or(t.processes);
        t.disk = l.disk.or(t.disk);
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
    if let Some(At { value: n, at }) = &p.process.cpu_count
        && !(1..=1024).contains(n)
    {
        return Err(PolicyError::Invalid {
            at: at.clone(),
            message: format!("{n} CPUs: use 1 to 1024"),
        });
    }
    if let Some(At { value: n, at }) = &p.limits.open_files
        && *n < MIN_OPEN_FILES
    {
        return Err(PolicyError::Invalid {
            at: at.clone(),
            message: format!("{n} is too low: use at least {MIN_OPEN_FILES}"),
        });
    }
    // Under `warn` nothing is enforced, randomness included: a grant of /dev/urandom only
    // means reads of it are not reported.
    if p.random.getrandom != RandomMode::Allow && p.on_violation != OnViolation::Warn {
        for rule in p.filesystem.read.iter().chain(&p.filesystem.write) {
            if covers_random_device(&rule.value.0) {
                return Err(PolicyError::Invalid {
                    at: rule.at.clone(),
                    message: format!(
                        "{:?} makes /dev/urandom readable, but [random] getrandom = \"{}\"; grant single devices such as \"/dev/null\" instead",
                        rule.value.0,
                        p.random.getrandom.as_str()
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

/// At most this many errors are reported for one file by [`validate_file`].
pub const MAX_ERRORS_PER_FILE: usize = 20;

/// Checks one file (and what it extends) without running anything: `wfjail policy validate`.
/// Reports every error in the file, not only the first: each error's line is blanked (a
/// table header's whole table) and the file is checked again, until it loads or an error is
/// not in this file, repeats, or is about `extends`, or blanking would break the TOML.
pub fn validate_file(path: &Path) -> Result<Policy, Vec<PolicyError>> {
    validate_file_from(path, &FileSystem)
}

/// [`validate_file`] with the files read from `sources`.
pub fn validate_file_from(path: &Path, sources: &dyn Sources) -> Result<Policy, Vec<PolicyError>> {
    let spec = path.to_string_lossy();
    let spec = if looks_like_path(&spec) {
        spec.into_owned()
    } else {
        format!("./{spec}")
    };
    let first = match load_from(&spec, sources) {
        Ok(p) => return Ok(p),
        Err(e) => e,
    };
    let target = PathBuf::from(&spec);
    let display = Origin::File(target.clone()).display();
    let Ok(original) = sources.read(&target) else {
        return Err(vec![first]);
    };
    let mut text = original.text.clone();
    let mut errors = vec![first];
    while errors.len() < MAX_ERRORS_PER_FILE {
        let last = errors.last().expect("one error at least");
        let Some(at) = last.location() else { break };
        let about_extends = at.field.as_deref() == Some("extends")
            || matches!(
                last,
                PolicyError::Cycle { .. } | PolicyError::TooDeep { .. }
            );
        if at.file != display || about_extends {
            break;
        }
        let masked = blank_line(&text, at.line);
        if masked == text || masked.parse::<toml::Table>().is_err() {
            break;
        }
        text = masked;
        let overlay = Overlay {
            path: &target,
            text: SourceText {
                text: text.clone(),
                identity: original.identity.clone(),
            },
            inner: sources,
        };
        match load_from(&spec, &overlay) {
            Ok(_) => break,
            Err(e) => {
                let seen = errors.iter().any(|x| {
                    x.location().map(|l| (l.line, l.column))
                        == e.location().map(|l| (l.line, l.column))
                });
                if seen {
                    break;
                }
                errors.push(e);
            }
        }
    }
    // In the file's order (the checks find them in the order of the policy's sections).
    errors.sort_by_key(|e| e.location().map(|l| (l.line, l.column)));
    Err(errors)
}

/// `text` with line `line` (1-based) emptied, keeping every other line where it was; a
/// table header takes its table's lines along (its keys would otherwise land in the table
/// before it).
fn blank_line(text: &str, line: usize) -> String {
    let is_header = |l: &str| l.trim_start().starts_with('[');
    let mut out = String::with_capacity(text.len());
    let mut blanking_table = false;
    for (i, l) in text.split_inclusive('\n').enumerate() {
        let n = i + 1;
        if n == line {
            blanking_table = is_header(l);
        } else if n > line && blanking_table && is_header(l) {
            blanking_table = false;
        }
        let blank = n == line || (blanking_table && n > line);
        if blank {
            if l.ends_with('\n') {
                out.push('\n');
            }
        } else {
            out.push_str(l);
        }
    }
    out
}

/// One file's text replaced, the others read from `inner` (for [`validate_file_from`]).
struct Overlay<'a> {
    path: &'a Path,
    text: SourceText,
    inner: &'a dyn Sources,
}

impl Sources for Overlay<'_> {
    fn read(&self, path: &Path) -> std::io::Result<SourceText> {
        if path == self.path {
            Ok(SourceText {
                text: self.text.text.clone(),
                identity: self.text.identity.clone(),
            })
        } else {
            self.inner.read(path)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_reports_every_error_in_a_file() {
        let mut files = InMemory::new();
        files.insert(
            "p.toml",
            "extends = \"default\"\n\
             on_violation = \"explode\"\n\
             [limits]\n\
             timeout = \"30 sec\"\n\
             memory = \"1GiB\"\n\
             [filesytem]\n\
             read = [\"/x\"]\n\
             [syscalls]\n\
             deny = [\"opneat\"]\n",
        );
        let errors = validate_file_from(Path::new("p.toml"), &files).unwrap_err();
        let lines: Vec<usize> = errors.iter().map(|e| e.location().unwrap().line).collect();
        assert_eq!(lines, vec![2, 4, 6, 9], "{errors:#?}");
        assert!(errors[3].to_string().contains("openat"), "{}", errors[3]);
        // A valid file: Ok; an error in `extends` stops there.
        files.insert("ok.toml", "extends = \"strict\"\n");
        assert!(validate_file_from(Path::new("ok.toml"), &files).is_ok());
        // An error in `extends` is the last one looked for (without the base, later errors
        // could be artefacts); those found before it stay.
        files.insert(
            "ext.toml",
            "extends = \"nope\"\n[limits]\ntimeout = \"x\"\n[x]\n",
        );
        let errors = validate_file_from(Path::new("ext.toml"), &files).unwrap_err();
        let lines: Vec<usize> = errors.iter().map(|e| e.location().unwrap().line).collect();
        assert_eq!(lines, vec![1, 3, 4], "{errors:#?}");
    }

    #[test]
    fn blanking_a_header_takes_its_table_along() {
        let t = "a = 1\n[x]\nb = 2\n[y]\nc = 3\n";
        assert_eq!(blank_line(t, 2), "a = 1\n\n\n[y]\nc = 3\n");
        assert_eq!(blank_line(t, 5), "a = 1\n[x]\nb = 2\n[y]\n\n");
    }

    #[test]
    fn from_source_parses_like_load_without_files() {
        let p = from_source("t.toml", "extends = \"strict\"\non_violation = \"kill\"\n").unwrap();
        assert_eq!(p.name, "t.toml");
        assert_eq!(p.on_violation, OnViolation::Kill);
        let e = from_source("t.toml", "extends = \"./other.toml\"\n").unwrap_err();
        assert!(e.to_string().contains("built-in only"), "{e}");
        assert!(from_source("t.toml", "[limits]\nmemory = \"lots\"\n").is_err());
    }

    /// `files` as in-memory sources.
    fn sources(files: &[(&str, &str)]) -> InMemory {
        let mut s = InMemory::new();
        for (path, text) in files {
            s.insert(path, *text);
        }
        s
    }

    #[test]
    fn relative_extends_resolve_against_the_including_file() {
        let s = sources(&[
            (
                "dir/a.toml",
                "extends = \"sub/b.toml\"\n[limits]\ntimeout = \"5s\"\n",
            ),
            (
                "dir/sub/b.toml",
                "extends = \"../c.toml\"\n[filesystem]\nread = [\"/b\"]\n",
            ),
            (
                "dir/c.toml",
                "extends = \"strict\"\n[filesystem]\nread = [\"/c\"]\n[limits]\ntimeout = \"9s\"\n",
            ),
        ]);
        let p = load_from("dir/a.toml", &s).unwrap();
        assert_eq!(p.name, "dir/a.toml");
        assert_eq!(p.limits.timeout, Some(Dur::parse("5s").unwrap()));
        assert_eq!(
            p.time.sleep,
            Toggle::Deny,
            "strict, at the root of the chain"
        );
        let read: Vec<(String, String)> = p
            .filesystem
            .read
            .iter()
            .map(|r| (r.value.0.clone(), r.at.to_string()))
            .collect();
        assert!(
            read.contains(&("/c".into(), "dir/sub/../c.toml:3:9".into()))
                && read.contains(&("/b".into(), "dir/sub/b.toml:3:9".into())),
            "{read:?}"
        );
    }

    #[test]
    fn an_extends_cycle_names_the_chain_and_the_closing_line() {
        let s = sources(&[
            ("a.toml", "extends = \"b.toml\"\n"),
            ("b.toml", "description = \"b\"\nextends = \"a.toml\"\n"),
        ]);
        let e = load_from("a.toml", &s).unwrap_err();
        assert_eq!(
            e.to_string(),
            "b.toml:2:11: extends: cycle a.toml -> b.toml -> a.toml; remove one of these `extends`"
        );
        // The same file under another spelling is the same file.
        let s = sources(&[
            ("p/a.toml", "extends = \"../p/./b.toml\"\n"),
            ("p/b.toml", "extends = \"a.toml\"\n"),
        ]);
        let e = load_from("./p/a.toml", &s).unwrap_err();
        assert!(matches!(e, PolicyError::Cycle { .. }), "{e}");
        assert!(
            e.to_string()
                .starts_with("./p/../p/./b.toml:1:11: extends: cycle ./p/a.toml -> "),
            "{e}"
        );
    }

    #[test]
    fn extends_nest_at_most_max_extends_depth() {
        let names: Vec<String> = (0..=12).map(|i| format!("p{i}.toml")).collect();
        let texts: Vec<String> = (0..=12)
            .map(|i| match i {
                12 => "description = \"end\"\n".to_string(),
                _ => format!("extends = \"p{}.toml\"\n", i + 1),
            })
            .collect();
        let files: Vec<(&str, &str)> = names
            .iter()
            .zip(&texts)
            .map(|(n, t)| (n.as_str(), t.as_str()))
            .collect();
        let e = load_from("p0.toml", &sources(&files)).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "p{}.toml:1:11: extends: more than {MAX_EXTENDS_DEPTH} levels of `extends`; flatten the chain",
                MAX_EXTENDS_DEPTH - 1
            )
        );
        // The deepest chain allowed loads.
        let from = format!("p{}.toml", 13 - MAX_EXTENDS_DEPTH);
        assert_eq!(
            load_from(&from, &sources(&files)).unwrap().description,
            "end"
        );
    }

    #[test]
    fn a_missing_extends_names_the_referencing_line() {
        let s = sources(&[("d/p.toml", "description = \"x\"\nextends = \"nope.toml\"\n")]);
        let e = load_from("d/p.toml", &s).unwrap_err();
        assert_eq!(
            e.to_string(),
            "d/p.toml:2:11: extends: cannot read d/nope.toml: no such file; paths in `extends` are relative to the file that has them"
        );
        // The file named on the command line: no line to point at.
        let e = load_from("d/q.toml", &s).unwrap_err();
        assert!(matches!(e, PolicyError::Unreadable { .. }), "{e}");
        assert!(e.to_string().starts_with("d/q.toml: no such file; "), "{e}");
    }

    #[test]
    fn a_file_extends_a_builtin() {
        let s = sources(&[
            (
                "p.toml",
                // Enforcing: randomness must then be allowed, or "/" would be refused for
                // making /dev/urandom readable (permissive only reports it).
                "extends = \"permissive\"\non_violation = \"deny\"\n[random]\ngetrandom = \"allow\"\n",
            ),
            ("typo.toml", "\nextends = \"stirct\"\n"),
        ]);
        let p = load_from("p.toml", &s).unwrap();
        let permissive = load("permissive").unwrap();
        assert_eq!(p.on_violation, OnViolation::Deny);
        assert_eq!(p.namespaces.net, permissive.namespaces.net);
        assert_eq!(p.process.threads, permissive.process.threads);
        let e = load_from("typo.toml", &s).unwrap_err();
        assert!(
            e.to_string().starts_with(
                "typo.toml:2:11: extends: unknown built-in \"stirct\": use one of default, "
            ),
            "{e}"
        );
        // A built-in name is a built-in even when the sources hold a file of that name.
        let s = sources(&[("strict", "description = \"not the built-in\"\n")]);
        assert_eq!(load_from("strict", &s).unwrap().name, "strict");
        assert_ne!(
            load_from("strict", &s).unwrap().description,
            "not the built-in"
        );
    }

    #[test]
    fn in_memory_paths_are_normalized_lexically() {
        for (a, b) in [
            ("./a/b.toml", "a/b.toml"),
            ("a/../b.toml", "b.toml"),
            ("../x.toml", "../x.toml"),
            ("/../x.toml", "/x.toml"),
            ("a/./../../b.toml", "../b.toml"),
        ] {
            assert_eq!(normalize(Path::new(a)), PathBuf::from(b), "{a}");
        }
    }
}
