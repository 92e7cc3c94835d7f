//! A hostile guest against the host through what it was given (issue 7, C2, C3, D1, D3, B3,
//! E4, E6, F1-F3, F5): ioctls and fcntls on granted files, locks held against host processes,
//! memory files, shared memory in a zygote, and writes the supervisor could not judge. Each
//! attempt runs in a real confined process; the test asserts the errno the guest saw and the
//! report entry.

use std::os::unix::ffi::OsStrExt;
use std::process::Command;

use crate::common::{Outcome, PY, Scratch, errno_of, py, raw_syscall, run_reported, wfjail_bin};

/// The violations of `o` for `syscall`.
fn violations<'a>(o: &'a Outcome, syscall: &str) -> Vec<&'a serde_json::Value> {
    o.report["violations"]
        .as_array()
        .map(|l| l.iter().filter(|v| v["syscall"] == syscall).collect())
        .unwrap_or_default()
}

/// Asserts one violation of `syscall` in `category` whose args contain `args`.
fn assert_reported(o: &Outcome, syscall: &str, category: &str, args: &str) {
    let found = violations(o, syscall)
        .into_iter()
        .any(|v| v["category"] == category && v["args"].as_str().unwrap_or("").contains(args));
    o.check(
        found,
        &format!("a {category} violation of {syscall} with args containing {args:?}"),
    );
}

fn s(p: &std::path::Path) -> String {
    p.display().to_string()
}

// ---- ioctl ----------------------------------------------------------------------------------

#[test]
fn inode_flag_ioctls_on_read_only_files_are_denied_and_reported() {
    let dir = Scratch::new("ioctl-flags");
    let f = dir.write("data.txt", "hello");
    // FS_IOC_SETFLAGS takes an int, FS_IOC_FSSETXATTR a 28-byte struct fsxattr; the guest's
    // uid owns the file, so only the filter stands between it and the inode.
    let code = format!(
        "import fcntl, os\nfd = os.open({f:?}, os.O_RDONLY)\n{}{}",
        errno_of("fcntl.ioctl(fd, 0x40086602, b'\\0' * 4)"),
        errno_of("fcntl.ioctl(fd, 0x401c5820, b'\\0' * 28)"),
        f = s(&f)
    );
    let o = py("default", &["--ro", &s(&dir.0)], &code);
    o.check(
        o.stdout == "errno=1\nerrno=1\n",
        "both ioctls fail with EPERM",
    );
    assert_reported(&o, "ioctl", "filesystem", "FS_IOC_SETFLAGS");
    assert_reported(&o, "ioctl", "filesystem", "FS_IOC_FSSETXATTR");
    o.check(o.code == 3 && o.status() == "violation", "exit 3");
}

#[test]
fn interface_listing_on_a_socket_is_denied_and_reported() {
    let code = format!(
        "import fcntl, socket\na, b = socket.socketpair()\n{}",
        errno_of("fcntl.ioctl(a.fileno(), 0x8912, b'\\0' * 16)") // SIOCGIFCONF
    );
    let o = py("default", &[], &code);
    o.check(o.stdout == "errno=1\n", "SIOCGIFCONF fails with EPERM");
    assert_reported(&o, "ioctl", "network", "SIOCGIFCONF");
}

#[test]
fn the_ioctls_libc_and_cpython_need_still_work() {
    // isatty (TCGETS), FIONREAD, FIONBIO (setblocking), FIOCLEX/FIONCLEX (set_inheritable),
    // terminal size: none is a violation, under the temporal-python policy.
    let code = "import asyncio, logging, json, fcntl, os, socket, struct, sys, termios\n\
                a, b = socket.socketpair()\na.setblocking(False)\nb.send(b'xyz')\n\
                n = struct.unpack('i', fcntl.ioctl(a.fileno(), termios.FIONREAD, b'\\0' * 4))[0]\n\
                os.set_inheritable(a.fileno(), True)\nos.set_inheritable(a.fileno(), False)\n\
                logging.basicConfig()\nasyncio.run(asyncio.sleep(0))\n\
                print(sys.stdout.isatty(), n, os.get_inheritable(a.fileno()))\n";
    let o = py("temporal-python", &[], code);
    o.check(
        o.code == 0 && o.stdout == "False 3 False\n",
        "runs without a violation",
    );
    o.check(
        o.report["violations"]
            .as_array()
            .is_some_and(|l| l.is_empty()),
        "no violations",
    );
}

// ---- fcntl and locks ------------------------------------------------------------------------

#[test]
fn leases_notifications_and_pipe_sizes_are_denied_and_reported() {
    let dir = Scratch::new("fcntl");
    let f = dir.write("data.txt", "hello");
    let code = format!(
        "import fcntl, os\nfd = os.open({f:?}, os.O_RDONLY)\nd = os.open({d:?}, os.O_RDONLY)\n\
         r, w = os.pipe()\n{}{}{}",
        errno_of("fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)"),
        errno_of("fcntl.fcntl(d, fcntl.F_NOTIFY, fcntl.DN_MODIFY)"),
        errno_of("fcntl.fcntl(w, 1031, 1 << 20)"), // F_SETPIPE_SZ
        f = s(&f),
        d = s(&dir.0)
    );
    let o = py("default", &["--ro", &s(&dir.0)], &code);
    o.check(
        o.stdout == "errno=1\nerrno=1\nerrno=1\n",
        "each fails with EPERM",
    );
    assert_reported(&o, "fcntl", "filesystem", "F_SETLEASE");
    assert_reported(&o, "fcntl", "filesystem", "F_NOTIFY");
    assert_reported(&o, "fcntl", "privilege", "F_SETPIPE_SZ");
}

#[test]
fn locks_are_allowed_only_on_files_under_the_write_grants() {
    let ro = Scratch::new("lock-ro");
    let rw = Scratch::new("lock-rw");
    let host = ro.write("host.lock", "");
    let mine = rw.write("mine.lock", "");
    let code = format!(
        "import fcntl, os, struct\n\
         h = os.open({host:?}, os.O_RDONLY)\nm = os.open({mine:?}, os.O_RDWR)\n\
         {}{}{}\
         fcntl.flock(m, fcntl.LOCK_EX | fcntl.LOCK_NB)\nfcntl.flock(m, fcntl.LOCK_UN)\n\
         fcntl.lockf(m, fcntl.LOCK_EX | fcntl.LOCK_NB)\nfcntl.lockf(m, fcntl.LOCK_UN)\n\
         fcntl.fcntl(m, 37, struct.pack('hhqqi4x', fcntl.F_WRLCK, 0, 0, 0, 0))\n\
         fcntl.fcntl(h, fcntl.F_SETLK, struct.pack('hhqqi4x', fcntl.F_UNLCK, 0, 0, 0, 0))\n\
         fcntl.flock(h, fcntl.LOCK_UN)\n\
         print('rw locks ok')\n",
        errno_of("fcntl.flock(h, fcntl.LOCK_SH | fcntl.LOCK_NB)"),
        errno_of("fcntl.lockf(h, fcntl.LOCK_SH | fcntl.LOCK_NB)"),
        errno_of("fcntl.fcntl(h, 37, struct.pack('hhqqi4x', fcntl.F_RDLCK, 0, 0, 0, 0))"),
        host = s(&host),
        mine = s(&mine)
    );
    let o = py("default", &["--ro", &s(&ro.0), "--rw", &s(&rw.0)], &code);
    o.check(
        o.stdout == "errno=1\nerrno=1\nerrno=1\nrw locks ok\n",
        "locks on the read-only file fail with EPERM; under --rw they work, unlocking anywhere",
    );
    assert_reported(
        &o,
        "flock",
        "filesystem",
        &format!("LOCK_SH on {}", s(&host)),
    );
    assert_reported(
        &o,
        "fcntl",
        "filesystem",
        &format!("F_SETLK F_RDLCK on {}", s(&host)),
    );
    assert_reported(
        &o,
        "fcntl",
        "filesystem",
        &format!("F_OFD_SETLK F_RDLCK on {}", s(&host)),
    );
    o.check(
        o.report["violations"].as_array().unwrap().len() == 3,
        "locks under --rw and unlocks are not violations",
    );
    let v = &violations(&o, "flock")[0];
    o.check(
        v["hint"].as_str().unwrap().contains("--rw"),
        "the hint says where to lock",
    );
}

