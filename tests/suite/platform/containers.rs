//! Containers and unprivileged hosts (docs/contract.md, "Layers"): the enforcement tests of
//! `run::isolation`, run again as an unprivileged user (uid/gid 65534) and under
//! `examples/container_sim.rs`, which imposes a container runtime's seccomp profile (Docker's
//! default: no namespaces; an old runtime's: no Landlock; a runtime holding the seccomp
//! listener: no user notification). Each test is one `wfjail` invocation on the real kernel.
//!
//! Running as another user needs root; when the tests run unprivileged already, the
//! "unprivileged" cases run as the current user instead.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::common::{Outcome, PY, container_sim, errno_of, run_reported, wfjail_bin};
use serde_json::Value;

/// nobody/nogroup.
const NOBODY: u32 = 65534;

/// The namespace layers a container without namespaces degrades.
const NS_LAYERS: [&str; 5] = ["user-ns", "pid-ns", "net-ns", "ipc-ns", "uts-ns"];

/// Docker's default profile for a root container (which has no CAP_SYS_ADMIN).
const DOCKER_ROOT: &[&str] = &["--deny-namespaces", "--drop-sys-admin"];
/// Docker's default profile for a container running as a non-root user.
const DOCKER_USER: &[&str] = &["--deny-namespaces"];

// ---- helpers --------------------------------------------------------------------------------

/// A fresh directory directly under /tmp (the build tree and `$TMPDIR` may not be
/// traversable by nobody), with `mode`, removed on drop.
struct TmpDir(PathBuf);

impl TmpDir {
    fn new(tag: &str, mode: u32) -> TmpDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = PathBuf::from("/tmp").join(format!(
            "wfjail-containers-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        // Explicitly: create_dir is subject to the umask.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
        TmpDir(dir)
    }

    /// A directory anyone (nobody included) can write in.
    fn shared(tag: &str) -> TmpDir {
        TmpDir::new(tag, 0o777)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    fn s(&self) -> &str {
        self.0.to_str().unwrap()
    }

    /// Writes a world-readable file.
    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        p
    }
}

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Whether the tests can switch to nobody (they run as root).
fn can_switch_user() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Places `src` in `dir`, readable and executable by anyone: a hard link when the file
/// systems allow it, a copy otherwise.
fn install(src: &Path, dir: &TmpDir) -> PathBuf {
    let dst = dir.path(src.file_name().unwrap().to_str().unwrap());
    if std::fs::hard_link(src, &dst).is_err() {
        std::fs::copy(src, &dst).unwrap();
    }
    std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(0o755)).unwrap();
    dst
}

/// How to start wfjail: as whom, and under which simulated container profile.
#[derive(Clone, Copy)]
struct How {
    /// Run as uid/gid 65534 (when the tests run as root).
    nobody: bool,
    /// Run under `container_sim` with these flags.
    sim: Option<&'static [&'static str]>,
}

const ROOT_HOST: How = How {
    nobody: false,
    sim: None,
};

const NOBODY_HOST: How = How {
    nobody: true,
    sim: None,
};

fn sim_root(flags: &'static [&'static str]) -> How {
    How {
        nobody: false,
        sim: Some(flags),
    }
}

fn sim_nobody(flags: &'static [&'static str]) -> How {
    How {
        nobody: true,
        sim: Some(flags),
    }
}

/// Runs `wfjail <args>` as `how` says, with `--report` inserted after `run`; the report and
/// the working directory are in a fresh directory anyone can write.
fn wfjail(how: How, args: &[&str]) -> Outcome {
    let work = TmpDir::shared("work");
    let switch = how.nobody && can_switch_user();
    // Binaries nobody can reach: the build tree may not be traversable by nobody.
    let bins = switch.then(|| TmpDir::new("bin", 0o755));
    let place = |p: PathBuf| match &bins {
        Some(d) => install(&p, d),
        None => p,
    };
    let wfjail = place(wfjail_bin());
    let mut cmd = match how.sim {
        Some(flags) => {
            let mut c = Command::new(place(container_sim()));
            c.args(flags).arg("--").arg(&wfjail);
            c
        }
        None => Command::new(&wfjail),
    };
    cmd.current_dir(&work.0);
    if switch {
        cmd.uid(NOBODY).gid(NOBODY);
    }
    run_reported(cmd, args, &work.path("report.json"))
}

