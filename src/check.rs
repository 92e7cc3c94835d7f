//! `wfjail check`: what this kernel and container can enforce, probed for real (each probe
//! is a short-lived child that tries the operation), with what would enable what is missing.

use serde::Serialize;

use crate::policy::{Layer, Policy, Toggle};
use crate::sys;

/// One layer's state on this host.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub layer: &'static str,
    pub available: bool,
    pub required: bool,
    /// The policy asks for this layer: when it is missing, `run` and `serve` list it in their
    /// report's `degraded` (or exit 125 when it is required). A layer the policy does not ask
    /// for (a namespace it turns off, the pinned address layout it leaves random) is not.
    pub used: bool,
    /// What is there (`abi-7`, `stacked on an existing filter`) or why it is missing.
    pub detail: String,
    /// What would enable it, when it is missing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enable: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CheckReport {
    pub policy: String,
    pub kernel: String,
    pub uid: u32,
    pub rows: Vec<Row>,
    /// The policy's `require` can be met here.
    pub ok: bool,
    /// The host's same-page merging (KSM), for `wfjail serve --merge-pages`: its `run`,
    /// rate and advisor, and whether a process may opt in as a whole (`crate::merging`).
    pub merging: crate::merging::Host,
}

const ALLOW_ALL: [libc::sock_filter; 1] = [libc::sock_filter {
    code: 0x06,
    jt: 0,
    jf: 0,
    k: 0x7fff_0000,
}];

fn namespace_hint(errno: nix::errno::Errno, user_ok: bool) -> String {
    use nix::errno::Errno;
    match errno {
        Errno::ENOSPC => "user.max_user_namespaces is 0 or used up: `sysctl -w user.max_user_namespaces=15000`".into(),
        Errno::EINVAL => "this kernel lacks the namespace (CONFIG_*_NS)".into(),
        _ if !user_ok => "Docker's default seccomp profile denies namespaces without CAP_SYS_ADMIN: run with \
             `--security-opt seccomp=unconfined` or a profile that allows unshare/clone namespace flags \
             (on Ubuntu hosts also `sysctl kernel.apparmor_restrict_unprivileged_userns=0`); Kubernetes: \
             a pod with `hostUsers: false` (user namespaces) or a seccomp profile allowing unshare; \
             elsewhere: `sysctl user.max_user_namespaces` > 0"
            .into(),
        _ => "refused although user namespaces work: a seccomp profile or LSM denies this flag".into(),
    }
}

/// Whether `policy` asks for `layer`, so that `run` lists it in `degraded` when it is missing.
fn uses(policy: &Policy, layer: Layer) -> bool {
    let ns = policy.namespaces;
    match layer {
        Layer::UserNs => ns.user,
        Layer::NetNs => ns.net,
        Layer::PidNs => ns.pid,
        Layer::IpcNs => ns.ipc,
        Layer::UtsNs => ns.uts,
        Layer::MountNs => ns.mount && ns.pid,
        // Missing TCP rules matter only when the policy denies the network.
        Layer::LandlockNet => policy.network.mode == crate::policy::NetworkMode::None,
        Layer::AddressLayout => {
            policy.process.address_randomization == Toggle::Deny
                || policy.requires(Layer::AddressLayout)
        }
        _ => true,
    }
}

