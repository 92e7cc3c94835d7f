//! The one report assembler: the facts of how a guest ended, judged by
//! [`verdict::classify`], and what the report states beside the verdict (the layers applied,
//! the violations, the guest's resource use) into one [`Report`]. `wfjail run` gives it the
//! [`Outcome`] of its supervisor ([`from_outcome`]); a `serve` session its own facts
//! ([`report`]). Also here: the layers as applied ([`layers`]), and what a guest's end is
//! judged against besides the policy ([`Applied`]).

use std::path::PathBuf;
use std::time::Duration;

use nix::errno::Errno;

use crate::plan::Plan;
use crate::policy::Layer;
use crate::policy::syscalls::Category;
use crate::process::{Spawned, channel::Step};
use crate::report::{Action, GuestError, Layers, Learned, Report, Violation, signal_name};

use super::Outcome;
use super::verdict::{self, Ending, Facts, SetupFailed};

/// What is known of the layers at spawn time.
pub struct LayersBase {
    user_ns: bool,
    pid_ns: bool,
    clone_degraded: Vec<(Layer, Errno)>,
    /// `limits.processes` through a pids cgroup, when only that can bind it: whether it
    /// does, or why not (`process::pids_cgroup::apply`).
    pub nproc_bound: Option<Result<(), String>>,
}

impl LayersBase {
    pub fn of(s: &Spawned) -> Self {
        LayersBase {
            user_ns: s.user_ns,
            pid_ns: s.pid_ns,
            clone_degraded: s.clone_degraded.clone(),
            nproc_bound: None,
        }
    }
}

fn step_layer(step: Step) -> &'static str {
    match step {
        Step::NetNs => "net-ns",
        Step::IpcNs => "ipc-ns",
        Step::UtsNs => "uts-ns",
        Step::MountNs => "mount-ns",
        Step::Hostname => "hostname",
        Step::CapabilityBounding => "capabilities",
        Step::NoNewPrivs => "no-new-privs",
        Step::Landlock => "landlock",
        Step::Seccomp => "seccomp",
        Step::SeccompNotify => "seccomp-notify",
        Step::IdMaps => "user-ns",
        Step::Personality => "address-layout",
        _ => "setup",
    }
}

/// What would enable a degraded layer.
fn enable_hint(layer: &str) -> &'static str {
    match layer {
        "user-ns" | "pid-ns" | "net-ns" | "ipc-ns" | "uts-ns" => {
            "namespaces are refused here (container seccomp profile or sysctl); see `wfjail check`"
        }
        "mount-ns" => {
            "host pids stay visible in /proc: a private /proc needs the PID namespace, and in a user namespace an unmasked /proc (a container that masks /proc paths refuses it); see `wfjail check`"
        }
        "hostname" => {
            "the container's seccomp profile refuses sethostname (podman's default does): the guest's UTS namespace keeps the container's hostname; see `wfjail check`"
        }
        "seccomp-notify" => "needs Linux >= 5.0 and a runtime that allows the seccomp listener",
        "capabilities" => {
            "the bounding set needs CAP_SETPCAP (a user namespace gives it); harmless under no_new_privs"
        }
        "address-layout" => {
            "the container's seccomp profile refuses personality(ADDR_NO_RANDOMIZE) (podman's and Docker's defaults do): the guest's addresses are randomised, so id() and default object reprs may differ between runs and on replay, and a workflow that lets them reach its commands fails replay; allow personality(0x40000) in the profile (docs/containers.md has one) or add \"address-layout\" to the policy's require to refuse to run without it; see `wfjail check`"
        }
        _ => "see `wfjail check`",
    }
}