/// `wfjail run -p POLICY [extra...] --raw -- python3 -c CODE`.
fn py(how: How, policy: &str, extra: &[&str], code: &str) -> Outcome {
    let mut args = vec!["run", "-p", policy];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--raw", "--", PY, "-c", code]);
    wfjail(how, &args)
}

fn strs(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(|s| s.as_str()).collect())
        .unwrap_or_default()
}

fn degraded(o: &Outcome) -> Vec<&str> {
    strs(&o.report["layers"]["degraded"])
}

/// Asserts a `layer: ...` entry in `layers.degraded`.
fn assert_degraded(o: &Outcome, layer: &str) {
    let prefix = format!("{layer}: ");
    o.check(
        degraded(o).iter().any(|d| d.starts_with(&prefix)),
        &format!("layers.degraded lists {layer}"),
    );
}

/// The report of a run where the container refused every namespace.
fn assert_no_namespaces(o: &Outcome) {
    for layer in NS_LAYERS {
        let prefix = format!("{layer}: Operation not permitted");
        o.check(
            degraded(o).iter().any(|d| d.starts_with(&prefix)),
            &format!("layers.degraded lists {layer} refused with EPERM"),
        );
    }
    o.check(
        o.report["layers"]["namespaces"]
            .as_array()
            .is_some_and(|a| a.is_empty()),
        "layers.namespaces is empty",
    );
    o.check(
        o.report["layers"]["landlock"]
            .as_str()
            .unwrap_or("")
            .starts_with("abi-"),
        "Landlock still applied",
    );
    o.check(
        o.report["layers"]["seccomp"] == "user-notify",
        "seccomp still applied, with user notification",
    );
    o.check(o.report["layers"]["no_new_privs"] == true, "no_new_privs");
}

// ---- a. unprivileged host: every layer, every denial --------------------------------------

#[test]
fn unprivileged_true_is_ok_with_every_layer() {
    let o = wfjail(NOBODY_HOST, &["run", "--raw", "--", "/bin/true"]);
    o.check(o.code == 0 && o.status() == "ok", "/bin/true as nobody");
    let layers = &o.report["layers"];
    o.check(
        layers["landlock"]
            .as_str()
            .unwrap_or("")
            .starts_with("abi-"),
        "Landlock applied",
    );
    o.check(
        layers["seccomp"] == "user-notify",
        "seccomp with user notification",
    );
    o.check(layers["no_new_privs"] == true, "no_new_privs");
    o.check(
        layers["capabilities"] == "none",
        "every capability dropped (the user namespace gives CAP_SETPCAP)",
    );
    let ns = strs(&layers["namespaces"]);
    for want in ["user", "net", "pid", "ipc", "uts"] {
        o.check(
            ns.contains(&want),
            &format!("{want} namespace (user namespaces work unprivileged here)"),
        );
    }
    o.check(
        !degraded(&o).iter().any(|d| d.contains("-ns: ")),
        "no namespace degraded",
    );
}

#[test]
fn unprivileged_socket_is_denied_with_eperm() {
    let o = py(
        NOBODY_HOST,
        "default",
        &[],
        &format!(
            "import socket\n{}",
            errno_of("socket.create_connection(('127.0.0.1', 9))")
        ),
    );
    o.check(o.stdout.trim() == "errno=1", "socket() fails with EPERM");
    o.check(
        o.code == 3 && o.status() == "violation",
        "exit 3, violation",
    );
    o.assert_violation("socket", "network");
}

#[test]
fn unprivileged_fork_is_denied_with_eperm() {
    let o = py(
        NOBODY_HOST,
        "default",
        &[],
        &format!("import os\n{}", errno_of("os.fork()")),
    );
    o.check(o.stdout.trim() == "errno=1", "fork fails with EPERM");
    o.check(
        o.code == 3 && o.status() == "violation",
        "exit 3, violation",
    );
    let v = o.assert_violation("clone", "subprocess");
    o.check(
        !v["args"].as_str().unwrap_or("").contains("CLONE_THREAD"),
        "a process clone",
    );
}