// ---- memory files, IPC, shared memory --------------------------------------------------------

#[test]
fn memory_files_are_denied_and_reported() {
    // A memfd is not counted by RLIMIT_AS: 1.5 GiB could be held under a 1 GiB limit.
    let o = py(
        "default",
        &[],
        &errno_of("import os; os.memfd_create('big')"),
    );
    o.check(o.stdout == "errno=1\n", "memfd_create fails with EPERM");
    let v = &violations(&o, "memfd_create")[0];
    o.check(
        v["args"].as_str().unwrap().contains("big"),
        "the name is decoded",
    );
    o.check(
        v["hint"]
            .as_str()
            .unwrap()
            .contains("memory files are not allowed"),
        "with its hint",
    );
}

#[test]
fn system_v_ipc_and_message_queues_are_denied_and_reported() {
    // shmget(IPC_PRIVATE, 4096, IPC_CREAT|0600), msgget, semget, mq_open: a channel between
    // prefork sessions, which share an IPC namespace.
    for (nr, name, args) in [
        (29u64, "shmget", vec![0u64, 4096, 0o1600]),
        (68, "msgget", vec![0, 0o1600]),
        (64, "semget", vec![0, 1, 0o1600]),
        (240, "mq_open", vec![0, 0o100, 0o600, 0]),
    ] {
        let o = py("default", &[], &raw_syscall(nr, &args));
        o.check(o.stdout == "errno=1\n", &format!("{name} fails with EPERM"));
        let v = violations(&o, name);
        o.check(
            v.first()
                .is_some_and(|v| v["rule"].as_str().unwrap().contains("System V IPC")),
            &format!("{name} is reported with its rule"),
        );
    }
}

#[test]
fn run_still_allows_shared_anonymous_memory() {
    // Nobody to share it with in a one-shot run.
    let o = py(
        "default",
        &[],
        "import mmap\nm = mmap.mmap(-1, 4096)\nm[:2] = b'ok'\nprint(m[:2].decode())",
    );
    o.check(o.code == 0 && o.stdout == "ok\n", "mmap.mmap(-1, n) works");
}

#[test]
fn a_zygote_session_may_not_map_shared_anonymous_memory() {
    let repo = env!("CARGO_MANIFEST_DIR");
    let dir = Scratch::new("zygote-shm");
    let module = format!(
        "wf_{}",
        dir.0
            .file_name()
            .unwrap()
            .to_string_lossy()
            .replace('-', "_")
    );
    dir.write(
        &format!("{module}.py"),
        // At preload (the zygote itself: every later session would inherit the mapping) and
        // in a session.
        "import mmap\ntry:\n    SHARED = mmap.mmap(-1, 4096)\n    AT_PRELOAD = b'mapped'\n\
         except OSError as e:\n    AT_PRELOAD = b'errno=%d' % e.errno\n\
         def preload(req):\n    return AT_PRELOAD\n\
         def shm(req):\n    try:\n        mmap.mmap(-1, 4096)\n        return b'mapped'\n    \
         except OSError as e:\n        return b'errno=%d' % e.errno\n\
         def private(req):\n    m = mmap.mmap(-1, 4096, flags=mmap.MAP_PRIVATE)\n    m[:2] = b'ok'\n    return bytes(m[:2])\n",
    );
    let policy = dir.write(
        "policy.toml",
        &format!(
            "extends = \"temporal-python\"\n[filesystem]\nread = [\"{repo}/python\", \"{d}\"]\n\
             [env]\nset = {{ PYTHONPATH = \"{repo}/python:{d}\" }}\n",
            d = dir.0.display()
        ),
    );
    let worker = dir.write(
        "worker.py",
        &format!(
            "import sys, json\nsys.path.insert(0, {py:?})\nfrom wfjail.client import Client\n\
             c = Client()\nout = {{}}\nfor h in ['preload', 'shm', 'private']:\n    \
             with c.session(handler={module:?} + ':' + h) as s:\n        out[h] = s.call(b'').decode()\n    \
             out[h + ' report'] = s.report['violations']\nprint(json.dumps(out))\n",
            py = format!("{repo}/python")
        ),
    );
    let report = dir.path("report.json");
    let mut cmd = Command::new(wfjail_bin());
    cmd.current_dir(&dir.0);
    let o = run_reported(
        cmd,
        &[
            "serve",
            "-p",
            &s(&policy),
            "--zygote",
            "--zygotes",
            "1",
            "--python",
            PY,
            "--preload",
            &module,
            "--",
            PY,
            &s(&worker),
        ],
        &report,
    );
    o.check(o.code == 0, "serve exits 0");
    let r: serde_json::Value = serde_json::from_str(o.stdout.trim()).unwrap();
    o.check(
        r["shm"] == "errno=1",
        "MAP_SHARED|MAP_ANONYMOUS fails with EPERM",
    );
    let v = &r["shm report"][0];
    o.check(
        v["syscall"] == "mmap"
            && v["args"]
                .as_str()
                .unwrap()
                .contains("MAP_SHARED|MAP_ANONYMOUS")
            && v["action"] == "denied",
        "and is reported in the session",
    );
    o.check(r["private"] == "ok", "a private anonymous mapping works");
    o.check(
        r["private report"].as_array().unwrap().is_empty(),
        "without a violation",
    );
}

// ---- judging writes -------------------------------------------------------------------------

#[test]
fn a_dangling_symlink_in_rw_to_a_missing_file_outside_is_reported() {
    let rw = Scratch::new("dangling-rw");
    let out = Scratch::new("dangling-out");
    std::os::unix::fs::symlink(out.path("created"), rw.path("link")).unwrap();
    let o = py(
        "default",
        &["--rw", &s(&rw.0)],
        &errno_of(&format!("open({:?}, 'w')", s(&rw.path("link")))),
    );
    o.check(o.stdout == "errno=13\n", "EACCES");
    o.check(!out.path("created").exists(), "nothing created outside");
    assert_reported(&o, "openat", "filesystem", &s(&out.path("created")));
}

#[test]
fn a_hard_link_of_a_file_outside_into_rw_is_reported() {
    let rw = Scratch::new("link-rw");
    let ro = Scratch::new("link-ro");
    let f = ro.write("host.txt", "host");
    let code = errno_of(&format!(
        "import os; os.link({:?}, {:?})",
        s(&f),
        s(&rw.path("alias"))
    ));
    let o = py("default", &["--ro", &s(&ro.0), "--rw", &s(&rw.0)], &code);
    o.check(
        o.stdout == "errno=13\n",
        "EACCES (Landlock alone says EXDEV)",
    );
    o.check(!rw.path("alias").exists(), "no link made");
    assert_reported(&o, "link", "filesystem", &s(&f)); // CPython calls link(2)
}

#[test]
fn a_non_utf8_directory_name_is_judged_by_its_bytes() {
    let rw = Scratch::new("bytes-rw");
    let out = Scratch::new("bytes-out");
    let odd = out.0.join(std::ffi::OsStr::from_bytes(b"caf\xe9"));
    std::fs::create_dir(&odd).unwrap();
    let target = [odd.as_os_str().as_bytes(), b"/x"].concat();
    let lit: String = target.iter().map(|b| format!("\\x{b:02x}")).collect();
    let o = py(
        "default",
        &["--rw", &s(&rw.0)],
        &errno_of(&format!("open(b'{lit}', 'w')")),
    );
    o.check(o.stdout == "errno=13\n", "EACCES");
    assert_reported(&o, "openat", "filesystem", &s(&out.0));
}

