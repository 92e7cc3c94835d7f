//! Isolation, proven on this kernel: each test starts one confined guest through the real
//! `wfjail` binary and asserts the exact errno or signal the guest saw, and that the report
//! names the syscall. No kernel behaviour is mocked.

use crate::common::{PY, Scratch, errno_of, py, py_policy, raw_syscall, wfjail, wfjail_with};

#[test]
fn benign_command_is_ok() {
    let o = wfjail(&["run", "--raw", "--", "/bin/true"]);
    o.check(o.code == 0 && o.status() == "ok", "/bin/true under default");
    o.check(o.report["exit_code"] == 0, "exit code recorded");
    o.check(
        o.report["violations"]
            .as_array()
            .is_some_and(|v| v.is_empty()),
        "no violations",
    );
    let layers = &o.report["layers"];
    o.check(
        layers["landlock"].as_str().unwrap().starts_with("abi-"),
        "Landlock applied",
    );
    o.check(
        layers["seccomp"] == "user-notify",
        "seccomp with user notification",
    );
    o.check(layers["no_new_privs"] == true, "no_new_privs");
    o.check(layers["capabilities"] == "none", "capabilities dropped");
    for ns in ["user", "net", "pid", "ipc", "uts", "mount"] {
        o.check(
            layers["namespaces"]
                .as_array()
                .unwrap()
                .iter()
                .any(|n| n == ns),
            ns,
        );
    }
    o.check(
        o.report["duration_ms"].as_f64().unwrap() > 0.0,
        "duration measured",
    );
}

#[test]
fn raw_mode_passes_stdout_through() {
    let o = wfjail(&["run", "--raw", "--", "/bin/echo", "hello", "world"]);
    o.check(
        o.code == 0 && o.stdout == "hello world\n",
        "guest stdout is wfjail's stdout",
    );
}