#[test]
fn unprivileged_thread_start_is_denied_with_eperm() {
    // threading hides the errno; pthread_create returns it.
    let o = py(
        NOBODY_HOST,
        "default",
        &[],
        "import threading, ctypes\n\
         try:\n    threading.Thread(target=print).start()\n\
         except RuntimeError as e:\n    print('error=%s' % e)\n\
         libc = ctypes.CDLL(None)\n\
         fn = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(lambda a: None)\n\
         t = ctypes.c_ulong()\n\
         print('pthread_create=%d' % libc.pthread_create(ctypes.byref(t), None, fn, None))\n",
    );
    o.check(
        o.stdout == "error=can't start new thread\npthread_create=1\n",
        "thread creation fails with EPERM",
    );
    o.check(
        o.code == 3 && o.status() == "violation",
        "exit 3, violation",
    );
    let v = o.assert_violation("clone", "thread");
    o.check(
        v["args"].as_str().unwrap_or("").contains("CLONE_THREAD"),
        "clone flags decoded",
    );
}

#[test]
fn unprivileged_exec_is_denied_with_eperm() {
    let o = py(
        NOBODY_HOST,
        "default",
        &[],
        &format!("import os\n{}", errno_of("os.execv('/bin/true', ['true'])")),
    );
    o.check(o.stdout.trim() == "errno=1", "execve fails with EPERM");
    o.check(
        o.code == 3 && o.status() == "violation",
        "exit 3, violation",
    );
    let v = o.assert_violation("execve", "exec");
    o.check(
        v["args"].as_str().unwrap_or("").starts_with("/bin/true"),
        "exec path decoded",
    );
}

/// A write inside `--rw` works; one outside, in a directory the user may write (so that only
/// Landlock stands in the way), fails with EACCES and is reported as `openat`.
fn write_outside_rw_is_denied(how: How) {
    let rw = TmpDir::shared("rw");
    let outside = TmpDir::shared("outside");
    let code = format!(
        "open('{0}/inside.txt', 'w').write('written')\n{1}",
        rw.s(),
        errno_of(&format!("open('{}/x', 'w')", outside.s()))
    );
    let o = py(how, "default", &["--rw", rw.s()], &code);
    o.check(o.stdout.trim() == "errno=13", "write outside --rw: EACCES");
    o.check(
        std::fs::read_to_string(rw.path("inside.txt"))
            .ok()
            .as_deref()
            == Some("written"),
        "the write under --rw happened",
    );
    o.check(!outside.path("x").exists(), "nothing written outside");
    o.check(
        o.code == 3 && o.status() == "violation",
        "exit 3, violation",
    );
    let v = o.assert_violation("openat", "filesystem");
    o.check(
        v["args"].as_str().unwrap_or("").contains(outside.s()),
        "the path is named",
    );
}

#[test]
fn unprivileged_write_outside_rw_is_denied_with_eacces() {
    write_outside_rw_is_denied(NOBODY_HOST);
}

// ---- b. Docker's default profile: no namespaces, Landlock and seccomp still enforce -------

fn sim_true_degrades_namespaces(how: How) {
    let o = wfjail(how, &["run", "--raw", "--", "/bin/true"]);
    o.check(
        o.code == 0 && o.status() == "ok",
        "/bin/true without namespaces",
    );
    assert_no_namespaces(&o);
}

fn sim_socket_is_denied(how: How) {
    let o = py(
        how,
        "default",
        &[],
        &format!(
            "import socket\n{}",
            errno_of("socket.create_connection(('127.0.0.1', 9))")
        ),
    );
    o.check(o.stdout.trim() == "errno=1", "socket() fails with EPERM");
    o.check(
        o.code == 3 && o.status() == "violation",
        "exit 3, violation",
    );
    o.assert_violation("socket", "network");
    assert_no_namespaces(&o);
}