/// The layers actually applied, from the plan, the spawn and the child's records.
pub fn layers(
    plan: &Plan,
    base: &LayersBase,
    degraded_steps: &[(Step, Errno)],
    notify: bool,
) -> Layers {
    let degraded_step = |s: Step| degraded_steps.iter().any(|(d, _)| *d == s);
    let mut degraded: Vec<String> = Vec::new();
    for (layer, errno) in &base.clone_degraded {
        if *layer == Layer::MountNs && !plan.namespaces.pid {
            degraded.push(
                "mount-ns: a private /proc needs namespaces.pid = true; host pids stay visible"
                    .into(),
            );
            continue;
        }
        degraded.push(format!(
            "{}: {} ({})",
            layer.as_str(),
            errno.desc(),
            enable_hint(layer.as_str())
        ));
    }
    for (step, errno) in degraded_steps {
        let l = step_layer(*step);
        degraded.push(format!("{l}: {} ({})", errno.desc(), enable_hint(l)));
    }
    let landlock = match &plan.landlock {
        Some((_, info)) if !degraded_step(Step::Landlock) => {
            if !info.tcp && plan.network == crate::policy::NetworkMode::None && info.abi < 4 {
                degraded.push(format!("landlock-net: Landlock ABI {} < 4 (Linux >= 6.7); seccomp still denies sockets", info.abi));
            }
            if !info.scoped {
                degraded.push(format!(
                    "landlock-scope: Landlock ABI {} < 6 (Linux >= 6.12)",
                    info.abi
                ));
            }
            format!("abi-{}", info.abi)
        }
        _ => {
            if let Some(why) = &plan.landlock_missing {
                degraded.push(format!("landlock: {why}"));
            }
            "none".into()
        }
    };
    if let Some(Err(why)) = &base.nproc_bound {
        // The guest's uid maps to host root, which the kernel exempts from RLIMIT_NPROC, and
        // no pids cgroup could bound it: with fork or threads allowed, nothing bounds its
        // processes. Say so instead of pretending.
        degraded.push(format!(
            "rlimit-nproc: limits.processes does not bind a guest that runs as host root (the kernel exempts uid 0), and no pids cgroup could bound it here ({why}); \
             run wfjail as an unprivileged user, or keep process.subprocess and process.threads denied"
        ));
    }
    if !notify {
        degraded.extend(plan.rules.without_listener.iter().map(|&d| d.to_string()));
    }
    // Calls an outer (container) filter answers before wfjail's: never reported.
    let unseen = crate::sys::refused_by_outer_filter();
    if !unseen.is_empty() {
        degraded.push(format!(
            "container-seccomp: this container's seccomp profile refuses {} itself, before \
             wfjail's filter: a guest's call fails with an errno but no violation is reported \
             (see `wfjail check`)",
            unseen.join(", ")
        ));
    }
    let seccomp = if notify {
        "user-notify"
    } else if degraded_step(Step::Seccomp) {
        "none"
    } else {
        "filter"
    };
    // Made by clone (user, pid) or by unshare in the child (net, ipc, uts, mount), in report
    // order.
    let ns = plan.namespaces;
    let made = |want: bool, step: Step| want && !degraded_step(step);
    let namespaces: Vec<&str> = [
        (base.user_ns, "user"),
        (made(ns.net, Step::NetNs), "net"),
        (base.pid_ns, "pid"),
        (made(ns.ipc, Step::IpcNs), "ipc"),
        (made(ns.uts, Step::UtsNs), "uts"),
        (made(ns.mount && base.pid_ns, Step::MountNs), "mount"),
    ]
    .into_iter()
    .filter_map(|(on, name)| on.then_some(name))
    .collect();
    let capabilities = if degraded_step(Step::CapabilityBounding) {
        "bounding set kept; effective, permitted, inheritable and ambient empty".into()
    } else {
        "none".into()
    };
    let landlock_abi = match &plan.landlock {
        Some((_, info)) if landlock != "none" => Some(crate::report::LandlockAbi {
            kernel: info.kernel_abi,
            enforced: info.abi,
        }),
        _ => None,
    };
    Layers {
        landlock,
        landlock_abi,
        seccomp: seccomp.into(),
        namespaces,
        capabilities,
        no_new_privs: !degraded_step(Step::NoNewPrivs),
        degraded,
    }
}