#[test]
fn python_imports_under_default() {
    let o = py(
        "default",
        &[],
        "import json, asyncio, decimal; print(json.dumps({'ok': str(decimal.Decimal('1.10'))}))",
    );
    o.check(
        o.code == 0 && o.status() == "ok",
        "import json, asyncio, decimal under default",
    );
    o.check(o.stdout.trim() == r#"{"ok": "1.10"}"#, "output");
}

#[test]
fn python_runs_under_strict() {
    let o = py("strict", &[], "print(sum(range(10)))");
    o.check(
        o.code == 0 && o.status() == "ok" && o.stdout.trim() == "45",
        "python under strict",
    );
}

#[test]
fn python_runs_under_temporal_python() {
    let o = py(
        "temporal-python",
        &[],
        "import asyncio, dataclasses; print('ok')",
    );
    o.check(
        o.code == 0 && o.status() == "ok",
        "python under temporal-python",
    );
}

// ---- network ------------------------------------------------------------------------------

#[test]
fn tcp_socket_is_denied_with_eperm() {
    let o = py(
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
        "status violation, exit 3",
    );
    let v = o.assert_violation("socket", "network");
    o.check(
        v["args"]
            .as_str()
            .unwrap()
            .starts_with("AF_INET SOCK_STREAM"),
        "family and type decoded",
    );
    o.check(v["action"] == "denied", "action denied");
    o.check(
        o.stderr
            .contains("wfjail: violation: network socket(AF_INET"),
        "one-line summary on stderr",
    );
}

#[test]
fn udp_sendto_an_address_is_denied() {
    // sendto() with a destination on the one kind of socket the guest may have (a pair).
    let o = py(
        "default",
        &[],
        &format!(
            "import socket\na, b = socket.socketpair()\n{}",
            errno_of("a.sendto(b'x', '/run/x.sock')")
        ),
    );
    o.check(
        o.stdout.trim() == "errno=1",
        "sendto with an address fails with EPERM",
    );
    let v = o.assert_violation("sendto", "network");
    o.check(
        v["args"] == "AF_UNIX /run/x.sock",
        "destination address decoded",
    );
}

#[test]
fn unix_stream_socketpair_is_allowed() {
    let o = py(
        "default",
        &[],
        "import socket\na, b = socket.socketpair()\na.send(b'ping')\nprint(b.recv(4).decode())",
    );
    o.check(
        o.code == 0 && o.stdout.trim() == "ping",
        "AF_UNIX stream pairs work (asyncio needs them)",
    );
}

#[test]
fn datagram_socketpair_is_denied() {
    let o = py(
        "default",
        &[],
        &format!(
            "import socket\n{}",
            errno_of("socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)")
        ),
    );
    o.check(
        o.stdout.trim() == "errno=1",
        "datagram pairs fail with EPERM",
    );
    o.assert_violation("socketpair", "network");
}

// ---- threads, processes, exec ---------------------------------------------------------------

#[test]
fn thread_start_is_denied() {
    let o = py(
        "default",
        &[],
        "import threading\ntry:\n    threading.Thread(target=print).start()\nexcept RuntimeError as e:\n    print('error=%s' % e)\n",
    );
    o.check(
        o.stdout.trim() == "error=can't start new thread",
        "thread creation fails",
    );
    let v = o.assert_violation("clone", "thread");
    o.check(
        v["args"].as_str().unwrap().contains("CLONE_THREAD"),
        "clone flags decoded",
    );
    o.check(o.code == 3, "exit 3");
}

#[test]
fn clone3_answers_enosys_without_a_report() {
    let o = py("default", &[], &raw_syscall(435, &[0, 0]));
    o.check(o.stdout.trim() == "errno=38", "clone3 fails with ENOSYS");
    o.check(o.code == 0 && o.status() == "ok", "and is not a violation");
}

#[test]
fn fork_is_denied() {
    let o = py(
        "default",
        &[],
        &format!("import os\n{}", errno_of("os.fork()")),
    );
    o.check(o.stdout.trim() == "errno=1", "fork fails with EPERM");
    let v = o.assert_violation("clone", "subprocess");
    o.check(
        !v["args"].as_str().unwrap().contains("CLONE_THREAD"),
        "a process clone",
    );
}

#[test]
fn subprocess_run_is_denied() {
    let o = py(
        "default",
        &[],
        &format!(
            "import subprocess\n{}",
            errno_of("subprocess.run(['/bin/true'])")
        ),
    );
    o.check(
        o.stdout.trim() == "errno=1",
        "subprocess.run fails with EPERM",
    );
    o.assert_violation("vfork", "subprocess");
    o.check(o.code == 3, "exit 3");
}

#[test]
fn exec_after_start_is_denied() {
    let o = py(
        "default",
        &[],
        &format!("import os\n{}", errno_of("os.execv('/bin/true', ['true'])")),
    );
    o.check(o.stdout.trim() == "errno=1", "execve fails with EPERM");
    let v = o.assert_violation("execve", "exec");
    o.check(
        v["args"].as_str().unwrap().starts_with("/bin/true"),
        "exec path decoded",
    );
}

// ---- the always-denied set (docs/security.md, "Layers: what each one stops") ----------------

fn assert_privileged_denied(name: &str, nr: u64, args: &[u64]) {
    let o = py("default", &[], &raw_syscall(nr, args));
    o.check(
        o.stdout.trim() == "errno=1",
        &format!("{name} fails with EPERM"),
    );
    o.assert_violation(name, "privilege");
    o.check(o.code == 3 && o.status() == "violation", "status violation");
}

#[test]
fn io_uring_setup_is_denied() {
    assert_privileged_denied("io_uring_setup", 425, &[8, 0]);
}

#[test]
fn bpf_is_denied() {
    assert_privileged_denied("bpf", 321, &[0, 0, 0]);
}

#[test]
fn ptrace_is_denied() {
    assert_privileged_denied("ptrace", 101, &[0, 0, 0, 0]); // PTRACE_TRACEME
}

#[test]
fn unshare_is_denied() {
    assert_privileged_denied("unshare", 272, &[0x1000_0000]); // CLONE_NEWUSER
}

#[test]
fn mount_is_denied() {
    assert_privileged_denied("mount", 165, &[0, 0, 0, 0, 0]);
}

#[test]
fn keyctl_is_denied() {
    assert_privileged_denied("keyctl", 250, &[0, 0]);
}

#[test]
fn userfaultfd_is_denied() {
    assert_privileged_denied("userfaultfd", 323, &[0]);
}

#[test]
fn perf_event_open_is_denied() {
    assert_privileged_denied("perf_event_open", 298, &[0, 0, 0, 0, 0]);
}

#[test]
fn x32_syscalls_are_rejected() {
    let o = py("default", &[], &raw_syscall(0x4000_0000 | 39, &[])); // x32 getpid
    o.check(o.stdout.trim() == "errno=1", "x32 getpid fails with EPERM");
    let v = o.report["violations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["syscall"].as_str().unwrap().starts_with("x32"));
    o.check(v.is_some(), "x32 call reported");
}

#[test]
fn signals_go_only_to_the_guest_itself() {
    // Without a PID namespace the parent's pid is visible: signalling it (wfjail) is denied,
    // signalling itself works.
    let code = &format!(
        "import os, signal\nsignal.signal(signal.SIGUSR1, lambda *a: print('self ok'))\nos.kill(os.getpid(), signal.SIGUSR1)\n{}",
        errno_of("os.kill(os.getppid(), signal.SIGUSR1)")
    );
    let o = py_policy("extends = \"default\"\n[namespaces]\npid = false\n", code);
    o.check(
        o.stdout == "self ok\nerrno=1\n",
        "own signal delivered, the parent's denied",
    );
    let v = o.assert_violation("kill", "privilege");
    o.check(
        v["args"].as_str().unwrap().ends_with("SIGUSR1"),
        "signal decoded",
    );
}

#[test]
fn seccomp_listener_creation_is_denied() {
    // seccomp(SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, NULL)
    let o = py("default", &[], &raw_syscall(317, &[1, 8, 0]));
    o.check(
        o.stdout.trim() == "errno=1",
        "listener creation fails with EPERM",
    );
    o.assert_violation("seccomp", "privilege");
}

// ---- on_violation ---------------------------------------------------------------------------

#[test]
fn kill_mode_kills_at_the_first_violation() {
    let o = py_policy(
        "extends = \"default\"\non_violation = \"kill\"\n",
        "import os\nos.fork()\nprint('survived')",
    );
    o.check(!o.stdout.contains("survived"), "the guest did not go on");
    o.check(
        o.code == 3 && o.status() == "violation",
        "status violation, exit 3",
    );
    o.check(o.report["signal"] == "SIGKILL", "killed by SIGKILL");
    let v = o.assert_violation("clone", "subprocess");
    o.check(v["action"] == "killed", "action killed");
}

#[test]
fn warn_mode_lets_the_call_run_and_lists_it() {
    let o = py(
        "permissive",
        &[],
        "import threading\nt = threading.Thread(target=lambda: print('in thread'))\nt.start(); t.join()",
    );
    o.check(
        o.code == 0 && o.status() == "ok",
        "status stays ok under warn",
    );
    o.check(o.stdout.contains("in thread"), "the thread ran");
    let v = o.assert_violation("clone", "thread");
    o.check(v["action"] == "warned", "action warned");
}

#[test]
fn warn_mode_still_denies_privileged_calls() {
    let o = py("permissive", &[], &raw_syscall(321, &[0, 0, 0]));
    o.check(
        o.stdout.trim() == "errno=1",
        "bpf denied even in permissive",
    );
    let v = o.assert_violation("bpf", "privilege");
    o.check(v["action"] == "denied", "action denied");
    o.check(o.code == 3, "a denied call makes the status violation");
}

// ---- sleep and randomness -------------------------------------------------------------------

#[test]
fn sleep_is_denied_under_strict() {
    let o = py(
        "strict",
        &[],
        &format!("import time\n{}", errno_of("time.sleep(0.01)")),
    );
    o.check(o.stdout.trim() == "errno=1", "sleep fails with EPERM");
    o.assert_violation("clock_nanosleep", "sleep");
}

#[test]
fn sleep_is_allowed_under_default() {
    let o = py(
        "default",
        &[],
        "import time; time.sleep(0.01); print('slept')",
    );
    o.check(
        o.code == 0 && o.stdout.trim() == "slept",
        "default allows sleep",
    );
}

#[test]
fn getrandom_is_denied_under_strict() {
    let o = py("strict", &[], &raw_syscall(318, &[0, 16, 0]));
    o.check(o.stdout.trim() == "errno=1", "getrandom fails with EPERM");
    let v = o.assert_violation("getrandom", "random");
    o.check(v["args"] == "16 bytes", "length decoded");
}

#[test]
fn urandom_device_is_unreadable_under_strict() {
    let o = py(
        "strict",
        &[],
        &errno_of("open('/dev/urandom', 'rb').read(8)"),
    );
    o.check(
        o.stdout.trim() == "errno=13",
        "/dev/urandom: EACCES (Landlock)",
    );
}

#[test]
fn os_urandom_fails_under_strict() {
    let o = py(
        "strict",
        &[],
        "import os\ntry:\n    os.urandom(16)\nexcept Exception as e:\n    print(type(e).__name__)\n",
    );
    o.check(
        o.stdout.trim() == "NotImplementedError",
        "no randomness source at all",
    );
    o.check(o.status() == "violation", "reported");
    o.assert_violation("getrandom", "random");
}

// ---- filesystem -----------------------------------------------------------------------------

#[test]
fn granted_paths_are_readable_others_are_not() {
    let o = py(
        "default",
        &[],
        &format!(
            "import os\nprint(len(open('/usr/bin/env', 'rb').read(4)))\n{}{}",
            errno_of("open('/etc/hostname').read()"),
            errno_of("os.listdir('/root')")
        ),
    );
    o.check(
        o.stdout == "4\nerrno=13\nerrno=13\n",
        "granted readable, others EACCES",
    );
}

#[test]
fn ro_grant_makes_a_file_readable_not_writable() {
    let s = Scratch::new("ro");
    let f = s.write("data.txt", "hello");
    let code = format!(
        "print(open('{0}').read())\n{1}",
        f.display(),
        errno_of(&format!("open('{}', 'a').write('x')", f.display()))
    );
    let o = py("default", &["--ro", s.0.to_str().unwrap()], &code);
    o.check(
        o.stdout == "hello\nerrno=13\n",
        "--ro: read yes, write EACCES",
    );
    let v = o.assert_violation("openat", "filesystem");
    o.check(
        v["args"].as_str().unwrap().contains("data.txt"),
        "the path is named",
    );
    o.check(
        std::fs::read_to_string(&f).unwrap() == "hello",
        "file unchanged",
    );
}

#[test]
fn rw_grant_allows_writes_only_there() {
    let s = Scratch::new("rw");
    let outside = Scratch::new("outside");
    let code = format!(
        "import os\nopen('{0}/new.txt', 'w').write('written')\nos.mkdir('{0}/d')\nos.rename('{0}/new.txt', '{0}/d/moved.txt')\n{1}",
        s.0.display(),
        errno_of(&format!("open('{}/x', 'w')", outside.0.display()))
    );
    let o = py("default", &["--rw", s.0.to_str().unwrap()], &code);
    o.check(o.stdout.trim() == "errno=13", "write outside --rw: EACCES");
    o.check(
        std::fs::read_to_string(s.path("d/moved.txt")).unwrap() == "written",
        "writes under --rw happened",
    );
    o.check(!outside.path("x").exists(), "nothing written outside");
    o.check(o.code == 3, "the write outside is a violation");
    let v = o.assert_violation("openat", "filesystem");
    o.check(
        v["args"]
            .as_str()
            .unwrap()
            .contains(&outside.0.display().to_string()),
        "path named",
    );
    o.check(
        o.report["violations"].as_array().unwrap().len() == 1,
        "writes inside --rw are not violations",
    );
}

#[test]
fn missing_ro_path_is_a_usage_error() {
    let o = wfjail(&["run", "--ro", "/does/not/exist", "--raw", "--", "/bin/true"]);
    o.check(o.code == 2, "exit 2");
    o.check(o.stderr.contains("/does/not/exist"), "names the path");
}

// ---- process hygiene ------------------------------------------------------------------------

#[test]
fn environment_is_cleared_and_rebuilt() {
    let o = wfjail_with(
        &[
            "run",
            "--raw",
            "--",
            PY,
            "-c",
            "import os, json; print(json.dumps(dict(os.environ)))",
        ],
        |c| {
            c.env("WFJAIL_TEST_SECRET", "leak");
        },
    );
    o.check(o.code == 0, "ran");
    let env: serde_json::Value = serde_json::from_str(o.stdout.trim()).unwrap();
    o.check(
        env.get("WFJAIL_TEST_SECRET").is_none(),
        "unlisted variables are cleared",
    );
    o.check(
        env["TZ"] == "UTC" && env["PYTHONHASHSEED"] == "0",
        "pinned by the policy",
    );
    for key in env.as_object().unwrap().keys() {
        o.check(
            [
                "PATH",
                "LANG",
                "LC_ALL",
                "TZ",
                "PYTHONHASHSEED",
                "PYTHONDONTWRITEBYTECODE",
                "HOME",
            ]
            .contains(&key.as_str()),
            &format!("unexpected variable {key}"),
        );
    }
}

#[test]
fn only_the_standard_descriptors_are_open() {
    let o = py(
        "default",
        &["--ro", "/proc"],
        "import os; print(sorted(int(f) for f in os.listdir('/proc/self/fd')))",
    );
    // 0, 1, 2 and the directory listing itself.
    o.check(
        o.stdout.trim() == "[0, 1, 2, 3]",
        "no descriptor leaked into the guest",
    );
}

#[test]
fn capabilities_are_zero_and_no_new_privs_is_set() {
    let o = py(
        "default",
        &["--ro", "/proc"],
        "for l in open('/proc/self/status'):\n    if l.split(':')[0] in ('CapInh','CapPrm','CapEff','CapBnd','CapAmb','NoNewPrivs','Seccomp'):\n        print(l.strip().replace('\\t', ' '))\n",
    );
    for line in [
        "CapInh: 0000000000000000",
        "CapPrm: 0000000000000000",
        "CapEff: 0000000000000000",
        "CapBnd: 0000000000000000",
        "CapAmb: 0000000000000000",
        "NoNewPrivs: 1",
        "Seccomp: 2",
    ] {
        o.check(o.stdout.lines().any(|l| l == line), line);
    }
}

#[test]
fn namespaces_isolate_pid_host_and_network() {
    let o = py(
        "default",
        &["--ro", "/proc"],
        "import os, socket\nprint(os.getpid())\nprint(socket.gethostname())\nprint(sorted(l.split(':')[0].strip() for l in open('/proc/self/net/dev').readlines()[2:]))\n",
    );
    o.check(
        o.stdout == "1\nwfjail\n['lo']\n",
        "PID 1, hostname wfjail, only a loopback device",
    );
}

/// The lines of our own mount table (a mount leaking out of the guest's namespace would show).
fn our_mounts() -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .map(String::from)
        .collect()
}

#[test]
fn the_guest_sees_a_proc_of_its_own_and_no_host_pid() {
    let before = our_mounts();
    let me = std::process::id();
    // `--ro /proc` names the host's /proc; the grant is carried over to the guest's own.
    let code = format!(
        "import os\n\
         print([l.split()[-1] for l in open('/proc/self/status') if l.startswith('NSpid')][0])\n\
         print(sorted(p for p in os.listdir('/proc') if p.isdigit()))\n\
         {}",
        errno_of(&format!("os.stat('/proc/{me}')"))
    );
    let o = py("default", &["--ro", "/proc"], &code);
    o.check(o.status() == "ok", "status ok");
    o.check(
        o.stdout == "1\n['1']\nerrno=2\n",
        "the guest is pid 1 of its /proc, alone there, and our pid does not exist (ENOENT)",
    );
    o.check(
        o.report["layers"]["degraded"]
            .as_array()
            .unwrap()
            .is_empty(),
        "nothing degraded",
    );
    o.check(
        our_mounts() == before,
        "the guest's /proc did not propagate to our mount namespace",
    );
}

#[test]
fn without_namespaces_mount_the_host_pids_stay_visible_and_the_report_says_so() {
    let me = std::process::id();
    let code = errno_of(&format!("os.stat('/proc/{me}'); print('errno=0')"));
    let code = format!("import os\n{code}");
    // Switched off by the policy: visible, and not listed as a namespace.
    let o = py_policy(
        "extends = \"default\"\n[namespaces]\nmount = false\n",
        &code,
    );
    o.check(
        o.stdout == "errno=0\n",
        "our pid is visible in the host's /proc",
    );
    let ns = o.report["layers"]["namespaces"].as_array().unwrap();
    o.check(
        !ns.iter().any(|n| n == "mount"),
        "no mount namespace listed",
    );
    // Without a PID namespace a private /proc cannot be made: degraded, with why.
    let o = py_policy("extends = \"default\"\n[namespaces]\npid = false\n", &code);
    o.check(
        o.stdout == "errno=0\n",
        "our pid is visible without a PID namespace",
    );
    o.check(
        o.report["layers"]["degraded"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| {
                d.as_str()
                    .unwrap()
                    .starts_with("mount-ns: a private /proc needs namespaces.pid = true")
            }),
        "mount-ns listed as degraded, with what it needs",
    );
    // Required without a PID namespace: refused before the guest starts.
    let o = py_policy(
        "extends = \"default\"\nrequire = [\"mount-ns\"]\n[namespaces]\npid = false\n",
        &code,
    );
    o.check(
        o.code == 125 && o.error_says("namespaces.pid"),
        "exit 125, naming namespaces.pid",
    );
}

// ---- supervision and limits -----------------------------------------------------------------

#[test]
fn timeout_kills_the_guest() {
    let o = wfjail(&[
        "run",
        "--timeout",
        "300ms",
        "--raw",
        "--",
        PY,
        "-c",
        "while True: pass",
    ]);
    o.check(
        o.code == 4 && o.status() == "timeout",
        "status timeout, exit 4",
    );
    o.check(o.report["signal"] == "SIGKILL", "killed by SIGKILL");
}

#[test]
fn memory_limit_is_a_limit_outcome() {
    let o = py_policy(
        "extends = \"default\"\n[limits]\nmemory = \"256MiB\"\n",
        "x = bytearray(512 * 1024 * 1024)",
    );
    o.check(
        o.code == 5 && o.status() == "limit" && o.report["limit"] == "memory",
        "memory limit",
    );
    o.check(
        o.report["stderr_tail"]
            .as_str()
            .unwrap()
            .contains("MemoryError"),
        "stderr tail in the report",
    );
}

#[test]
fn cpu_limit_is_a_limit_outcome() {
    let o = py_policy(
        "extends = \"default\"\n[limits]\ncpu = \"1s\"\ntimeout = \"20s\"\n",
        "while True: pass",
    );
    o.check(
        o.code == 5 && o.status() == "limit" && o.report["limit"] == "cpu",
        "cpu limit",
    );
}

#[test]
fn output_limit_is_a_limit_outcome() {
    let o = py_policy(
        "extends = \"default\"\n[limits]\noutput = \"64KiB\"\n",
        "import sys\nwhile True: sys.stdout.write('x' * 4096)",
    );
    o.check(o.code == 5 && o.report["limit"] == "output", "output limit");
    o.check(
        o.stdout.len() <= 64 * 1024 + 64 * 1024,
        "output stopped near the bound",
    );
}

#[test]
fn file_size_limit_is_a_limit_outcome() {
    let s = Scratch::new("fsize");
    let p = s.write(
        "fsize.toml",
        "extends = \"default\"\n[limits]\nfile_size = \"1MiB\"\n",
    );
    let target = format!("of={}", s.path("big").display());
    let o = wfjail(&[
        "run",
        "-p",
        p.to_str().unwrap(),
        "--rw",
        s.0.to_str().unwrap(),
        "--raw",
        "--",
        "/usr/bin/dd",
        "if=/dev/zero",
        &target,
        "bs=1M",
        "count=4",
    ]);
    o.check(
        o.code == 5 && o.report["limit"] == "file_size",
        "file-size limit (SIGXFSZ)",
    );
}

#[test]
fn a_lower_inherited_limit_is_kept_not_an_error() {
    // The default policy asks for 256 open files; under a hard limit of 128 the run goes on
    // with 128 (a limit is an upper bound) instead of failing to raise it.
    let cmd = format!(
        "ulimit -n 128 && exec {} run --raw -- {PY} -c 'import resource; print(resource.getrlimit(resource.RLIMIT_NOFILE))'",
        crate::common::wfjail_bin().display()
    );
    let out = std::process::Command::new("/bin/sh")
        .args(["-c", &cmd])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "(128, 128)");
}