fn sim_unreadable_path_is_denied(how: How) {
    let o = py(
        how,
        "default",
        &[],
        &errno_of("open('/etc/hostname').read()"),
    );
    o.check(
        o.stdout.trim() == "errno=13",
        "/etc/hostname: EACCES (Landlock)",
    );
    o.check(o.status() != "launch_error", "the guest ran");
    assert_no_namespaces(&o);
}

#[test]
fn docker_root_true_is_ok_without_namespaces() {
    sim_true_degrades_namespaces(sim_root(DOCKER_ROOT));
}

#[test]
fn docker_nobody_true_is_ok_without_namespaces() {
    sim_true_degrades_namespaces(sim_nobody(DOCKER_USER));
}

#[test]
fn docker_root_socket_is_denied() {
    sim_socket_is_denied(sim_root(DOCKER_ROOT));
}

#[test]
fn docker_nobody_socket_is_denied() {
    sim_socket_is_denied(sim_nobody(DOCKER_USER));
}

#[test]
fn docker_root_write_outside_rw_is_denied() {
    write_outside_rw_is_denied(sim_root(DOCKER_ROOT));
}

#[test]
fn docker_nobody_write_outside_rw_is_denied() {
    write_outside_rw_is_denied(sim_nobody(DOCKER_USER));
}

#[test]
fn docker_root_unreadable_path_is_denied() {
    sim_unreadable_path_is_denied(sim_root(DOCKER_ROOT));
}

#[test]
fn docker_nobody_unreadable_path_is_denied() {
    sim_unreadable_path_is_denied(sim_nobody(DOCKER_USER));
}

// ---- c. a policy that requires namespaces fails closed ------------------------------------

const REQUIRE_NAMESPACES: &str =
    "extends = \"default\"\nrequire = [\"seccomp\", \"landlock\", \"namespaces\"]\n";

fn required_namespaces_fail_before_the_guest(how: How) {
    let dir = TmpDir::shared("require-ns");
    let policy = dir.write("require-ns.toml", REQUIRE_NAMESPACES);
    let rw = TmpDir::shared("marker");
    let marker = rw.path("marker");
    let code = format!("open('{}', 'w').write('ran')\n", marker.display());
    let o = py(how, policy.to_str().unwrap(), &["--rw", rw.s()], &code);
    o.check(o.code == 125, "exit 125");
    o.check(o.status() == "launch_error", "status launch_error");
    o.check(!marker.exists(), "the guest never ran");
    let error = o.report["error"].as_str().unwrap_or("");
    o.check(
        error.contains("namespace") && o.stderr.contains("namespace"),
        "the error names the namespace",
    );
}

#[test]
fn docker_root_required_namespaces_exit_125() {
    required_namespaces_fail_before_the_guest(sim_root(DOCKER_ROOT));
}

#[test]
fn docker_nobody_required_namespaces_exit_125() {
    required_namespaces_fail_before_the_guest(sim_nobody(DOCKER_USER));
}

#[test]
fn docker_check_with_required_namespaces_exits_125() {
    let dir = TmpDir::shared("check-ns");
    let policy = dir.write("require-ns.toml", REQUIRE_NAMESPACES);
    let o = wfjail(
        sim_root(DOCKER_ROOT),
        &["check", "-p", policy.to_str().unwrap()],
    );
    o.check(
        o.code == 125,
        "check exits 125 when a required layer is missing",
    );
    let lines: Vec<&str> = o.stdout.lines().collect();
    for layer in NS_LAYERS {
        let at = lines
            .iter()
            .position(|l| l.split_whitespace().next() == Some(layer));
        o.check(at.is_some(), &format!("a row for {layer}"));
        let at = at.unwrap();
        let cols: Vec<&str> = lines[at].split_whitespace().collect();
        o.check(
            cols.get(1) == Some(&"NO") && cols.get(2) == Some(&"yes"),
            &format!("{layer}: unavailable and required"),
        );
        o.check(
            lines
                .get(at + 1)
                .is_some_and(|l| l.trim_start().starts_with("to enable:")),
            &format!("{layer}: an enable hint"),
        );
    }
    for layer in ["landlock", "seccomp"] {
        o.check(
            lines.iter().any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.first() == Some(&layer) && cols.get(1) == Some(&"yes")
            }),
            &format!("{layer} available"),
        );
    }
}