#[test]
fn writes_that_cannot_be_judged_are_violations() {
    let rw = Scratch::new("unjudged");
    let long = format!("/{}", "a/".repeat(2100)); // longer than PATH_MAX
    // open(0xdead0000, O_WRONLY|O_CREAT): unreadable; openat(99, "x", ...): no such dirfd.
    let flags = (libc::O_WRONLY | libc::O_CREAT) as u64;
    let bad_dirfd = format!(
        "r = libc.syscall(ctypes.c_long(257), ctypes.c_long(99), ctypes.c_char_p(b'x'), \
         ctypes.c_long({flags}), ctypes.c_long(0o644))\n\
         print('errno=%d' % (ctypes.get_errno() if r == -1 else 0))\n"
    );
    let code = [
        errno_of(&format!("open({long:?}, 'w')")),
        raw_syscall(2, &[0xdead_0000, flags, 0o644]),
        bad_dirfd,
        // Below a granted directory a missing parent is the kernel's to refuse (ENOENT).
        errno_of(&format!("open({:?}, 'w')", s(&rw.path("missing/x")))),
    ]
    .concat();
    let o = py("default", &["--rw", &s(&rw.0)], &code);
    o.check(
        o.stdout == "errno=13\nerrno=13\nerrno=13\nerrno=2\n",
        "EACCES for each write that cannot be judged, ENOENT below --rw",
    );
    let cannot: Vec<_> = o.report["violations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["args"].as_str().unwrap().contains("cannot judge"))
        .collect();
    o.check(cannot.len() == 3, "three cannot-judge violations");
    assert_reported(&o, "openat", "filesystem", "longer than PATH_MAX");
    assert_reported(&o, "open", "filesystem", "not readable");
    assert_reported(&o, "openat", "filesystem", "/fd/99");
}

#[test]
fn proc_self_is_the_guest_not_the_supervisor() {
    let rw = Scratch::new("procself");
    let code = format!(
        "import os\nos.chdir({rw:?})\n\
         f = open('/proc/self/fd/1', 'w'); f.write('reopened\\n'); f.close()\n\
         open('/proc/self/cwd/inside.txt', 'w').write('x')\n{}",
        errno_of("open('/proc/self/cwd/../outside.txt', 'w')"),
        rw = s(&rw.0)
    );
    let o = py("default", &["--rw", &s(&rw.0)], &code);
    o.check(
        o.stdout == "reopened\nerrno=13\n",
        "its own stdout reopens, its cwd is its own",
    );
    o.check(
        rw.path("inside.txt").exists(),
        "written through /proc/self/cwd",
    );
    let parent = rw.0.parent().unwrap().join("outside.txt");
    o.check(!parent.exists(), "nothing written outside");
    assert_reported(&o, "openat", "filesystem", &s(&parent));
    o.check(
        o.report["violations"].as_array().unwrap().len() == 1,
        "only the write outside is a violation",
    );
}

#[test]
fn clone_flags_above_32_bits_are_not_clone_io() {
    // clone(0x1_0000_0011) -> SIGCHLD plus an unknown high bit, not CLONE_IO.
    let o = py(
        "default",
        &[],
        &raw_syscall(56, &[0x1_0000_0011, 0, 0, 0, 0]),
    );
    o.check(o.stdout == "errno=1\n", "EPERM");
    let v = o.assert_violation("clone", "subprocess");
    let args = v["args"].as_str().unwrap();
    o.check(
        args == "SIGCHLD|0x100000000",
        "decoded on 32 bits, the rest in hex",
    );
}

#[test]
fn without_a_listener_locks_and_leases_are_simply_denied() {
    let rw = Scratch::new("fallback-lock");
    let f = rw.write("mine.lock", "");
    let code = format!(
        "import fcntl, os\nm = os.open({f:?}, os.O_RDWR)\n{}{}{}\
         fcntl.flock(m, fcntl.LOCK_UN)\nprint(fcntl.fcntl(m, fcntl.F_GETFD))\n",
        errno_of("fcntl.flock(m, fcntl.LOCK_EX | fcntl.LOCK_NB)"),
        errno_of("fcntl.lockf(m, fcntl.LOCK_EX | fcntl.LOCK_NB)"),
        errno_of("fcntl.fcntl(m, fcntl.F_SETLEASE, fcntl.F_WRLCK)"),
        f = s(&f)
    );
    let report = rw.path("report.json");
    let mut cmd = Command::new(crate::common::container_sim());
    cmd.args(["--deny-notify", "--"]).arg(wfjail_bin());
    let o = run_reported(
        cmd,
        &["run", "--rw", &s(&rw.0), "--raw", "--", PY, "-c", &code],
        &report,
    );
    o.check(
        o.report["layers"]["seccomp"] != "user-notify",
        "no listener: the fall-back program",
    );
    o.check(
        o.stdout == "errno=1\nerrno=1\nerrno=1\n1\n", // F_GETFD: FD_CLOEXEC
        "even under --rw a lock is EPERM without a supervisor; unlocking and F_GETFD work",
    );
}

/// Bytes allocated under `dir` (what limits.disk counts).
fn allocated(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.blocks() * 512)
        .sum()
}

#[test]
fn limits_disk_bounds_what_a_guest_adds_under_its_write_grants() {
    // Finding D: limits.file_size bounds each file, not their sum (512 MiB in 8 files).
    let scratch = Scratch::new("disk");
    let out = scratch.path("out");
    std::fs::create_dir(&out).unwrap();
    // What was there before the guest does not count against it.
    std::fs::write(out.join("before"), vec![7u8; 20 << 20]).unwrap();
    let policy = scratch.write(
        "disk.toml",
        "extends = \"default\"\n[limits]\ndisk = \"16MiB\"\n",
    );
    let run = |code: &str| {
        py(
            policy.to_str().unwrap(),
            &["--rw", out.to_str().unwrap()],
            code,
        )
    };
    // A little: fine.
    let o = run(&format!(
        "open('{}/small', 'wb').write(b'x' * (1 << 20))",
        s(&out)
    ));
    o.check(o.status() == "ok", "1 MiB added: ok");
    // A writer that keeps going is stopped (killed between two samples of 100 ms).
    let o = run(&format!(
        "import time\nfor i in range(64):\n    with open('{}/slow%d' % i, 'wb') as f:\n        f.write(b'x' * (1 << 20))\n    time.sleep(0.02)\nprint('wrote all')\n",
        s(&out)
    ));
    o.check(
        o.code == 5 && o.status() == "limit" && o.report["limit"] == "disk",
        "status limit, limit disk, exit 5",
    );
    o.check(!o.stdout.contains("wrote all"), "killed before it finished");
    let added = allocated(&out) - (20 << 20) - (1 << 20);
    o.check(
        added < 32 << 20,
        &format!("stopped near the limit: {} MiB added", added >> 20),
    );
    for e in std::fs::read_dir(&out).unwrap().flatten() {
        if e.file_name().to_string_lossy().starts_with("slow") {
            std::fs::remove_file(e.path()).unwrap();
        }
    }
    // Eight files of 8 MiB written at once, then exit, between two samples: still a limit.
    let o = run(&format!(
        "for i in range(8):\n    open('{}/fast%d' % i, 'wb').write(b'x' * (8 << 20))\n",
        s(&out)
    ));
    o.check(
        o.status() == "limit" && o.report["limit"] == "disk",
        "64 MiB at once: limit disk",
    );
    // Unlinked while open, the bytes still count.
    let o = run(&format!(
        "import os, time\nf = open('{}/gone', 'wb')\nos.unlink('{}/gone')\nfor i in range(40):\n    f.write(b'x' * (1 << 20)); f.flush()\n    time.sleep(0.01)\nprint('wrote all')\n",
        s(&out),
        s(&out)
    ));
    o.check(
        o.status() == "limit" && o.report["limit"] == "disk" && !o.stdout.contains("wrote all"),
        "an unlinked file's bytes count while it is open",
    );
}

#[test]
fn serve_refuses_a_policy_with_limits_disk() {
    let s = Scratch::new("disk-serve");
    let policy = s.write(
        "disk.toml",
        "extends = \"default\"\n[limits]\ndisk = \"16MiB\"\n",
    );
    let o = crate::common::wfjail(&["serve", "-p", policy.to_str().unwrap(), "--", "/bin/true"]);
    o.check(
        o.code == 2 && o.stderr.contains("limits.disk"),
        "exit 2 naming limits.disk",
    );
}