/// Probes every layer and compares with `policy.require`.
pub fn check(policy: &Policy) -> CheckReport {
    let mut rows = Vec::new();
    let ns = policy.namespaces;
    let used = |layer: Layer| uses(policy, layer);
    // Under warn, `run` lets every path through Landlock and judges each open itself: the
    // listener is required there (serve's sessions are judged by the zygote's router).
    let warn = policy.on_violation == crate::policy::OnViolation::Warn;
    let mut row = |layer: Layer, available: bool, detail: String, enable: Option<String>| {
        rows.push(Row {
            layer: layer.as_str(),
            available,
            required: policy.requires(layer) || (layer == Layer::SeccompNotify && warn),
            used: used(layer),
            detail,
            enable,
        });
    };

    // Landlock.
    match sys::landlock_abi() {
        Ok(kernel_abi) => {
            let abi = crate::plan::landlock::enforced_abi(kernel_abi);
            let detail = if abi == kernel_abi {
                format!("abi-{abi} (the kernel's, enforced in full)")
            } else {
                format!(
                    "abi-{abi} enforced; the kernel offers abi-{kernel_abi}, newer than wfjail was tested on (abi-{})",
                    crate::plan::landlock::PINNED_ABI
                )
            };
            row(Layer::Landlock, true, detail, None);
            row(
                Layer::LandlockNet,
                abi >= 4,
                if abi >= 4 {
                    "TCP bind/connect denied".into()
                } else {
                    format!("ABI {abi} has no network rules")
                },
                (abi < 4)
                    .then(|| "Linux >= 6.7 (Landlock ABI 4); seccomp still denies sockets".into()),
            );
            row(
                Layer::LandlockScope,
                abi >= 6,
                if abi >= 6 {
                    "abstract unix sockets and signals scoped".into()
                } else {
                    format!("ABI {abi} has no scoping")
                },
                (abi < 6).then(|| "Linux >= 6.12 (Landlock ABI 6)".into()),
            );
        }
        Err(e) => {
            let (detail, enable) = crate::plan::landlock::why_missing(e);
            for l in [Layer::Landlock, Layer::LandlockNet, Layer::LandlockScope] {
                row(l, false, detail.clone(), Some(enable.into()));
            }
        }
    }

    // Seccomp and its listener.
    let stacked = match crate::procfs::seccomp_mode() {
        Some(2) => " (stacked on the filter this process already runs under)",
        _ => "",
    };
    let nnp = || sys::set_no_new_privs();
    let seccomp = sys::probe_in_child(0, || {
        nnp()?;
        sys::seccomp_install(&ALLOW_ALL, 0).map(drop)
    });
    row(
        Layer::Seccomp,
        seccomp.is_ok(),
        match &seccomp {
            Ok(()) => format!("seccomp-bpf filters{stacked}"),
            Err(e) => format!("cannot install a filter: {e}"),
        },
        seccomp
            .is_err()
            .then(|| "a kernel built with CONFIG_SECCOMP_FILTER".into()),
    );
    let notify = sys::probe_in_child(0, || {
        nnp()?;
        let fd = sys::seccomp_install(&ALLOW_ALL, libc::SECCOMP_FILTER_FLAG_NEW_LISTENER)?;
        sys::close(fd);
        Ok(())
    });
    row(
        Layer::SeccompNotify,
        notify.is_ok(),
        match &notify {
            Ok(()) => "violations are named with their arguments".into(),
            Err(e) => format!(
                "no listener ({e}): violations fail or kill in the filter and cannot be named{}",
                if warn {
                    "; `run` needs it under on_violation = \"warn\" (its supervisor judges each file), `serve` sessions run without it"
                } else {
                    ""
                }
            ),
        },
        notify
            .is_err()
            .then(|| "Linux >= 5.0, and a runtime that does not hold the listener itself".into()),
    );
    // What the answered knobs become without a listener (`run` lists them in `degraded`).
    use crate::policy::rules::{clock, getrandom};
    let mut answered_rows = Vec::new();
    for (answered, degraded) in [
        (clock::answered(policy), clock::DEGRADED),
        (getrandom::answered(policy), getrandom::DEGRADED),
    ] {
        if !answered {
            continue;
        }
        let (layer, why) = degraded.split_once(": ").unwrap_or((degraded, ""));
        answered_rows.push(Row {
            layer,
            available: notify.is_ok(),
            required: false,
            used: true,
            detail: if notify.is_ok() {
                "answered by the supervisor through the listener".into()
            } else {
                why.into()
            },
            enable: notify.is_err().then(|| "see seccomp-notify".into()),
        });
    }

    // Namespaces, the way `run` makes them: user and pid with clone, the others inside.
    let user = crate::process::probe_user_ns_maps();
    let user_ok = user.is_ok();
    // The namespace is made but its id maps refused: root without CAP_SETFCAP.
    let maps_refused = !user_ok && sys::probe_in_child(libc::CLONE_NEWUSER, || Ok(())).is_ok();
    let base = if user_ok { libc::CLONE_NEWUSER } else { 0 };
    let mut uts_ok = false;
    for (layer, flag, what) in [
        (
            Layer::UserNs,
            libc::CLONE_NEWUSER,
            "own uid/gid mapping, capabilities only inside",
        ),
        (
            Layer::PidNs,
            libc::CLONE_NEWPID,
            "the guest is PID 1 and sees no other process",
        ),
        (
            Layer::NetNs,
            libc::CLONE_NEWNET,
            "no interfaces, not even loopback",
        ),
        (Layer::IpcNs, libc::CLONE_NEWIPC, "no shared System V IPC"),
        (
            Layer::UtsNs,
            libc::CLONE_NEWUTS,
            "hostname pinned to \"wfjail\"",
        ),
    ] {
        let r = if layer == Layer::UserNs {
            user
        } else {
            sys::probe_in_child(base | flag, || Ok(()))
        };
        uts_ok |= layer == Layer::UtsNs && r.is_ok();
        match r {
            Ok(()) => row(layer, true, what.into(), None),
            Err(e) if maps_refused => row(
                layer,
                false,
                format!("refused: {e} (root's id maps in a user namespace)"),
                Some(
                    "root maps uid 0 into a user namespace only with CAP_SETFCAP (Linux >= 5.12): \
                     add that capability (Kubernetes: `capabilities: add: [\"SETFCAP\"]`) or run \
                     as a non-root user"
                        .into(),
                ),
            ),
            Err(e) => row(
                layer,
                false,
                format!("refused: {e}"),
                Some(namespace_hint(e, user_ok)),
            ),
        }
    }

    // The pinned hostname: the namespace alone does not show it (podman's default seccomp
    // profile allows the UTS namespace but refuses sethostname).
    let hostname = uts_ok.then(|| {
        let set = sys::probe_in_child(base | libc::CLONE_NEWUTS, || {
            sys::sethostname(crate::plan::HOSTNAME)
        });
        Row {
            layer: "hostname",
            available: set.is_ok(),
            required: false,
            used: ns.uts,
            detail: match &set {
                Ok(()) => "sethostname in the guest's UTS namespace: it sees \"wfjail\"".into(),
                Err(e) => format!(
                    "sethostname refused ({e}): the guest gets a UTS namespace of its own but \
                     sees this host's or container's hostname"
                ),
            },
            enable: set.is_err().then(|| {
                "the container's seccomp profile refuses sethostname (podman's default does): \
                 a profile that allows it in a UTS namespace, or accept the host's name"
                    .into()
            }),
        }
    });

    // A private /proc, made the way `run` makes it: in the new PID namespace's first process.
    match sys::probe_in_child(base | libc::CLONE_NEWPID, sys::private_proc) {
        Ok(()) => row(
            Layer::MountNs,
            true,
            "a /proc of the guest's own PID namespace: host pids invisible".into(),
            None,
        ),
        Err(e) => row(
            Layer::MountNs,
            false,
            format!("refused: {e}; host pids stay visible through /proc"),
            Some(
                "a PID namespace (see pid-ns) and mount rights in it; in a user namespace the \
                 kernel also wants the container's /proc unmasked (e.g. Docker's \
                 `--security-opt systempaths=unconfined`)"
                    .into(),
            ),
        ),
    }

    // Capabilities: all can always be dropped; the bounding set needs CAP_SETPCAP.
    let setpcap = caps::has_cap(None, caps::CapSet::Effective, caps::Capability::CAP_SETPCAP)
        .unwrap_or(false);
    let bounding = setpcap || user_ok;
    row(
        Layer::Capabilities,
        bounding,
        if bounding {
            "every set emptied, bounding set included".into()
        } else {
            "effective/permitted/inheritable/ambient emptied; the bounding set stays (no CAP_SETPCAP), harmless under no_new_privs".into()
        },
        (!bounding).then(|| "a user namespace (see user-ns) or CAP_SETPCAP".into()),
    );
    row(
        Layer::NoNewPrivs,
        true,
        "set before Landlock and seccomp".into(),
        None,
    );

    // The pinned address layout, set the way `run` sets it: in a child, then read back.
    let pinned = used(Layer::AddressLayout);
    let layout = sys::probe_in_child(0, sys::disable_address_randomization);
    row(
        Layer::AddressLayout,
        layout.is_ok(),
        match (&layout, pinned) {
            (Ok(()), true) => "personality(ADDR_NO_RANDOMIZE) holds: a guest's addresses, hence id() and default reprs, repeat between runs".into(),
            (Ok(()), false) => "personality(ADDR_NO_RANDOMIZE) allowed; this policy leaves the layout random".into(),
            (Err(e), true) => format!(
                "personality(ADDR_NO_RANDOMIZE) refused ({e}): the policy pins the address layout, \
                 but a guest's addresses will be randomised, so id() and default reprs may differ \
                 between runs and on replay"
            ),
            (Err(e), false) => format!(
                "personality(ADDR_NO_RANDOMIZE) refused ({e}); this policy leaves the layout random anyway"
            ),
        },
        layout.is_err().then(|| {
            "the container's seccomp profile refuses personality(0x40000) (podman's and Docker's \
             defaults allow only 0x0, 0x8, 0x20000, 0x20008, 0xffffffff): a profile that allows \
             it (docs/containers.md), or require address-layout to refuse to run without it"
                .into()
        }),
    );

    // Without Landlock at all, `run` names only `landlock`: its finer rows are part of it.
    if !rows.iter().any(|r| r.layer == "landlock" && r.available) {
        for r in &mut rows {
            if matches!(r.layer, "landlock-net" | "landlock-scope") && !r.required {
                r.used = false;
            }
        }
    }
    let at = rows
        .iter()
        .position(|r| r.layer == "seccomp-notify")
        .map_or(rows.len(), |i| i + 1);
    rows.splice(at..at, answered_rows);
    if let Some(h) = hostname {
        let at = rows
            .iter()
            .position(|r| r.layer == "uts-ns")
            .map_or(rows.len(), |i| i + 1);
        rows.insert(at, h);
    }

    // The exec stop (workflow time, seeded randomness): a child traced across its exec.
    let needs_stop = crate::answers::vdso::Patch::for_policy(policy).is_some();
    let stop = probe_exec_stop();
    rows.push(Row {
        layer: "exec-stop",
        available: stop.is_ok(),
        required: needs_stop,
        used: needs_stop,
        detail: match &stop {
            Ok(()) => "ptrace can hold a child at its exec: the vDSO is patched for [time] clock and [random] getrandom".into(),
            Err(e) => format!("ptrace refused ({e}): policies with [time] clock or [random] getrandom other than real/allow cannot start"),
        },
        enable: stop.is_err().then(|| {
            "allow ptrace in the container's seccomp profile (Docker allows it from 19.03 on kernels >= 4.8) and keep kernel.yama.ptrace_scope below 3".into()
        }),
    });
    let unseen = sys::refused_by_outer_filter();
    rows.push(Row {
        layer: "container-seccomp",
        available: unseen.is_empty(),
        required: false,
        used: true,
        detail: if unseen.is_empty() {
            match crate::procfs::seccomp_mode() {
                Some(2) => "the filter this process runs under leaves every probed call to wfjail: each violation is reported".into(),
                _ => "no outer seccomp filter: each violation is reported".into(),
            }
        } else {
            format!(
                "this container's profile refuses {} itself, before wfjail's filter: a guest's \
                 call fails with an errno but is not reported as a violation",
                unseen.join(", ")
            )
        },
        enable: (!unseen.is_empty()).then(|| {
            "nothing is weaker (the call fails either way); to see these violations, a profile that leaves them to wfjail (e.g. Docker's `--security-opt seccomp=unconfined`: wfjail's own filter still applies)".into()
        }),
    });
    // limits.processes over a root guest that may fork: only a pids cgroup binds it.
    if crate::process::pids_cgroup::needed(policy).is_some() {
        let made = crate::process::pids_cgroup::PidsCgroup::create();
        rows.push(Row {
            layer: "rlimit-nproc",
            available: made.is_ok(),
            required: false,
            used: true,
            detail: match &made {
                Ok(_) => "limits.processes bound by a pids cgroup per guest (the guest runs as host root, which RLIMIT_NPROC exempts)".into(),
                Err(e) => format!("limits.processes does not bind a guest that runs as host root, and no pids cgroup can be made here ({e})"),
            },
            enable: made.is_err().then(|| {
                "run wfjail as an unprivileged user, or give it a delegated cgroup subtree with the pids controller".into()
            }),
        });
    }
    let cgroup = cgroup_summary();
    let ok = rows.iter().all(|r| r.available || !r.required);
    let merging = crate::merging::Host::read();
    let mut report = CheckReport {
        policy: policy.name.clone(),
        kernel: nix::sys::utsname::uname()
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_default(),
        uid: nix::unistd::getuid().as_raw(),
        rows,
        ok,
        merging: merging.clone(),
    };
    report.rows.push(Row {
        layer: "guest-memory",
        available: true,
        required: false,
        used: false,
        detail: format!(
            "read and written with {} (violations name their paths either way)",
            sys::guest_memory_route()
        ),
        enable: None,
    });
    report.rows.push(merging_row(&merging));
    report.rows.push(Row {
        layer: "cgroups",
        available: cgroup.0,
        required: false,
        used: false,
        detail: cgroup.1,
        enable: None,
    });
    report
}