/// What a report states beside the verdict: what ran, under what, and what it used.
#[derive(Debug, Default)]
pub struct Account {
    pub policy: String,
    pub command: Vec<String>,
    pub layers: Layers,
    pub violations: Vec<Violation>,
    pub duration: Duration,
    pub max_rss_kb: u64,
    /// The last bytes of the guest's stderr (`wfjail run`; a session echoes it live).
    pub stderr_tail: Vec<u8>,
    pub guest_error: Option<GuestError>,
    pub seed: Option<u64>,
    /// The workflow time the guest's wall clock read, in nanoseconds since the epoch.
    pub clock: Option<i64>,
    pub skipped_paths: Vec<String>,
    pub learned: Option<Learned>,
}

/// The report of one guest: `facts` judged by [`verdict::classify`] (the exit code, signal
/// and CPU time read from them too), with `account` beside.
pub fn report(facts: &Facts, account: Account) -> Report {
    let v = verdict::classify(facts);
    let status_word = facts.wait_status;
    Report {
        status: v.status,
        exit_code: status_word
            .filter(|&st| libc::WIFEXITED(st))
            .map(|st| libc::WEXITSTATUS(st)),
        signal: status_word
            .filter(|&st| libc::WIFSIGNALED(st))
            .map(|st| signal_name(libc::WTERMSIG(st))),
        violations: account.violations,
        duration_ms: account.duration.as_secs_f64() * 1000.0,
        cpu_ms: facts.cpu_ms,
        max_rss_kb: account.max_rss_kb,
        policy: account.policy,
        layers: account.layers,
        stderr_tail: String::from_utf8_lossy(&account.stderr_tail).into_owned(),
        limit: v.limit.map(|l| l.as_str().to_string()),
        error: v.error,
        guest_error: account.guest_error,
        command: account.command,
        seed: account.seed,
        clock: account.clock.map(crate::workflow_time::format),
        skipped_paths: account.skipped_paths,
        learned: account.learned,
        exit_status: v.exit_status,
    }
}

/// The report of a `wfjail run` guest: the facts of its supervisor's [`Outcome`].
pub fn from_outcome(
    plan: &Plan,
    base: LayersBase,
    o: Outcome,
    timeout: Option<Duration>,
) -> Report {
    let layers = layers(plan, &base, &o.degraded, o.notify);
    let status_word = o.reaped.as_ref().map(|r| r.status);
    let signal = status_word
        .filter(|&st| libc::WIFSIGNALED(st))
        .map(|st| libc::WTERMSIG(st));
    let killed_by_supervisor = o.killed_by_supervisor();
    let mut violations = o.violations;
    let launched = o.fatal.is_none() && o.channel_error.is_none() && o.interrupted.is_none();
    // Killed by the in-filter action (no user notification): name what we can.
    if launched && signal == Some(libc::SIGSYS) && !o.notify {
        violations.push(Violation {
            category: Category::Other,
            syscall: "unknown".into(),
            args: String::new(),
            action: Action::Killed,
            rule: format!("on_violation = \"kill\" ({})", plan.policy_name),
            hint: "killed by the seccomp filter (SIGSYS); seccomp user notification is unavailable here, so the syscall cannot be named (see `wfjail check`)".into(),
            count: 1,
        });
    }
    let facts = Facts {
        fatal: o.fatal.map(|(step, errno)| SetupFailed {
            step,
            errno,
            command: plan.command.display().to_string(),
        }),
        channel_error: o.channel_error.clone(),
        interrupted: o.interrupted,
        never_execed: !o.exec_confirmed && o.reaped.is_none(),
        wait_status: status_word,
        zygote_died: false,
        violation_enforced: violations.iter().any(|v| v.action != Action::Warned),
        timed_out: o.timed_out,
        protocol_error: o.protocol_error.is_some(),
        output_exceeded: o.output_exceeded,
        // `run`'s CPU limit is RLIMIT_CPU over the one execution.
        call_cpu_exceeded: false,
        killed_by_supervisor,
        cpu_ms: o.reaped.as_ref().map_or(0.0, |r| r.cpu_ms()),
        cpu_limit: plan.limits.cpu.map(|c| c.0),
        memory_limit: applied_rlimit(plan, libc::RLIMIT_AS),
        vm_peak: o.vm_peak,
        disk_exceeded: o.disk_exceeded,
        notifications_exceeded: o.notifications_exceeded,
        memory_refused: o.memory_refused.is_some(),
        file_at_limit: o.file_at_limit.is_some(),
        errored: o.guest_error.is_some(),
        ending: if o.framed {
            Ending::Call {
                answered: o.result.is_some() || o.guest_error.is_some(),
            }
        } else {
            Ending::Raw
        },
        // Why the conversation was ended, whatever status outranks it.
        stopped: o
            .protocol_error
            .as_ref()
            .map(|e| format!("{e}; the guest was stopped (docs/protocol.md)"))
            .or_else(|| o.disk_error.clone()),
        timeout_words: timeout.map(|t| {
            format!(
                "killed after {} (limits.timeout or --timeout)",
                crate::policy::Dur(t)
            )
        }),
    };
    let account = Account {
        policy: plan.policy_name.clone(),
        command: plan.argv.clone(),
        layers,
        violations,
        duration: o.duration,
        max_rss_kb: o.reaped.as_ref().map_or(0, |r| r.max_rss_kb()),
        stderr_tail: o.stderr_tail,
        guest_error: o.guest_error,
        seed: o.seed,
        clock: o.clock,
        skipped_paths: plan.skipped.clone(),
        learned: plan.base_grants.clone().map(|(read, write)| Learned {
            read,
            write,
            violations: o.learned,
            processes: plan.limits.processes,
        }),
    };
    report(&facts, account)
}