#[test]
fn a_path_flipped_while_judged_is_refused_and_reported_every_time() {
    // Finding F: the supervisor judged `rw/d/x` inside the grants, then `d` became a link
    // out of them before the kernel opened it. The supervisor now opens (and makes
    // directories, truncates, links) where it judged, beneath the grant: every refusal is a
    // reported one.
    let scratch = Scratch::new("flip");
    let rw = scratch.path("rw");
    let outside = scratch.path("outside");
    std::fs::create_dir_all(rw.join("d")).unwrap();
    std::fs::create_dir_all(rw.join("spare")).unwrap();
    std::fs::write(rw.join("base"), b"").unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, rw.join("link")).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flipper = {
        let (rw, stop) = (rw.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut flips = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // d: a directory, then the link out, then a directory again.
                let _ = std::fs::rename(rw.join("d"), rw.join("spare2"));
                let _ = std::fs::rename(rw.join("link"), rw.join("d"));
                let _ = std::fs::rename(rw.join("d"), rw.join("link"));
                let _ = std::fs::rename(rw.join("spare2"), rw.join("d"));
                flips += 1;
            }
            flips
        })
    };
    let code = format!(
        "import collections, os\nseen = collections.Counter()\nfor i in range(1000):\n    for op in (lambda: os.close(os.open('{0}/d/x', os.O_WRONLY | os.O_CREAT, 0o644)), lambda: os.mkdir('{0}/d/m%d' % i), lambda: os.truncate('{0}/d/x', 0), lambda: os.link('{0}/base', '{0}/d/l%d' % i)):\n        try:\n            op()\n            seen['ok'] += 1\n        except OSError as e:\n            seen[e.errno] += 1\nprint(dict(seen))\n",
        s(&rw)
    );
    let o = py("default", &["--rw", rw.to_str().unwrap()], &code);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let flips = flipper.join().unwrap();
    let seen: std::collections::HashMap<String, u64> = o
        .stdout
        .trim()
        .trim_matches(|c| c == '{' || c == '}')
        .split(", ")
        .filter_map(|kv| kv.split_once(": "))
        .map(|(k, v)| (k.trim_matches('\'').to_string(), v.parse().unwrap()))
        .collect();
    let refused = seen.get("13").copied().unwrap_or(0);
    let reported: u64 = o.report["violations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["category"] == "filesystem")
        .map(|v| v["count"].as_u64().unwrap())
        .sum();
    o.check(
        refused == reported,
        &format!("every refused open is reported: {refused} EACCES, {reported} reported ({seen:?}, {flips} flips)"),
    );
    o.check(
        std::fs::read_dir(&outside).unwrap().next().is_none(),
        "nothing was created outside the grants",
    );
    o.check(
        seen.get("ok").copied().unwrap_or(0) > 0 && refused > 0,
        &format!("both ways were seen: {seen:?}"),
    );
}

#[test]
fn openat2_without_resolve_flags_is_opened_by_the_supervisor_and_with_them_by_the_kernel() {
    let scratch = Scratch::new("openat2");
    let rw = scratch.path("rw");
    std::fs::create_dir_all(&rw).unwrap();
    let code = format!(
        "import ctypes, os\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         class How(ctypes.Structure):\n\
         \x20   _fields_ = [('flags', ctypes.c_uint64), ('mode', ctypes.c_uint64), ('resolve', ctypes.c_uint64)]\n\
         def openat2(path, resolve):\n\
         \x20   how = How(os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600, resolve)\n\
         \x20   fd = libc.syscall(437, -100, path.encode(), ctypes.byref(how), ctypes.sizeof(how))\n\
         \x20   if fd < 0:\n\
         \x20       return 'errno %d' % ctypes.get_errno()\n\
         \x20   os.write(fd, b'x'); os.close(fd)\n\
         \x20   return 'ok'\n\
         print('plain', openat2('{0}/a', 0))\n\
         print('no_symlinks', openat2('{0}/b', 0x04))\n\
         print('outside', openat2('/etc/wfjail-openat2', 0))\n",
        s(&rw)
    );
    let o = py(
        "default",
        &[
            "--rw",
            rw.to_str().unwrap(),
            "--ro",
            "/usr/lib/x86_64-linux-gnu",
        ],
        &code,
    );
    o.check(o.stdout.contains("plain ok"), "openat2 in the grant works");
    o.check(
        o.stdout.contains("no_symlinks ok"),
        "with the guest's own resolve flags, the kernel opens it",
    );
    o.check(
        o.stdout.contains("outside errno 13"),
        "outside the grants: EACCES",
    );
    assert_reported(&o, "openat2", "filesystem", "/etc/wfjail-openat2 (write)");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(rw.join("a")).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
}

/// `openat2` confined by the guest's own `RESOLVE_BENEATH` or `RESOLVE_IN_ROOT` is opened
/// from the guest's directory when that lies in a grant, with the guest's rules; with
/// `RESOLVE_IN_ROOT` in a directory outside the grants, the path is not the host's: before,
/// `/GRANT/x` was judged granted and Landlock's refusal went unreported.
#[test]
fn openat2_confined_to_the_guests_directory_keeps_its_rules_and_its_report() {
    let scratch = Scratch::new("openat2-root");
    let rw = scratch.path("rw");
    let other = scratch.path("other");
    std::fs::create_dir_all(rw.join("sub")).unwrap();
    // The host path the guest names, also present under `other`: outside the grants.
    std::fs::create_dir_all(other.join(rw.strip_prefix("/").unwrap())).unwrap();
    std::os::unix::fs::symlink("/etc", rw.join("out")).unwrap();
    let code = format!(
        "import ctypes, os\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         class How(ctypes.Structure):\n\
         \x20   _fields_ = [('flags', ctypes.c_uint64), ('mode', ctypes.c_uint64), ('resolve', ctypes.c_uint64)]\n\
         def openat2(d, path, resolve):\n\
         \x20   how = How(os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600, resolve)\n\
         \x20   fd = libc.syscall(437, d, path.encode(), ctypes.byref(how), ctypes.sizeof(how))\n\
         \x20   if fd < 0:\n\
         \x20       return 'errno %d' % ctypes.get_errno()\n\
         \x20   os.write(fd, b'x'); os.close(fd)\n\
         \x20   return 'ok'\n\
         rw = os.open('{rw}', os.O_PATH | os.O_DIRECTORY)\n\
         sub = os.open('{rw}/sub', os.O_PATH | os.O_DIRECTORY)\n\
         other = os.open('{other}', os.O_PATH | os.O_DIRECTORY)\n\
         print('in_root', openat2(rw, '/sub/a', 0x10))\n\
         print('in_root_up', openat2(sub, '../../b', 0x10))\n\
         print('beneath', openat2(rw, 'sub/c', 0x08))\n\
         print('beneath_up', openat2(sub, '../d', 0x08))\n\
         print('beneath_link_out', openat2(rw, 'out/wfjail-x', 0x08))\n\
         print('in_root_outside', openat2(other, '{rw}/e', 0x10))\n",
        rw = s(&rw),
        other = s(&other),
    );
    let o = py(
        "default",
        &[
            "--rw",
            rw.to_str().unwrap(),
            "--ro",
            other.to_str().unwrap(),
            "--ro",
            "/usr/lib/x86_64-linux-gnu",
        ],
        &code,
    );
    for (case, want) in [
        ("in_root", "ok"),
        ("in_root_up", "ok"), // `..` stops at the guest's root: sub/b
        ("beneath", "ok"),
        ("beneath_up", "errno 18"), // EXDEV: the guest's own rule
        ("beneath_link_out", "errno 18"),
        ("in_root_outside", "errno 13"),
    ] {
        o.check(
            o.stdout.lines().any(|l| l == format!("{case} {want}")),
            &format!("{case}: {want}"),
        );
    }
    for made in ["sub/a", "sub/b", "sub/c"] {
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(rw.join(made)).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600, "{made}, with the guest's umask");
    }
    assert!(!rw.join("d").exists() && !std::path::Path::new("/etc/wfjail-x").exists());
    assert_reported(&o, "openat2", "filesystem", "in root");
    o.check(
        violations(&o, "openat2").len() == 1,
        "the guest's own EXDEVs are no violations",
    );
}