#[test]
fn guest_error_and_crash_statuses() {
    let o = py("default", &[], "raise SystemExit(7)");
    o.check(
        o.code == 1 && o.status() == "guest_error" && o.report["exit_code"] == 7,
        "non-zero exit: guest_error, exit 1",
    );
    // A fault is delivered even to PID 1 of a namespace.
    let o = py("default", &[], "import ctypes; ctypes.string_at(0)");
    o.check(
        o.code == 6 && o.status() == "crashed" && o.report["signal"] == "SIGSEGV",
        "crash: exit 6",
    );
}

// ---- launch errors --------------------------------------------------------------------------

#[test]
fn command_not_found_is_127() {
    let o = wfjail(&["run", "--raw", "--", "no-such-command-wfjail"]);
    o.check(o.code == 127 && o.status() == "launch_error", "127");
    o.check(o.stderr.contains("command not found"), "says so");
}

#[test]
fn command_not_executable_is_126() {
    let s = Scratch::new("noexec");
    let f = s.write("script.sh", "#!/bin/sh\necho hi\n");
    let o = wfjail(&[
        "run",
        "--ro",
        s.0.to_str().unwrap(),
        "--raw",
        "--",
        f.to_str().unwrap(),
    ]);
    o.check(o.code == 126 && o.status() == "launch_error", "126");
}

