//! The policy file as written: every field optional, so that `extends` can layer files.
//! `deny_unknown_fields` everywhere: a typo is an error, never a silently ignored rule.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use toml::Spanned;

use super::values::{Dur, Size};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyFile {
    /// A built-in name or a path relative to this file.
    pub extends: Option<Spanned<String>>,
    pub description: Option<String>,
    /// Layers that must be enforced; the run fails with 125 if one cannot be.
    pub require: Option<Vec<Spanned<Layer>>>,
    pub on_violation: Option<OnViolation>,
    pub filesystem: Option<Filesystem>,
    pub network: Option<Network>,
    pub process: Option<Process>,
    pub time: Option<Time>,
    pub random: Option<Random>,
    pub syscalls: Option<Syscalls>,
    pub limits: Option<Limits>,
    pub env: Option<Env>,
    pub namespaces: Option<Namespaces>,
    pub zygote: Option<Zygote>,
}

/// A confinement layer that a policy can `require` and that a report lists as `degraded`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Layer {
    /// Landlock filesystem rules.
    Landlock,
    /// Landlock TCP bind/connect rules (ABI >= 4).
    LandlockNet,
    /// Landlock abstract-unix-socket and signal scoping (ABI >= 6).
    LandlockScope,
    /// The seccomp-bpf allowlist.
    Seccomp,
    /// Seccomp user notification: violations named with their arguments.
    SeccompNotify,
    /// All six namespaces below.
    Namespaces,
    UserNs,
    NetNs,
    PidNs,
    IpcNs,
    UtsNs,
    /// A mount namespace with a `/proc` of the guest's own PID namespace.
    MountNs,
    /// Every capability dropped, bounding set included.
    Capabilities,
    NoNewPrivs,
    /// The guest's address space laid out without randomisation
    /// (`[process] address_randomization = "deny"`): a container's default seccomp profile
    /// refuses the `personality` call that asks for it.
    AddressLayout,
}

impl Layer {
    pub const ALL: [Layer; 15] = [
        Layer::Landlock,
        Layer::LandlockNet,
        Layer::LandlockScope,
        Layer::Seccomp,
        Layer::SeccompNotify,
        Layer::Namespaces,
        Layer::UserNs,
        Layer::NetNs,
        Layer::PidNs,
        Layer::IpcNs,
        Layer::UtsNs,
        Layer::MountNs,
        Layer::Capabilities,
        Layer::NoNewPrivs,
        Layer::AddressLayout,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Layer::Landlock => "landlock",
            Layer::LandlockNet => "landlock-net",
            Layer::LandlockScope => "landlock-scope",
            Layer::Seccomp => "seccomp",
            Layer::SeccompNotify => "seccomp-notify",
            Layer::Namespaces => "namespaces",
            Layer::UserNs => "user-ns",
            Layer::NetNs => "net-ns",
            Layer::PidNs => "pid-ns",
            Layer::IpcNs => "ipc-ns",
            Layer::UtsNs => "uts-ns",
            Layer::MountNs => "mount-ns",
            Layer::Capabilities => "capabilities",
            Layer::NoNewPrivs => "no-new-privs",
            Layer::AddressLayout => "address-layout",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnViolation {
    /// The call fails with EPERM; the run's status is `violation`.
    Deny,
    /// The execution is killed at once; the run's status is `violation`.
    Kill,
    /// The call proceeds; the violation is listed and the status stays `ok`.
    Warn,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Toggle {
    Allow,
    Deny,
}

/// `[time] clock`: what the guest's wall clock (`CLOCK_REALTIME` and its kin, `gettimeofday`,
/// `time`) reads. Under `virtual` the monotonic clocks read a virtual clock too
/// (`answers/monotonic.rs`); the CPU-time clocks are always real.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ClockMode {
    /// The host's clock.
    Real,
    /// The execution's workflow time, set by the caller (`wfjail run --clock`, per call on
    /// the worker wire), answered by the supervisor: the same in every execution.
    Virtual,
    /// A reported violation (breaks `import logging`, hence asyncio).
    Deny,
}

/// `[random] getrandom`: where the guest's randomness comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RandomMode {
    /// The kernel's entropy.
    Allow,
    /// A reported violation (glibc's malloc key excepted).
    Deny,
    /// Answered by the supervisor from a generator keyed by the execution's seed: the same
    /// bytes in every execution with the same seed. Never for cryptography.
    Seeded,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    /// No sockets at all (AF_UNIX stream pairs excepted).
    None,
    /// Sockets allowed (the learning mode; pair with `[namespaces] net = false` to reach hosts).
    Allow,
}

// Paths and syscall names are parsed after deserialization (see `policy::apply`), so that an
// error points at the element, not at the array that holds it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Filesystem {
    /// Read and execute.
    pub read: Option<Vec<Spanned<String>>>,
    /// Read, write, create, remove.
    pub write: Option<Vec<Spanned<String>>>,
    /// List: open the directories beneath and read their entries (names), no file's
    /// contents (Landlock's `READ_DIR` alone).
    pub list: Option<Vec<Spanned<String>>>,
    /// Grants of the policies this one extends that it takes away (read or write), as they
    /// are written there.
    pub drop: Option<Vec<Spanned<String>>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Network {
    pub mode: Option<NetworkMode>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Process {
    pub threads: Option<Toggle>,
    pub subprocess: Option<Toggle>,
    /// After the guest has started (the initial exec is always allowed).
    pub exec: Option<Toggle>,
    /// `deny`: the guest's address space is laid out the same way in every execution
    /// (`personality(ADDR_NO_RANDOMIZE)` before its exec), so Python's `id()` and object
    /// reprs do not vary between runs, zygote restarts and machines.
    pub address_randomization: Option<Toggle>,
    /// The CPU count the guest sees (`sched_getaffinity`, hence `os.cpu_count()`), whatever
    /// the host has: 1 to 1024. Unset: the host's.
    pub cpu_count: Option<Spanned<u64>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Time {
    pub sleep: Option<Toggle>,
    pub clock: Option<ClockMode>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Random {
    pub getrandom: Option<RandomMode>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Syscalls {
    pub allow: Option<Vec<Spanned<String>>>,
    pub deny: Option<Vec<Spanned<String>>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    pub timeout: Option<Dur>,
    pub memory: Option<Size>,
    pub cpu: Option<Dur>,
    pub session_cpu: Option<Dur>,
    pub open_files: Option<Spanned<u64>>,
    pub output: Option<Size>,
    pub file_size: Option<Size>,
    pub processes: Option<u64>,
    pub disk: Option<Size>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Env {
    pub clear: Option<bool>,
    pub keep: Option<Vec<String>>,
    pub set: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Namespaces {
    pub user: Option<bool>,
    pub net: Option<bool>,
    pub pid: Option<bool>,
    pub ipc: Option<bool>,
    pub uts: Option<bool>,
    /// A private `/proc` (needs `pid`): host processes are invisible, not even `stat`-able.
    pub mount: Option<bool>,
}

/// Settings that apply in prefork mode (`wfjail serve --zygote`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Zygote {
    /// `deny`: once the zygote has preloaded, a session child may not open files: a late
    /// import is a reported `filesystem` violation.
    pub reads_after_preload: Option<Toggle>,
    /// Modules the zygote imports before any fork (added to `wfjail serve --preload`).
    pub preload: Option<Vec<String>>,
}