#[test]
fn a_fifo_opened_for_writing_does_not_block_the_supervisor() {
    // The supervisor opens write-opens for the guest (opener.rs): a FIFO with no reader
    // must not hang it. It opens non-blocking, so the guest gets ENXIO at once (the kernel
    // would have blocked the guest), and the run goes on to its end and its deadline.
    let scratch = Scratch::new("fifo");
    let rw = scratch.path("rw");
    std::fs::create_dir_all(&rw).unwrap();
    let fifo = std::ffi::CString::new(rw.join("pipe").to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path; mkfifo only creates the node.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o666) }, 0);
    let code = format!(
        "import os\nfor i in range(3):\n    try:\n        os.open('{}/pipe', os.O_WRONLY)\n    except OSError as e:\n        print('errno', e.errno)\nprint('done')\n",
        s(&rw)
    );
    let o = py(
        "default",
        &["--rw", rw.to_str().unwrap(), "--timeout", "10s"],
        &code,
    );
    o.check(
        o.status() == "ok" && o.stdout.matches("errno 6").count() == 3 && o.stdout.contains("done"),
        "ENXIO three times, then the guest ends",
    );
}

#[test]
fn write_grants_too_large_to_account_refuse_a_disk_limited_run() {
    // limits.disk cannot judge more than 100,000 entries: a refusal, never a pass (a guest
    // that makes that many while it runs is killed the same way).
    let scratch = Scratch::new("disk-many");
    let rw = scratch.path("rw");
    std::fs::create_dir_all(&rw).unwrap();
    for i in 0..100_001 {
        std::fs::File::create(rw.join(i.to_string())).unwrap();
    }
    let policy = scratch.write(
        "disk.toml",
        "extends = \"default\"\n[limits]\ndisk = \"16MiB\"\n",
    );
    let o = py(
        policy.to_str().unwrap(),
        &["--rw", rw.to_str().unwrap()],
        "print('ran')",
    );
    o.check(
        o.code == 125 && !o.stdout.contains("ran") && o.stderr.contains("limits.disk"),
        "exit 125 before the guest runs, naming limits.disk",
    );
}

// ---- limits.disk walked around (issue 16, part D) --------------------------------------------

/// A policy with `disk = "16MiB"` and a fresh `--rw` directory, in `scratch`.
fn disk_limited(scratch: &Scratch) -> (std::path::PathBuf, std::path::PathBuf) {
    let out = scratch.path("out");
    std::fs::create_dir(&out).unwrap();
    let policy = scratch.write(
        "disk.toml",
        "extends = \"default\"\n[limits]\ndisk = \"16MiB\"\n",
    );
    (policy, out)
}

/// Asserts the run ended `limit`, limit `disk`, exit 5, before the guest said `done`.
fn assert_disk_limit(o: &Outcome, what: &str) {
    o.check(
        o.code == 5 && o.status() == "limit" && o.report["limit"] == "disk",
        &format!("{what}: status limit, limit disk, exit 5"),
    );
    o.check(
        !o.stdout.contains("done"),
        &format!("{what}: killed before the end"),
    );
}

#[test]
fn limits_disk_counts_unlinked_files_held_only_by_a_mapping() {
    // 14 files of 12 MiB, each mapped by one shared page, closed and unlinked: no name and no
    // descriptor hold them, only the mapping; 168 MiB stayed allocated while the run was ok.
    let scratch = Scratch::new("disk-mapped");
    let (policy, out) = disk_limited(&scratch);
    // ctypes' mmap: Python's mmap.mmap keeps a duplicate of the descriptor.
    let code = format!(
        "import ctypes, os, time\nlibc = ctypes.CDLL(None, use_errno=True)\n\
         libc.mmap.restype = ctypes.c_void_p\n\
         libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]\n\
         for i in range(14):\n    p = '{}/m%d' % i\n    \
         fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o600)\n    os.write(fd, b'x' * (12 << 20))\n    \
         assert libc.mmap(None, 4096, 1, 1, fd, 0) not in (None, 2**64 - 1)\n    \
         os.close(fd)\n    os.unlink(p)\n\
         time.sleep(1)\nprint('done')\n",
        s(&out)
    );
    let o = py(policy.to_str().unwrap(), &["--rw", &s(&out)], &code);
    assert_disk_limit(&o, "168 MiB held by mappings");
}

#[test]
fn limits_disk_counts_files_buried_below_path_max() {
    // A chain of 15 directories with 250-byte names, then 12 MiB at a time written in a short
    // path and moved below it: each file ends beyond 4,096 bytes of path, which a walk by
    // absolute path cannot read (ENAMETOOLONG) and skipped silently.
    let scratch = Scratch::new("disk-deep");
    let (policy, out) = disk_limited(&scratch);
    let code = format!(
        "import os, time\nroot = '{}'\nn = 'd' * 250\na = root + '/a'\nos.mkdir(a)\n\
         for i in range(15):\n    a += '/' + n\n    os.mkdir(a)\n\
         for i in range(14):\n    b = root + '/b%d' % i\n    os.makedirs(b + '/' + n + '/' + n)\n    \
         with open(b + '/' + n + '/' + n + '/f', 'wb') as f:\n        f.write(b'x' * (12 << 20))\n    \
         os.rename(b, a + '/b%d' % i)\n\
         time.sleep(1)\nprint('done')\n",
        s(&out)
    );
    let o = py(policy.to_str().unwrap(), &["--rw", &s(&out)], &code);
    assert_disk_limit(&o, "168 MiB below PATH_MAX");
}

#[test]
fn limits_disk_counts_symbolic_links() {
    // Symbolic links with 4,000-byte targets take a block each (ext4): 41,000 of them are
    // 160 MiB that the walk never counted.
    let scratch = Scratch::new("disk-links");
    let (policy, out) = disk_limited(&scratch);
    let code = format!(
        "import os, time\nt = 'a' * 4000\nfor i in range(41000):\n    os.symlink(t, '{}/s%d' % i)\n\
         time.sleep(1)\nprint('done')\n",
        s(&out)
    );
    let o = py(
        policy.to_str().unwrap(),
        &["--rw", &s(&out), "--timeout", "120s"],
        &code,
    );
    assert_disk_limit(&o, "41,000 long symbolic links");
}

/// `code` in Python under a policy with `disk = "16MiB"` and `--rw` of a fresh directory
/// (passed as `{0}` in `code`), wfjail run as nobody.
fn disk_limited_as_nobody(tag: &str, code: &str) -> Outcome {
    use std::os::unix::fs::PermissionsExt;
    let scratch = Scratch::new(tag);
    let (policy, out) = disk_limited(&scratch);
    let open = |p: &std::path::Path, mode| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    open(&out, 0o777);
    open(&policy, 0o644);
    let reports = scratch.path("reports");
    std::fs::create_dir(&reports).unwrap();
    open(&reports, 0o777);
    let bin = crate::common::reachable_copy(&scratch, &wfjail_bin());
    let code = code.replace("{0}", &s(&out));
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(&bin)
        .current_dir(&out);
    let o = run_reported(
        cmd,
        &[
            "run",
            "-p",
            policy.to_str().unwrap(),
            "--rw",
            &s(&out),
            "--raw",
            "--",
            PY,
            "-c",
            &code,
        ],
        &reports.join("report.json"),
    );
    // What the guest left, whatever its modes, for Scratch to remove.
    let _ = Command::new("chmod")
        .arg("-R")
        .arg("u+rwx")
        .arg(&out)
        .status();
    o
}

#[test]
fn an_unprivileged_wfjail_refuses_unlinked_mapped_files_it_cannot_measure() {
    // /proc/PID/map_files needs CAP_CHECKPOINT_RESTORE: as nobody, wfjail cannot measure an
    // unlinked file the guest keeps mapped, which is "cannot judge": a refusal, said why.
    let o = disk_limited_as_nobody(
        "disk-mapped-nobody",
        "import ctypes, os, time\nlibc = ctypes.CDLL(None)\nlibc.mmap.restype = ctypes.c_void_p\n\
         libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]\n\
         fd = os.open('{0}/m', os.O_RDWR | os.O_CREAT, 0o600)\nos.write(fd, b'x' * (1 << 20))\n\
         libc.mmap(None, 4096, 1, 1, fd, 0)\nos.close(fd)\nos.unlink('{0}/m')\ntime.sleep(2)\nprint('done')\n",
    );
    assert_disk_limit(&o, "1 MiB mapped, unmeasurable");
    o.check(
        o.error_says("may not measure"),
        "the report says why wfjail could not judge",
    );
}