#[test]
fn command_outside_the_policy_is_126_with_the_fix() {
    let s = Scratch::new("ungranted");
    let f = s.path("tool");
    std::fs::copy("/bin/true", &f).unwrap();
    let o = wfjail(&["run", "--raw", "--", f.to_str().unwrap()]);
    o.check(o.code == 126, "126");
    o.check(o.stderr.contains("--ro"), "the error says how to grant it");
}

#[test]
fn a_cwd_grant_that_would_open_the_root_or_the_home_directory_is_refused() {
    let s = Scratch::new("home");
    let home = s.0.display().to_string();
    let run_in = |dir: &str| {
        wfjail_with(
            &[
                "run",
                "-p",
                "temporal-python",
                "--raw",
                "--",
                PY,
                "-c",
                "pass",
            ],
            |c| {
                c.current_dir(dir).env("HOME", &home);
            },
        )
    };
    let o = run_in("/");
    o.check(
        o.code == 2 && o.error_says("would grant /, the whole file system"),
        "from /: refused",
    );
    let o = run_in(&home);
    o.check(
        o.code == 2 && o.error_says("the home directory (keys and credentials included)"),
        "from the home directory: refused",
    );
    // Below the home directory (a project directory) is what ${cwd} is for.
    std::fs::create_dir(s.path("project")).unwrap();
    let o = run_in(&s.path("project").display().to_string());
    o.check(o.status() == "ok", "from a project directory: ok");
}