#[test]
fn docker_check_with_default_policy_exits_0() {
    let o = wfjail(sim_root(DOCKER_ROOT), &["check"]);
    o.check(
        o.code == 0,
        "namespaces are best-effort under the default policy",
    );
    o.check(
        o.stdout
            .contains("Everything the policy requires is available."),
        "check says so",
    );
}

// ---- d. an old runtime without Landlock ---------------------------------------------------

#[test]
fn no_landlock_default_policy_exits_125() {
    let dir = TmpDir::shared("no-landlock");
    let marker = dir.path("marker");
    let code = format!("open('{}', 'w').write('ran')\n", marker.display());
    let o = py(
        sim_root(&["--deny-landlock"]),
        "default",
        &["--rw", dir.s()],
        &code,
    );
    o.check(
        o.code == 125,
        "exit 125: the default policy requires Landlock",
    );
    o.check(o.status() == "launch_error", "status launch_error");
    o.check(!marker.exists(), "the guest never ran");
    o.check(
        o.report["error"]
            .as_str()
            .unwrap_or("")
            .contains("Landlock")
            && o.stderr.contains("Landlock"),
        "the error names Landlock",
    );
    // ENOSYS on this kernel (>= 5.13) comes from the profile: the hint says so, and names
    // what would enable it, instead of blaming the kernel's configuration.
    o.check(
        o.stderr
            .contains("this container's seccomp profile hides it")
            && o.stderr.contains("Docker 20.10.18")
            && !o.stderr.contains("CONFIG_SECURITY_LANDLOCK"),
        "the error blames the runtime's profile, not the kernel",
    );
    let row = check_row(sim_root(&["--deny-landlock"]), "landlock");
    assert!(
        row["detail"]
            .as_str()
            .unwrap()
            .contains("this container's seccomp profile hides it"),
        "check says the same: {row}"
    );
}

#[test]
fn no_landlock_best_effort_policy_runs_with_landlock_degraded() {
    let dir = TmpDir::shared("no-landlock-ok");
    let policy = dir.write(
        "seccomp-only.toml",
        "extends = \"default\"\nrequire = [\"seccomp\"]\n",
    );
    let o = wfjail(
        sim_root(&["--deny-landlock"]),
        &[
            "run",
            "-p",
            policy.to_str().unwrap(),
            "--raw",
            "--",
            "/bin/true",
        ],
    );
    o.check(o.code == 0 && o.status() == "ok", "/bin/true runs");
    o.check(
        o.report["layers"]["landlock"] == "none",
        "layers.landlock none",
    );
    assert_degraded(&o, "landlock");
    o.check(
        o.report["layers"]["seccomp"] == "user-notify",
        "seccomp still applied",
    );
}

// ---- e. a runtime that holds the seccomp listener -----------------------------------------

#[test]
fn no_notify_falls_back_to_the_plain_filter() {
    let o = wfjail(
        sim_root(&["--deny-notify"]),
        &["run", "--raw", "--", "/bin/true"],
    );
    o.check(o.code == 0 && o.status() == "ok", "/bin/true runs");
    o.check(
        o.report["layers"]["seccomp"] == "filter",
        "layers.seccomp filter",
    );
    assert_degraded(&o, "seccomp-notify");
    o.check(
        o.report["layers"]["landlock"]
            .as_str()
            .unwrap_or("")
            .starts_with("abi-"),
        "Landlock applied",
    );
}

#[test]
fn no_notify_socket_still_fails_with_eperm() {
    // The filter answers EPERM itself: the call cannot be named, so no violation is asserted.
    let o = py(
        sim_root(&["--deny-notify"]),
        "default",
        &[],
        &format!(
            "import socket\n{}",
            errno_of("socket.create_connection(('127.0.0.1', 9))")
        ),
    );
    o.check(o.stdout.trim() == "errno=1", "socket() fails with EPERM");
    o.check(
        o.report["layers"]["seccomp"] == "filter",
        "layers.seccomp filter",
    );
}