#[test]
fn an_unprivileged_wfjail_refuses_a_directory_it_cannot_read() {
    // A directory made write-only (0300) by the guest: its files can be written by name, but
    // nobody but root can list it. The walk skipped it silently; now it cannot judge.
    let o = disk_limited_as_nobody(
        "disk-unreadable-nobody",
        "import os, time\nd = '{0}/d'\nos.mkdir(d, 0o300)\nfor i in range(14):\n    \
         with open(d + '/f%d' % i, 'wb') as f:\n        f.write(b'x' * (12 << 20))\n\
         time.sleep(1)\nprint('done')\n",
    );
    assert_disk_limit(&o, "168 MiB in a directory wfjail cannot list");
    o.check(
        o.error_says("cannot be read (EACCES"),
        "the report says which grant wfjail could not read",
    );
}

/// Python for `--rw OUT` that writes 3 files of 12 MiB, sends a descriptor of each over its
/// own socket pair (SCM_RIGHTS), then closes and unlinks it: a message in flight would keep
/// 36 MiB alive where no /proc file shows it. Prints `errno=N` for each refused send.
fn sent_in_flight(out: &std::path::Path) -> String {
    format!(
        "import os, socket, time\na, b = socket.socketpair()\nfor i in range(3):\n    \
         p = '{}/s%d' % i\n    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o600)\n    \
         os.write(fd, b'x' * (12 << 20))\n    \
         try:\n        socket.send_fds(a, [b'x'], [fd])\n        print('sent')\n    \
         except OSError as e:\n        print('errno=%d' % e.errno)\n    \
         os.close(fd)\n    os.unlink(p)\n\
         time.sleep(0.3)\nprint('done')\n",
        s(out)
    )
}

#[test]
fn limits_disk_refuses_descriptors_sent_in_messages() {
    // Files held only by descriptors in flight: sendmsg and sendmmsg fail with EPERM under
    // limits.disk (a filter stacked after the listener went to the parent), so that no file
    // outlives its last name and descriptor unseen.
    let scratch = Scratch::new("disk-in-flight");
    let (policy, out) = disk_limited(&scratch);
    let o = py(
        policy.to_str().unwrap(),
        &["--rw", &s(&out)],
        &sent_in_flight(&out),
    );
    o.check(
        o.report["layers"]["seccomp"] == "user-notify",
        "the supervisor still got its listener (sent with sendmsg before the stacked filter)",
    );
    o.check(
        o.stdout == "errno=1\nerrno=1\nerrno=1\ndone\n" && o.status() == "ok",
        "every send refused with EPERM; nothing held",
    );
    // Without limits.disk, a pair carries descriptors as before.
    let o = py("default", &["--rw", &s(&out)], &sent_in_flight(&out));
    o.check(
        o.stdout.matches("sent").count() == 3,
        "sent without limits.disk",
    );
}

#[test]
fn limits_disk_refuses_descriptors_sent_in_messages_without_a_listener() {
    let scratch = Scratch::new("disk-in-flight-fallback");
    let (policy, out) = disk_limited(&scratch);
    let mut cmd = Command::new(crate::common::container_sim());
    cmd.args(["--deny-notify", "--"]).arg(wfjail_bin());
    let o = run_reported(
        cmd,
        &[
            "run",
            "-p",
            policy.to_str().unwrap(),
            "--rw",
            &s(&out),
            "--raw",
            "--",
            PY,
            "-c",
            &sent_in_flight(&out),
        ],
        &scratch.path("report.json"),
    );
    o.check(
        o.report["layers"]["seccomp"] != "user-notify",
        "no listener: the fall-back program",
    );
    o.check(
        o.stdout == "errno=1\nerrno=1\nerrno=1\ndone\n",
        "every send refused with EPERM",
    );
}

// ---- limits.disk, a hostile-guest pass (issue 16, "Done when") --------------------------------

#[test]
fn limits_disk_counts_unlinked_files_whose_path_the_kernel_cannot_show() {
    // 14 files of 12 MiB, each unlinked while a read-only descriptor holds it, then its
    // directory moved below PATH_MAX: the kernel cannot show the descriptor's path
    // (readlink fails with ENAMETOOLONG), which the account took as "not the guest's";
    // 168 MiB stayed allocated while the run was ok.
    let scratch = Scratch::new("disk-unlinked-deep");
    let (policy, out) = disk_limited(&scratch);
    let code = format!(
        "import os, time\nroot = '{}'\nn = 'd' * 250\na = root + '/a'\nos.mkdir(a)\n\
         for i in range(15):\n    a += '/' + n\n    os.mkdir(a)\n\
         held = []\n\
         for i in range(14):\n    b = root + '/b%d' % i\n    os.makedirs(b + '/' + n + '/' + n)\n    \
         d = os.open(b + '/' + n + '/' + n, os.O_RDONLY | os.O_DIRECTORY)\n    \
         fd = os.open('f', os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=d)\n    \
         os.write(fd, b'x' * (12 << 20))\n    os.close(fd)\n    \
         held.append(os.open('f', os.O_RDONLY, dir_fd=d))\n    \
         os.unlink('f', dir_fd=d)\n    os.close(d)\n    os.rename(b, a + '/b%d' % i)\n\
         time.sleep(1)\nprint('done')\n",
        s(&out)
    );
    let o = py(policy.to_str().unwrap(), &["--rw", &s(&out)], &code);
    assert_disk_limit(&o, "168 MiB unlinked below PATH_MAX");
}

/// A thread started without CLONE_FILES (a descriptor table of its own) writes 14 files of
/// 12 MiB under `argv[1]`, unlinks each and keeps them open; the program says `held`, waits
/// 2 s, says `done`.
const OWN_TABLE_THREAD_C: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static const char *root;
static volatile int ready;
static char buf[1 << 20];
static int thread(void *arg) {
    char p[4096];
    (void)arg;
    memset(buf, 'x', sizeof buf);
    for (int i = 0; i < 14; i++) {
        snprintf(p, sizeof p, "%s/f%d", root, i);
        int fd = open(p, O_RDWR | O_CREAT, 0600);
        if (fd < 0) { perror("open"); break; }
        for (int j = 0; j < 12; j++) if (write(fd, buf, sizeof buf) < 0) perror("write");
        unlink(p);
    }
    ready = 1;
    for (;;) pause();
}
int main(int argc, char **argv) {
    root = argv[1];
    char *stack = malloc(1 << 20);
    if (clone(thread, stack + (1 << 20),
              CLONE_VM | CLONE_FS | CLONE_SIGHAND | CLONE_THREAD | CLONE_SYSVSEM, NULL) < 0) {
        perror("clone");
        return 1;
    }
    while (!ready) usleep(1000);
    printf("held\n"); fflush(stdout);
    sleep(2);
    printf("done\n"); fflush(stdout);
    exit(0);
}
"#;

#[test]
fn limits_disk_counts_files_held_by_a_thread_with_its_own_descriptor_table() {
    // A thread made without CLONE_FILES holds 168 MiB of unlinked files in a descriptor table
    // that /proc/PID/fd (the leader's) does not show: the run was ok.
    let scratch = Scratch::new("disk-own-table");
    let o = c_under_disk_limit_with_threads(&scratch, OWN_TABLE_THREAD_C);
    assert_disk_limit(&o, "168 MiB held by a thread's own descriptor table");
}