/// What a guest's end is judged against, besides the policy: the rlimits as applied (the
/// policy's, or lower inherited ones) and where it may write (searched for a file at the
/// size limit).
#[derive(Debug, Clone, Default)]
pub struct Applied {
    /// RLIMIT_AS, in bytes.
    pub memory: Option<u64>,
    /// RLIMIT_FSIZE, in bytes.
    pub file_size: Option<u64>,
    /// The write grants.
    pub write: Vec<PathBuf>,
}

impl Applied {
    pub fn of(plan: &Plan) -> Self {
        Applied {
            memory: applied_rlimit(plan, libc::RLIMIT_AS),
            file_size: applied_rlimit(plan, libc::RLIMIT_FSIZE),
            write: plan.write.clone(),
        }
    }

    /// Kernel evidence for RLIMIT_FSIZE ([`file_at_limit`]) for a guest that started at
    /// `started` (wall clock): whether a file under the write grants is at the limit.
    pub fn file_at_limit(&self, started: std::time::SystemTime) -> Option<String> {
        let limit = self.file_size?;
        file_at_limit(&self.write, limit, started - FILE_TIME_SLACK)
    }
}

/// The value of rlimit `resource` the child applies (the policy's, or a lower inherited one).
pub fn applied_rlimit(plan: &Plan, resource: impl TryInto<u32>) -> Option<u64> {
    let resource: u32 = resource.try_into().ok()?;
    plan.rlimits
        .iter()
        .find(|(r, _)| *r as u32 == resource)
        .map(|(_, v)| *v)
}

/// How far a file's modification time may lag behind the run's start (the kernel stamps
/// files with a clock that advances once a tick).
const FILE_TIME_SLACK: Duration = Duration::from_millis(100);

/// Entries looked at when searching the write grants for a file at the size limit.
const FILE_SCAN_BUDGET: usize = 10_000;

/// Kernel evidence for RLIMIT_FSIZE: a regular file under the write grants, written since the
/// run started, whose size is exactly the limit (a write past it failed with EFBIG). The
/// search is bounded ([`FILE_SCAN_BUDGET`] entries) and follows no symlink.
fn file_at_limit(roots: &[PathBuf], limit: u64, since: std::time::SystemTime) -> Option<String> {
    let mut budget = FILE_SCAN_BUDGET;
    let mut stack: Vec<PathBuf> = roots.to_vec();
    while let Some(p) = stack.pop() {
        if budget == 0 {
            return None;
        }
        budget -= 1;
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if meta.is_file() {
            let fresh = meta.modified().is_ok_and(|m| m >= since);
            if meta.len() == limit && fresh {
                return Some(p.display().to_string());
            }
        } else if meta.is_dir()
            && let Ok(entries) = std::fs::read_dir(&p)
        {
            for e in entries.flatten().take(budget) {
                stack.push(e.path());
            }
        }
    }
    None
}