/// Same-page merging (KSM): whether the host merges, at what rate, and whether a process may
/// opt in as a whole. Not a confinement layer: what `wfjail serve --merge-pages` (the
/// runner's `merge_pages=True`) gets here.
fn merging_row(host: &crate::merging::Host) -> Row {
    let prctl = if host.prctl == "yes" {
        String::new()
    } else {
        format!("; {}", host.prctl)
    };
    let (detail, enable) = match (host.present, host.run) {
        (true, Some(1)) if host.prctl != "yes" => (
            format!(
                "the host merges, but {}",
                host.prctl.trim_start_matches("no: ")
            ),
            Some(
                "Linux 6.4+ (PR_SET_MEMORY_MERGE); docs/temporal.md, \"Same-page merging\"".into(),
            ),
        ),
        (true, Some(1)) => (
            format!(
                "the host merges: {}; {} pages shared by {} mappings now{prctl}",
                host.rate(),
                host.pages_shared.unwrap_or(0),
                host.pages_sharing.unwrap_or(0),
            ),
            None,
        ),
        (true, run) => (
            format!(
                "the host does not merge ({}/run = {}, host-wide; rate when on: {}); `serve \
                 --merge-pages` opts the zygotes in regardless{prctl}",
                crate::merging::KSM_DIR,
                run.map_or("unreadable".into(), |r| r.to_string()),
                host.rate()
            ),
            Some(format!(
                "as root on the host (the node, not a container): `echo 1 > {}/run` and a \
                 rate; {}",
                crate::merging::KSM_DIR,
                crate::merging::GUIDE
            )),
        ),
        (false, _) => (
            host.why_not().unwrap_or_default(),
            Some("a kernel built with CONFIG_KSM".into()),
        ),
    };
    Row {
        layer: "page-merging",
        // What `--merge-pages` needs: a host that merges, and the prctl that opts a zygote in.
        available: host.merges() && host.prctl == "yes",
        required: false,
        used: false,
        detail,
        enable,
    }
}