/// Without a PID namespace: a child of the guest outlives it, holding the guest's stdout so
/// that wfjail drains, and an empty file `big` in the grant. Once the guest is gone it bumps
/// the mtime of `Z` (2,000 empty files, walked after the grant's own entries), closes its
/// streams, waits until wfjail's last walk has read `Z` (its atime passes its mtime), then
/// allocates 48 MiB to `big`, which that walk has already passed.
const OUTLIVING_CHILD_C: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
int main(int argc, char **argv) {
    const char *root = argv[1];
    char z[4096], p[4096];
    snprintf(z, sizeof z, "%s/Z", root);
    if (mkdir(z, 0700) < 0) { perror("mkdir"); return 1; }
    for (int i = 0; i < 2000; i++) {
        snprintf(p, sizeof p, "%s/f%d", z, i);
        int f = open(p, O_WRONLY | O_CREAT, 0600);
        if (f < 0) { perror("create"); return 1; }
        close(f);
    }
    snprintf(p, sizeof p, "%s/big", root);
    int big = open(p, O_WRONLY | O_CREAT, 0600);
    int zfd = open(z, O_RDONLY | O_DIRECTORY);
    int pp[2];
    if (big < 0 || zfd < 0 || pipe(pp) < 0) { perror("open"); return 1; }
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); return 1; }
    if (pid == 0) {
        char c;
        close(pp[1]);
        while (read(pp[0], &c, 1) > 0) {}
        snprintf(p, sizeof p, "%s/t", z);
        close(open(p, O_WRONLY | O_CREAT, 0600));
        unlink(p);
        close(0); close(1); close(2);
        struct stat st;
        for (;;) {
            if (fstat(zfd, &st) < 0) _exit(1);
            if (st.st_atim.tv_sec > st.st_mtim.tv_sec ||
                (st.st_atim.tv_sec == st.st_mtim.tv_sec &&
                 st.st_atim.tv_nsec >= st.st_mtim.tv_nsec)) break;
        }
        fallocate(big, 0, 0, 48 << 20);
        _exit(0);
    }
    close(pp[0]);
    printf("done\n");
    fflush(stdout);
    return 0;
}
"#;

#[test]
fn limits_disk_judges_after_what_the_guest_started_is_gone() {
    // Without a PID namespace, what the guest started lives on until its pids cgroup is
    // emptied, after the check at the guest's exit: a child allocated 48 MiB right after
    // that check had walked past its file, and the run was ok with 48 MiB left under 16 MiB.
    let scratch = Scratch::new("disk-outliving");
    let bin_dir = scratch.path("bin");
    std::fs::create_dir(&bin_dir).unwrap();
    let src = scratch.write("outliving.c", OUTLIVING_CHILD_C);
    let bin = bin_dir.join("outliving");
    crate::common::cc(&["-O1"], &src, &bin);
    let policy = scratch.write(
        "disk-fork-nopid.toml",
        "extends = \"default\"\n[process]\nsubprocess = \"allow\"\n\
         [limits]\nprocesses = 16\ndisk = \"16MiB\"\n[namespaces]\npid = false\nmount = false\n",
    );
    // Whether the child allocates before wfjail ends it is the scheduler's: each run must be
    // judged by what is on disk at its end (over the limit: `limit`; nothing: ok), and the
    // child must have won the race at least once for the test to show anything.
    let mut allocated = 0;
    for attempt in 0..5 {
        let out = scratch.path(&format!("out{attempt}"));
        std::fs::create_dir(&out).unwrap();
        let o = run_raw_with_out(&policy, &bin_dir, &bin, &out);
        use std::os::unix::fs::MetadataExt;
        let on_disk = std::fs::metadata(out.join("big")).map_or(0, |m| m.blocks() * 512);
        if on_disk >= 48 << 20 {
            allocated += 1;
            o.check(
                o.code == 5 && o.status() == "limit" && o.report["limit"] == "disk",
                "48 MiB allocated after the guest's exit: status limit, limit disk, exit 5",
            );
            break;
        } else {
            o.check(
                o.code == 0 && o.status() == "ok",
                "the child was ended before it allocated: ok",
            );
        }
    }
    assert!(
        allocated > 0,
        "in 5 runs the child never allocated before it was ended: nothing was shown"
    );
}

/// A thread maps 14 files of 12 MiB under `argv[1]` by one shared page each, closes and
/// unlinks them, while the thread-group leader has left (`SYS_exit`): the process lives on
/// in the thread, says `done` after 2 s.
const LEADER_GONE_C: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
static const char *root;
static char buf[1 << 20];
static void *holder(void *arg) {
    char p[4096];
    (void)arg;
    memset(buf, 'x', sizeof buf);
    usleep(100000);
    for (int i = 0; i < 14; i++) {
        snprintf(p, sizeof p, "%s/m%d", root, i);
        int fd = open(p, O_RDWR | O_CREAT, 0600);
        if (fd < 0) { perror("open"); exit(1); }
        for (int j = 0; j < 12; j++) if (write(fd, buf, sizeof buf) < 0) perror("write");
        if (mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0) == MAP_FAILED) { perror("mmap"); exit(1); }
        close(fd);
        unlink(p);
    }
    sleep(2);
    printf("done\n"); fflush(stdout);
    exit(0);
}
int main(int argc, char **argv) {
    pthread_t t;
    root = argv[1];
    if (pthread_create(&t, NULL, holder, NULL)) { perror("pthread_create"); return 1; }
    syscall(SYS_exit, 0);
    return 0;
}
"#;

/// `program` (C) compiled by `cc` into `scratch`, run under `disk = "16MiB"` with threads
/// allowed, `--rw` of a fresh directory (its one argument).
fn c_under_disk_limit_with_threads(scratch: &Scratch, program: &str) -> Outcome {
    c_under_disk_limit(scratch, program, "[process]\nthreads = \"allow\"\n")
}

/// `program` (C) compiled by `cc` into `scratch`, run under `disk = "16MiB"`,
/// `processes = 16` and `more` (TOML tables), `--rw` of a fresh directory (its one
/// argument).
fn c_under_disk_limit(scratch: &Scratch, program: &str, more: &str) -> Outcome {
    let out = scratch.path("out");
    std::fs::create_dir(&out).unwrap();
    let bin_dir = scratch.path("bin");
    std::fs::create_dir(&bin_dir).unwrap();
    let src = scratch.write("guest.c", program);
    let bin = bin_dir.join("guest");
    crate::common::cc(&["-O1", "-pthread"], &src, &bin);
    let policy = scratch.write(
        "disk.toml",
        &format!("extends = \"default\"\n{more}[limits]\nprocesses = 16\ndisk = \"16MiB\"\n"),
    );
    run_raw_with_out(&policy, &bin_dir, &bin, &out)
}

/// `wfjail run --raw` of `bin` under `policy`, its directory read-only and `out` writable
/// (its one argument).
fn run_raw_with_out(
    policy: &std::path::Path,
    bin_dir: &std::path::Path,
    bin: &std::path::Path,
    out: &std::path::Path,
) -> Outcome {
    crate::common::wfjail(&[
        "run",
        "-p",
        policy.to_str().unwrap(),
        "--rw",
        &s(out),
        "--ro",
        &s(bin_dir),
        "--raw",
        "--",
        bin.to_str().unwrap(),
        &s(out),
    ])
}

#[test]
fn limits_disk_counts_mappings_of_a_process_whose_leader_has_left() {
    // The thread-group leader exits alone: /proc/PID/maps (and map_files) then show nothing,
    // while its thread keeps 168 MiB of unlinked files mapped; the run was ok.
    let scratch = Scratch::new("disk-leader-gone");
    let o = c_under_disk_limit_with_threads(&scratch, LEADER_GONE_C);
    assert_disk_limit(&o, "168 MiB mapped by a thread whose leader has left");
}

/// Without a PID namespace: the guest's child starts a grandchild and exits; the grandchild,
/// no longer the guest's descendant, writes 14 files of 12 MiB, unlinks them and keeps them
/// open; the guest says `done` after 2 s.
const ORPHAN_HOLDS_C: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
static char buf[1 << 20];
int main(int argc, char **argv) {
    char p[4096];
    if (fork() == 0) {
        if (fork() == 0) {
            close(0); close(1); close(2);
            usleep(200000);
            memset(buf, 'x', sizeof buf);
            for (int i = 0; i < 14; i++) {
                snprintf(p, sizeof p, "%s/o%d", argv[1], i);
                int fd = open(p, O_RDWR | O_CREAT, 0600);
                if (fd < 0) _exit(1);
                for (int j = 0; j < 12; j++) if (write(fd, buf, sizeof buf) < 0) _exit(1);
                unlink(p);
            }
            sleep(5);
            _exit(0);
        }
        _exit(0);
    }
    sleep(2);
    printf("done\n");
    fflush(stdout);
    return 0;
}
"#;

#[test]
fn limits_disk_counts_files_held_by_an_orphan_of_the_guest() {
    // Without a PID namespace, a process whose parent exited is adopted outside the guest's
    // tree (/proc/PID/task/*/children no longer leads to it); it held 168 MiB of unlinked
    // files while the run was ok. Its pids cgroup still lists it.
    let scratch = Scratch::new("disk-orphan");
    let o = c_under_disk_limit(
        &scratch,
        ORPHAN_HOLDS_C,
        "[process]\nsubprocess = \"allow\"\n[namespaces]\npid = false\nmount = false\n",
    );
    assert_disk_limit(&o, "168 MiB held by an orphan");
}