#[test]
fn no_notify_virtual_clock_still_runs_python_and_says_what_is_real() {
    // Without a listener `clock = "virtual"` is `deny` for the wall clock; the calls only the
    // supervisor could answer (fstat, monotonic clocks, usage) are the kernel's, not refused.
    let o = py(
        sim_root(&["--deny-notify"]),
        "temporal-python",
        &[],
        "import os, time\nprint('ran', os.fstat(1).st_mode > 0, time.monotonic() > 0)\n",
    );
    o.check(
        o.stdout.trim() == "ran True True",
        "Python starts and reads them",
    );
    let degraded = strs(&o.report["layers"]["degraded"]).join("\n");
    o.check(
        degraded.contains("clock-virtual") && degraded.contains("monotonic and CPU clocks"),
        "the degraded clock says what stays real",
    );
}

#[test]
fn no_notify_kill_policy_kills_with_sigsys() {
    let dir = TmpDir::shared("no-notify-kill");
    let policy = dir.write(
        "kill.toml",
        "extends = \"default\"\non_violation = \"kill\"\n",
    );
    let o = py(
        sim_root(&["--deny-notify"]),
        policy.to_str().unwrap(),
        &[],
        "import socket\nsocket.socket()\nprint('survived')\n",
    );
    o.check(!o.stdout.contains("survived"), "the guest did not go on");
    o.check(
        o.code == 3 && o.status() == "violation",
        "exit 3, violation",
    );
    o.check(o.report["signal"] == "SIGSYS", "killed by SIGSYS");
    let violations = o.report["violations"].as_array();
    o.check(
        violations.is_some_and(|vs| {
            vs.iter().any(|v| {
                v["action"] == "killed" && v["hint"].as_str().unwrap_or("").contains("SIGSYS")
            })
        }),
        "a killed violation whose hint mentions SIGSYS",
    );
}

/// Docker <= 22 and containerd < 1.7 (Debian's docker.io included): `process_vm_readv` and
/// `process_vm_writev` need CAP_SYS_PTRACE there. Guest memory is read through
/// `/proc/PID/mem` instead, so a write outside the grants is still reported with its path.
const OLD_DOCKER_ROOT: &[&str] = &["--deny-namespaces", "--drop-sys-admin", "--deny-process-vm"];

#[test]
fn old_docker_root_write_outside_rw_is_reported_with_its_path() {
    write_outside_rw_is_denied(sim_root(OLD_DOCKER_ROOT));
}

#[test]
fn old_docker_root_workflow_time_and_seeded_randomness_are_answered() {
    // Answers are written into the guest's memory through /proc/PID/mem, and the vDSO is
    // read there too.
    let code = "import time, os\nprint(time.time(), os.urandom(4).hex())\n";
    let a = py(
        sim_root(OLD_DOCKER_ROOT),
        "temporal-python",
        &["--clock", "@1000", "--seed", "5"],
        code,
    );
    let b = py(
        sim_root(&["--deny-namespaces", "--drop-sys-admin"]),
        "temporal-python",
        &["--clock", "@1000", "--seed", "5"],
        code,
    );
    a.check(a.status() == "ok", "status ok without process_vm_*");
    a.check(a.stdout.starts_with("1000.0 "), "the workflow time");
    a.check(
        a.stdout == b.stdout,
        "the same answers as with process_vm_*",
    );
}