/// Whether this process may trace a child across its exec (`PTRACE_SEIZE` on a child that
/// waits), as the exec stop does.
fn probe_exec_stop() -> Result<(), nix::errno::Errno> {
    let child = sys::clone_process(0, || {
        std::thread::sleep(std::time::Duration::from_secs(10));
        sys::exit_now(0)
    })
    .map_err(|e| nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EPERM)))?;
    let seized = sys::ptrace_seize_for_exec(child.pid)
        .map_err(|e| nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EPERM)));
    let _ = sys::kill_pid(child.pid, libc::SIGKILL);
    let _ = sys::wait4(child.pid);
    seized
}

/// cgroups are not used for enforcement (memory is limited with RLIMIT_AS); this row says
/// what the host has, for operators planning per-execution accounting.
fn cgroup_summary() -> (bool, String) {
    let unified = std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let hybrid = std::path::Path::new("/sys/fs/cgroup/unified").exists();
    let v1_memory = std::path::Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists();
    let what = if unified {
        "cgroup v2"
    } else if hybrid {
        "cgroup v1 (hybrid)"
    } else if v1_memory {
        "cgroup v1"
    } else {
        "no cgroup file system mounted"
    };
    // Host root is exempt from RLIMIT_NPROC: a pids cgroup per guest bounds limits.processes
    // (when a policy allows forks or threads). Probed by making one.
    let pids = if nix::unistd::geteuid().is_root() {
        match crate::process::pids_cgroup::PidsCgroup::create() {
            Ok(_) => "; as root, a pids cgroup per guest bounds limits.processes".to_string(),
            Err(e) => format!(
                "; as root, limits.processes cannot be bounded with forks allowed (RLIMIT_NPROC exempts root, and no pids cgroup: {e})"
            ),
        }
    } else {
        String::new()
    };
    (
        unified || hybrid || v1_memory,
        format!("{what}; memory is limited per process with RLIMIT_AS{pids}"),
    )
}