/// wfjail's pids cgroups (`wfjail-PID-N`) whose wfjail process is gone: leaks.
fn leaked_pids_cgroups() -> Vec<String> {
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return vec![];
    };
    let mut leaked = vec![];
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let mount = left.split(' ').nth(4).unwrap_or("");
        let cgroup_fs = right.starts_with("cgroup2 ")
            || (right.starts_with("cgroup ") && right.contains("pids"));
        if !cgroup_fs {
            continue;
        }
        for e in std::fs::read_dir(mount).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(rest) = name.strip_prefix("wfjail-")
                && let Some(pid) = rest.split('-').next()
                && !std::path::Path::new(&format!("/proc/{pid}")).exists()
            {
                leaked.push(format!("{mount}/{name}"));
            }
        }
    }
    leaked
}

#[test]
fn limits_processes_bind_a_guest_that_runs_as_host_root() {
    // The kernel exempts host root from RLIMIT_NPROC; with forks allowed, a pids cgroup
    // bounds the guest instead (where none can be made, rlimit-nproc is degraded).
    // Each child spins until the guest (PID 1 of its namespace) exits and takes it along.
    let code = "import os\nn = 0\nfor i in range(40):\n    try:\n        pid = os.fork()\n    except OSError as e:\n        print('failed', e.errno)\n        break\n    if pid == 0:\n        while True:\n            pass\n    n += 1\nprint('forked', n)\n";
    let o = py_policy(
        "extends = \"default\"\n[process]\nsubprocess = \"allow\"\n[limits]\nprocesses = 5\ncpu = \"5s\"\n",
        code,
    );
    let degraded: Vec<&str> = o.report["layers"]["degraded"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d.as_str())
        .filter(|d| d.starts_with("rlimit-nproc"))
        .collect();
    if degraded.is_empty() {
        o.check(
            o.stdout.contains("failed 11") && o.stdout.contains("forked 4"),
            "4 forks, then EAGAIN: the guest and 4 children are 5",
        );
    } else {
        // Not bounded here: the report says why (this is not a pass by default).
        assert!(
            std::env::var_os("WFJAIL_ALLOW_NO_PIDS_CGROUP").is_some(),
            "limits.processes does not bind here: {degraded:?} (set WFJAIL_ALLOW_NO_PIDS_CGROUP=1 to accept)"
        );
    }
    assert_eq!(
        leaked_pids_cgroups(),
        Vec::<String>::new(),
        "cgroups left behind"
    );
}