#[test]
fn without_ptrace_a_policy_with_workflow_time_fails_before_it_starts_and_check_says_why() {
    let how = sim_root(&["--deny-ptrace"]);
    let o = py(how, "temporal-python", &[], "print('ran')");
    o.check(
        o.code == 125 && o.stdout.is_empty(),
        "exit 125, nothing ran",
    );
    o.check(
        o.report["error"].as_str().unwrap_or("").contains("ptrace"),
        "the report names ptrace",
    );
    // A policy with the real clock and the kernel's randomness needs no exec stop.
    let o = py(how, "default", &[], "print('ran')");
    o.check(o.status() == "ok", "default still runs");
    let c = wfjail(how, &["check", "-p", "temporal-python", "--json"]);
    let doc: Value = serde_json::from_str(&c.stdout).unwrap();
    let row = doc["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["layer"] == "exec-stop")
        .unwrap();
    c.check(
        row["available"] == false && row["required"] == true && c.code == 125,
        "check: exec-stop missing and required, exit 125",
    );
}

/// A `check --json` row by layer name.
fn check_row(how: How, layer: &str) -> Value {
    let c = wfjail(how, &["check", "--json"]);
    let doc: Value = serde_json::from_str(&c.stdout).unwrap();
    doc["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["layer"] == layer)
        .cloned()
        .unwrap_or_else(|| panic!("check has no {layer} row: {}", c.stdout))
}

#[test]
fn a_call_the_container_refuses_first_is_named_as_unreported_by_check_and_run() {
    // Docker's profile answers unshare itself (EPERM outranks wfjail's notification): the
    // guest's call fails but wfjail never sees it. That must not pass silently.
    let how = sim_root(&["--deny-namespaces"]);
    let o = py(
        how,
        "default",
        &[],
        "import ctypes; libc = ctypes.CDLL(None, use_errno=True)\n\
         print(libc.unshare(0x10000000), ctypes.get_errno())",
    );
    o.check(o.stdout.trim() == "-1 1", "unshare fails with EPERM");
    assert_degraded(&o, "container-seccomp");
    o.check(
        degraded(&o)
            .iter()
            .any(|d| d.starts_with("container-seccomp: ") && d.contains("unshare, setns")),
        "the entry names unshare and setns",
    );
    o.check(
        o.stderr.contains("container-seccomp"),
        "the console summary names it",
    );
    let row = check_row(how, "container-seccomp");
    assert!(
        row["available"] == false && row["detail"].as_str().unwrap().contains("unshare, setns"),
        "check predicts it: {row}"
    );
    // On the bare host nothing is answered before wfjail: the call is reported.
    let o = py(
        ROOT_HOST,
        "default",
        &[],
        "import ctypes; ctypes.CDLL(None).unshare(0x10000000)",
    );
    o.check(
        o.code == 3 && o.report["violations"][0]["syscall"] == "unshare",
        "reported on the host",
    );
    o.check(
        !degraded(&o)
            .iter()
            .any(|d| d.starts_with("container-seccomp")),
        "no container-seccomp entry on the host",
    );
    assert!(check_row(ROOT_HOST, "container-seccomp")["available"] == true);
}

#[test]
fn a_refused_sethostname_is_predicted_by_check_and_degraded_in_run() {
    // podman's default profile: a UTS namespace, but no sethostname.
    let how = sim_root(&["--deny-sethostname"]);
    let o = py(
        how,
        "default",
        &[],
        "import socket; print(socket.gethostname())",
    );
    o.check(o.status() == "ok", "status ok");
    o.check(o.stdout.trim() != "wfjail", "the hostname is not pinned");
    assert_degraded(&o, "hostname");
    let row = check_row(how, "hostname");
    assert!(row["available"] == false, "check predicts it: {row}");
    let row = check_row(ROOT_HOST, "hostname");
    assert!(row["available"] == true, "on the host: {row}");
}

#[test]
fn warn_without_a_listener_stops_instead_of_letting_every_path_through_unseen() {
    // Under warn, Landlock lets every path through and the supervisor judges each open: with
    // no listener (a runtime holding it), nothing would judge them.
    let o = wfjail(
        sim_root(&["--deny-notify"]),
        &["run", "-p", "permissive", "--raw", "--", "/bin/true"],
    );
    o.check(o.code == 125, "exit 125 before the guest runs");
    let o = wfjail(
        sim_root(&["--deny-notify"]),
        &["run", "-p", "default", "--raw", "--", "/bin/true"],
    );
    o.check(
        o.code == 0,
        "a deny policy still runs, with seccomp-notify degraded",
    );
}