impl CheckReport {
    pub fn table(&self) -> String {
        let mut s = format!(
            "wfjail check: policy {} on Linux {} (uid {})\n\n{:<18} {:<10} {:<9} {}\n",
            self.policy, self.kernel, self.uid, "LAYER", "AVAILABLE", "REQUIRED", "DETAIL"
        );
        for r in &self.rows {
            // A missing layer the policy does not ask for changes nothing for this policy.
            let unused = if !r.available && !r.used && r.layer != "page-merging" {
                " (this policy does not use it)"
            } else {
                ""
            };
            s.push_str(&format!(
                "{:<18} {:<10} {:<9} {}{unused}\n",
                r.layer,
                if r.available { "yes" } else { "NO" },
                if r.required { "yes" } else { "-" },
                r.detail
            ));
            if let Some(e) = &r.enable {
                s.push_str(&format!("{:<39}to enable: {e}\n", ""));
            }
        }
        s.push('\n');
        let degraded: Vec<&str> = self
            .rows
            .iter()
            .filter(|r| r.used && !r.required && !r.available)
            .map(|r| r.layer)
            .collect();
        if self.ok {
            s.push_str("Everything the policy requires is available.\n");
            if !degraded.is_empty() {
                s.push_str(&format!(
                    "`wfjail run` and `serve` will run without {} (listed in their report's `degraded`).\n",
                    degraded.join(", ")
                ));
            }
        } else {
            let missing: Vec<&str> = self
                .rows
                .iter()
                .filter(|r| r.required && !r.available)
                .map(|r| r.layer)
                .collect();
            s.push_str(&format!(
                "The policy requires {} but this host cannot provide it: `wfjail run` will exit 125.\n",
                missing.join(", ")
            ));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_uses_the_address_layout_when_it_pins_it_or_requires_it() {
        let load = |src: &str| crate::policy::from_source("t.toml", src).unwrap();
        let pinned = load("extends = \"temporal-python\"\n");
        let random = load("extends = \"default\"\n");
        let required = load("extends = \"default\"\nrequire = [\"address-layout\"]\n");
        assert!(uses(&pinned, Layer::AddressLayout));
        assert!(!uses(&random, Layer::AddressLayout));
        assert!(uses(&required, Layer::AddressLayout));
        // Namespaces a policy turns off are not used (permissive keeps the host's network).
        let permissive = load("extends = \"permissive\"\n");
        assert!(!uses(&permissive, Layer::NetNs));
        assert!(uses(&permissive, Layer::PidNs));
    }
}