#[test]
fn an_unprivileged_wfjail_refuses_a_guest_that_hides_its_descriptors() {
    // A guest that makes itself not dumpable (prctl PR_SET_DUMPABLE 0) makes its /proc
    // files root's: wfjail as nobody can read neither its descriptors nor its mappings, and
    // took that as "nothing held" while 168 MiB of unlinked files were held open.
    let o = disk_limited_as_nobody(
        "disk-undumpable-nobody",
        "import ctypes, os, time\nlibc = ctypes.CDLL(None, use_errno=True)\n\
         assert libc.prctl(4, 0, 0, 0, 0) == 0, ctypes.get_errno()\nheld = []\n\
         for i in range(14):\n    p = '{0}/u%d' % i\n    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o600)\n    \
         os.write(fd, b'x' * (12 << 20))\n    os.unlink(p)\n    held.append(fd)\n\
         time.sleep(1)\nprint('done')\n",
    );
    assert_disk_limit(&o, "168 MiB held by a guest that is not dumpable");
    o.check(
        o.error_says("not dumpable"),
        "the report says why wfjail could not judge",
    );
}

#[test]
fn limits_disk_counts_removed_directories_held_open() {
    // A directory keeps the blocks its entries took when they go (2,500 names of 245 bytes:
    // ~0.9 MiB); emptied, opened and removed, it kept them, held by the descriptor alone,
    // which the account skipped (not a regular file): three held 2.7 MiB under 1 MiB, ok.
    let scratch = Scratch::new("disk-held-dirs");
    let out = scratch.path("out");
    std::fs::create_dir(&out).unwrap();
    let policy = scratch.write(
        "disk.toml",
        "extends = \"default\"\n[limits]\ndisk = \"1MiB\"\n",
    );
    let code = format!(
        "import os, time\nroot = '{}'\nheld = []\nn = 'n' * 240\n\
         for k in range(3):\n    d = root + '/d%d' % k\n    os.mkdir(d)\n    \
         for i in range(2500):\n        os.close(os.open('%s/%s%05d' % (d, n, i), os.O_WRONLY | os.O_CREAT, 0o600))\n    \
         for i in range(2500):\n        os.unlink('%s/%s%05d' % (d, n, i))\n    \
         held.append(os.open(d, os.O_RDONLY | os.O_DIRECTORY))\n    os.rmdir(d)\n\
         time.sleep(1)\nprint('done')\n",
        s(&out)
    );
    let o = py(
        policy.to_str().unwrap(),
        &["--rw", &s(&out), "--timeout", "120s"],
        &code,
    );
    assert_disk_limit(&o, "removed directories held open");
}

#[test]
fn limits_disk_counts_a_removed_working_directory() {
    // The same as a directory held by a descriptor, held by the working directory alone
    // (chdir, then rmdir): 0.9 MiB out of sight, beside 0.9 MiB in sight, under 1 MiB: ok.
    let scratch = Scratch::new("disk-held-cwd");
    let out = scratch.path("out");
    std::fs::create_dir(&out).unwrap();
    let policy = scratch.write(
        "disk.toml",
        "extends = \"default\"\n[limits]\ndisk = \"1MiB\"\n",
    );
    let code = format!(
        "import os, time\nroot = '{}'\nn = 'n' * 240\n\
         for k in range(2):\n    d = root + '/d%d' % k\n    os.mkdir(d)\n    \
         for i in range(2500):\n        os.close(os.open('%s/%s%05d' % (d, n, i), os.O_WRONLY | os.O_CREAT, 0o600))\n    \
         if k == 0:\n        for i in range(2500):\n            os.unlink('%s/%s%05d' % (d, n, i))\n        \
         os.chdir(d)\n        os.rmdir(d)\n\
         time.sleep(1)\nprint('done')\n",
        s(&out)
    );
    let o = py(
        policy.to_str().unwrap(),
        &["--rw", &s(&out), "--timeout", "120s"],
        &code,
    );
    assert_disk_limit(&o, "a removed working directory");
}

// ---- list grants ----------------------------------------------------------------------------

/// A directory holding a module, a key and a subdirectory, and a policy that lists it and
/// grants the module alone (`extra`: more of the policy file).
fn listed_dir(extra: &str) -> (Scratch, std::path::PathBuf) {
    let dir = Scratch::new("list");
    std::fs::create_dir(dir.path("sub")).unwrap();
    dir.write("sub/inner.txt", "inner");
    dir.write("mod.py", "X = 'imported'\n");
    dir.write("client.key", "SECRET");
    let policy = dir.write(
        "policy.toml",
        &format!(
            "extends = \"default\"\n{extra}\n[filesystem]\nlist = [\"{d}\"]\nread = [\"{d}/mod.py\"]\n",
            d = dir.0.display()
        ),
    );
    (dir, policy)
}

#[test]
fn a_list_grant_lists_directories_and_reads_no_file_but_those_granted() {
    let (dir, policy) = listed_dir("");
    // Python finds the module by listing the directory (FileFinder), then reads the one file.
    let code = format!(
        "import os, sys\nd = {d:?}\nprint(sorted(os.listdir(d)), os.listdir(d + '/sub'))\n\
         sys.path.insert(0, d)\nimport mod\nprint(mod.X)\n{}{}",
        errno_of("open(d + '/client.key').read()"),
        errno_of("open(d + '/sub/inner.txt').read()"),
        d = s(&dir.0)
    );
    let o = py(&s(&policy), &[], &code);
    o.check(
        o.stdout
            == "['client.key', 'mod.py', 'policy.toml', 'sub'] ['inner.txt']\nimported\n\
                errno=13\nerrno=13\n",
        "listed, imported, and the key and the inner file refused with EACCES",
    );
    o.check(
        o.code == 0 && o.status() == "ok",
        "a refused read is no violation",
    );
}

#[test]
fn under_warn_a_listed_directory_is_no_violation_and_a_file_there_is() {
    let (dir, policy) = listed_dir("on_violation = \"warn\"");
    let code = format!(
        "import os\nd = {d:?}\nprint(len(os.listdir(d)), os.listdir(d + '/sub'), open(d + '/client.key').read())\n",
        d = s(&dir.0)
    );
    let o = py(&s(&policy), &[], &code);
    o.check(
        o.stdout == "4 ['inner.txt'] SECRET\n",
        "warn lets everything through",
    );
    let key = format!("{} (read)", s(&dir.path("client.key")));
    let reads: Vec<&str> = violations(&o, "openat")
        .into_iter()
        .filter_map(|v| v["args"].as_str())
        .filter(|a| a.contains(&s(&dir.0)))
        .collect();
    o.check(
        reads == [key.as_str()],
        "the key's read is reported, the listings are not",
    );
}

#[test]
fn a_file_in_a_list_grant_is_an_error_naming_its_line() {
    let dir = Scratch::new("list-file");
    let key = dir.write("client.key", "SECRET");
    let policy = dir.write(
        "policy.toml",
        &format!(
            "extends = \"default\"\n[filesystem]\nlist = [\"{}\"]\n",
            s(&key)
        ),
    );
    let o = py(&s(&policy), &[], "pass");
    o.check(o.code == 2, "exit 2");
    o.check(
        o.stderr.contains(&format!(
            "{}:3:9: \"{}\" is not a directory: [filesystem] list takes directories (grant a file with read)",
            s(&policy),
            s(&key)
        )),
        "the error names the file, line and column, and what to do",
    );
}

#[test]
fn drop_takes_away_a_list_grant() {
    let (dir, policy) = listed_dir("");
    let child = dir.write(
        "child.toml",
        &format!(
            "extends = \"{}\"\n[filesystem]\ndrop = [\"{}\"]\n",
            s(&policy),
            s(&dir.0)
        ),
    );
    let o = py(
        &s(&child),
        &[],
        &errno_of(&format!("import os; os.listdir({:?})", s(&dir.0))),
    );
    o.check(
        o.stdout == "errno=13\n",
        "the directory is no longer listed",
    );
}
