//! `wfjail learn` against a hostile program (issue 16): learning observes without giving
//! anything away. Each test runs a program that attacks the learning run or the run that
//! verifies the draft, through the real `wfjail learn`, and checks what landed on the host
//! (a scratch directory under /tmp stands for "the host outside the grants"), what reached a
//! listener the test opened, and what the draft grants and says.

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};

use crate::common::{PY, REPO, Scratch, wfjail_bin};

/// `wfjail ARGS` with an empty stdin: (exit code, stdout, stderr).
fn wfjail(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(wfjail_bin())
        .args(args)
        .current_dir(REPO)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `wfjail learn -p POLICY --raw EXTRA... -- python3 SCRIPT` for a script written into the
/// scratch dir's `app/` (granted --ro); the draft goes to `draft.toml`: (code, draft, stderr).
fn learn(s: &Scratch, policy: &str, extra: &[&str], script: &str) -> (i32, String, String) {
    std::fs::create_dir_all(s.path("app")).unwrap();
    let app = s.write("app/app.py", script);
    let app_dir = s.path("app");
    let draft = s.path("draft.toml");
    let mut args = vec![
        "learn",
        "-p",
        policy,
        "--output",
        draft.to_str().unwrap(),
        "--ro",
        app_dir.to_str().unwrap(),
        "--raw",
    ];
    args.extend_from_slice(extra);
    args.extend(["--", PY, app.to_str().unwrap()]);
    let (rc, _, err) = wfjail(&args);
    let text = std::fs::read_to_string(&draft).unwrap_or_default();
    (rc, text, err)
}

/// The first finding: a write refused in the learning run became a read-write grant, and the
/// run that verified the draft made it. Now the verifying run writes into a throw-away copy
/// of each write grant: the file does not exist on the host after learn.
/// The draft `wfjail learn -p default --no-verify` writes for a program (granted by `--ro`,
/// beside a list of paths) that reads each of `files` from outside its grant, so that the
/// draft grants them (learn exits 0).
fn draft_of_reading(s: &Scratch, files: &[std::path::PathBuf]) -> String {
    std::fs::create_dir_all(s.path("prog")).unwrap();
    let list: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    let list = s.write("prog/list.json", &serde_json::to_string(&list).unwrap());
    let app = s.write(
        "prog/app.py",
        &format!(
            "import json\nfor p in json.load(open({l:?})):\n    open(p).read()\n",
            l = list.display().to_string()
        ),
    );
    let draft = s.path("draft.toml");
    let (rc, _, err) = wfjail(&[
        "learn",
        "-p",
        "default",
        "--no-verify",
        "--raw",
        "--output",
        draft.to_str().unwrap(),
        "--ro",
        s.path("prog").to_str().unwrap(),
        "--",
        PY,
        app.to_str().unwrap(),
    ]);
    assert_eq!(rc, 0, "{err}");
    std::fs::read_to_string(&draft).unwrap()
}

#[test]
fn a_write_refused_while_learning_is_not_made_by_the_verifying_run() {
    let s = Scratch::new("lh-verify");
    std::fs::create_dir_all(s.path("outside")).unwrap();
    let target = s.path("outside/planted.txt");
    let script = format!(
        "import sys\ntry:\n    open({t:?}, 'w').write('planted')\n    print('WROTE', file=sys.stderr)\nexcept OSError as e:\n    print('REFUSED', e.errno, file=sys.stderr)\n",
        t = target.display().to_string()
    );
    let (rc, draft, err) = learn(&s, "default", &[], &script);
    assert!(
        err.contains("REFUSED 13"),
        "the learning run refused it: {err}"
    );
    // The draft says what the command asked for (it is for review)...
    let dir = s.path("outside").display().to_string();
    assert!(
        draft.contains(&format!("\"{dir}\",  # openat({dir}/planted.txt (write))")),
        "{draft}"
    );
    // ...and the verifying run, which wrote it, wrote into a copy that is gone.
    assert!(
        err.contains("the command passes under the draft (its writes went to a throw-away copy"),
        "{err}"
    );
    assert_eq!(rc, 0, "{err}");
    assert!(
        !target.exists(),
        "the verifying run's write landed on the host: {err}"
    );
    assert_eq!(std::fs::read_dir(s.path("outside")).unwrap().count(), 0);
    // No copy is left mounted, nor its directory.
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains("wfjail-learn"), "{mounts}");
}

/// The second finding: a write refused under `/` granted `/` read-write. A draft never
/// grants `/` or a system directory (nor a directory above the file: `learn.rs` unit tests),
/// and says in a comment what it refused. (`--no-verify`: the build this fixes would have
/// written to `/` in the verifying run.)
#[test]
fn a_draft_never_grants_the_root_or_a_system_directory_and_says_so() {
    let s = Scratch::new("lh-floor");
    let at_root = format!("/wfjail-learn-hostile-{}", std::process::id());
    let script = format!(
        "for p in ({at_root:?}, '/etc/wfjail-learn-hostile'):\n    try:\n        open(p, 'w').write('x')\n    except OSError:\n        pass\nopen('/etc/hostname').read()\nopen('/etc/passwd').read()\n"
    );
    let (rc, draft, err) = learn(&s, "default", &["--no-verify"], &script);
    assert_eq!(rc, 0, "{err}");
    assert!(!std::path::Path::new(&at_root).exists());
    wfjail::policy::from_source("draft.toml", &draft).unwrap();
    for refused in [
        format!("#   \"/\" (write): the whole file system; openat({at_root} (write))"),
        "#   \"/etc\" (write): a system directory as a whole; openat(/etc/wfjail-learn-hostile (write))".to_string(),
    ] {
        assert!(draft.contains(&refused), "{refused} in:\n{draft}");
    }
    assert!(
        !draft.contains("write = ["),
        "no write grant at all:\n{draft}"
    );
    // Two files of /etc are granted one by one, never /etc.
    assert!(
        draft.contains("\"/etc/hostname\",") && draft.contains("\"/etc/passwd\","),
        "{draft}"
    );
    for wide in ["\"/\",", "\"/etc\","] {
        assert!(!draft.contains(wide), "{wide} granted:\n{draft}");
    }
}

/// The third finding: the learning run reads every file, and with `--rw DIR` a 0600 file
/// outside every grant was copied into DIR. Now every write grant of both runs, the user's
/// `--rw` included, is a throw-away copy: the program wrote (it says so), and nothing of it
/// is in DIR after learn.
#[test]
fn a_secret_read_while_learning_does_not_land_in_the_rw_directory() {
    let s = Scratch::new("lh-secret");
    std::fs::create_dir_all(s.path("secret")).unwrap();
    std::fs::create_dir_all(s.path("rw")).unwrap();
    let secret = s.write("secret/key", "wfjail-learn-secret-4711");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    s.write("rw/kept.txt", "the user's own file");
    let copy = s.path("rw/key-copy");
    let script = format!(
        "import sys\ndata = open({src:?}).read()\nopen({dst:?}, 'w').write(data)\nopen({kept:?}, 'w').write(data)\nprint('COPIED', len(data), file=sys.stderr)\n",
        src = secret.display().to_string(),
        dst = copy.display().to_string(),
        kept = s.path("rw/kept.txt").display().to_string(),
    );
    let rw = s.path("rw");
    let (_, draft, err) = learn(&s, "default", &["--rw", rw.to_str().unwrap()], &script);
    assert!(
        err.contains("COPIED 24"),
        "the program ran and wrote: {err}"
    );
    assert!(
        !copy.exists(),
        "the secret landed in the --rw directory: {err}"
    );
    assert_eq!(
        std::fs::read_to_string(s.path("rw/kept.txt")).unwrap(),
        "the user's own file",
        "a file of the --rw directory was overwritten"
    );
    assert_eq!(std::fs::read_dir(&rw).unwrap().count(), 1);
    // The read is in the draft, for review.
    assert!(draft.contains("secret/key (read)"), "{draft}");
}

/// Under `permissive` the learning run reached the host's loopback. Now network calls are
/// refused while learning (and in the verifying run) and recorded in the draft: a listener
/// the test opens on 127.0.0.1 accepts nothing.
#[test]
fn network_calls_while_learning_are_refused_and_recorded() {
    let s = Scratch::new("lh-net");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let script = format!(
        "import socket, sys\ntry:\n    c = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n    c.sendall(b'stolen')\n    print('CONNECTED', file=sys.stderr)\nexcept OSError as e:\n    print('REFUSED', e.errno, file=sys.stderr)\n"
    );
    let (rc, draft, err) = learn(&s, "permissive", &[], &script);
    match listener.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the listener was reached: {other:?}\n{err}"),
    }
    assert!(err.contains("REFUSED 1"), "EPERM in the guest: {err}");
    assert!(!err.contains("CONNECTED"), "{err}");
    assert!(
        draft.contains("mode = \"allow\"  # socket(AF_INET SOCK_STREAM")
            && draft.contains("refused while learning"),
        "{draft}"
    );
    // The verifying run does not get the network either, and says it could not verify.
    assert_ne!(rc, 0, "{err}");
    assert!(
        err.contains("not verified: learn never gives an unreviewed draft the network"),
        "{err}"
    );
}

/// A socket on the host's file system is reachable from an empty network namespace: under
/// `default`, the learning run let `socket()` through (warn) and connected to it. Now it is
/// refused and recorded, and the verifying run, which would need the network, says that it
/// could not verify the draft.
#[test]
fn a_unix_socket_on_the_host_is_not_reached_while_learning() {
    let s = Scratch::new("lh-unix");
    let path = s.path("host.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    listener.set_nonblocking(true).unwrap();
    let script = format!(
        "import socket, sys\nc = socket.socket(socket.AF_UNIX)\nc.connect({p:?})\nc.sendall(b'stolen')\nprint('CONNECTED', file=sys.stderr)\n",
        p = path.display().to_string()
    );
    let (rc, draft, err) = learn(&s, "default", &[], &script);
    match listener.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the host's socket was reached: {other:?}\n{err}"),
    }
    assert!(!err.contains("CONNECTED"), "{err}");
    assert!(
        draft.contains("mode = \"allow\"  # socket(AF_UNIX SOCK_STREAM"),
        "{draft}"
    );
    assert_ne!(rc, 0, "{err}");
    assert!(
        err.contains("not verified: learn never gives an unreviewed draft the network"),
        "{err}"
    );
}

/// Landlock does not check file metadata changes: under `warn`, the learning run changed the
/// mode and times of a host file outside every grant. Now they are refused and recorded
/// (the draft lists the syscalls, for review), and not given to the verifying run.
#[test]
fn metadata_changes_while_learning_do_not_reach_the_host() {
    let s = Scratch::new("lh-meta");
    let victim = s.write("victim.txt", "x");
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    let before = std::fs::metadata(&victim).unwrap();
    let script = format!(
        "import os, sys\nfor f in (lambda: os.chmod({v:?}, 0o666), lambda: os.utime({v:?}, (0, 0))):\n    try:\n        f()\n        print('CHANGED', file=sys.stderr)\n    except OSError as e:\n        print('REFUSED', e.errno, file=sys.stderr)\n",
        v = victim.display().to_string()
    );
    let (rc, draft, err) = learn(&s, "default", &[], &script);
    let after = std::fs::metadata(&victim).unwrap();
    assert_eq!(after.permissions().mode() & 0o777, 0o600, "{err}");
    assert_eq!(
        after.modified().unwrap(),
        before.modified().unwrap(),
        "{err}"
    );
    assert!(!err.contains("CHANGED"), "{err}");
    assert!(
        draft.contains("\"chmod\",  # chmod(") && draft.contains("refused while learning"),
        "{draft}"
    );
    assert_ne!(rc, 0, "{err}");
    assert!(
        err.contains("not verified") && err.contains("chmod"),
        "{err}"
    );
}

/// Unprivileged, learn makes its mount namespace inside a user namespace of its own: the
/// same attack as root's (a file the user can read, 0600, copied into `--rw`) leaves nothing
/// in the `--rw` directory either.
#[test]
fn an_unprivileged_learn_keeps_the_writes_in_the_copy_too() {
    let s = Scratch::new("lh-nobody");
    let nobody = Some(65534);
    for d in ["app", "secret", "rw"] {
        std::fs::create_dir_all(s.path(d)).unwrap();
    }
    std::fs::set_permissions(&s.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    let secret = s.write("secret/key", "wfjail-learn-secret-4712");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    for p in [secret.clone(), s.path("rw")] {
        std::os::unix::fs::chown(&p, nobody, nobody).unwrap();
    }
    let copy = s.path("rw/key-copy");
    let app = s.write(
        "app/app.py",
        &format!(
            "import sys\nopen({dst:?}, 'w').write(open({src:?}).read())\nprint('COPIED', file=sys.stderr)\n",
            src = secret.display().to_string(),
            dst = copy.display().to_string(),
        ),
    );
    let bin = crate::common::reachable_copy(&s, &wfjail_bin());
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(&bin)
        .args(["learn", "-p", "default", "--no-verify", "--raw", "--ro"])
        .arg(s.path("app"))
        .arg("--rw")
        .arg(s.path("rw"))
        .args(["--", PY])
        .arg(&app)
        .current_dir(&s.0)
        .env("HOME", "/nonexistent")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("COPIED"), "the program ran and wrote: {err}");
    assert!(
        !copy.exists(),
        "the secret landed in the --rw directory: {err}"
    );
    assert_eq!(out.status.code(), Some(0), "{err}");
}

/// A `--rw` grant that holds wfjail's temp dir (where the copies' tmpfs is made) is copied
/// like any other: the tmpfs goes elsewhere, and nothing the program wrote under the grant,
/// the temp dir included, is there after learn.
#[test]
fn a_rw_grant_that_holds_the_temp_dir_is_a_copy_too() {
    let s = Scratch::new("lh-tmpdir");
    for d in ["app", "tmp"] {
        std::fs::create_dir_all(s.path(d)).unwrap();
    }
    let (a, b) = (s.path("tmp/a.txt"), s.path("b.txt"));
    let app = s.write(
        "app/app.py",
        &format!(
            "open({a:?}, 'w').write('a')\nopen({b:?}, 'w').write('b')\nprint('WROTE')\n",
            a = a.display().to_string(),
            b = b.display().to_string()
        ),
    );
    let out = Command::new(wfjail_bin())
        .args(["learn", "-p", "default", "--raw", "--rw"])
        .arg(&s.0)
        .args(["--", PY])
        .arg(&app)
        .env("TMPDIR", s.path("tmp"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("passes under the draft"), "{err}");
    assert!(!a.exists() && !b.exists(), "{err}");
    assert_eq!(std::fs::read_dir(s.path("tmp")).unwrap().count(), 0);
}

/// The copies are in memory: a program must not fill the host's with them. They hold at most
/// the policy's `limits.disk` (1 GiB without one): past it, a write fails with ENOSPC.
#[test]
fn the_copies_hold_no_more_than_limits_disk() {
    let s = Scratch::new("lh-size");
    std::fs::create_dir_all(s.path("rw")).unwrap();
    let base = s.write(
        "base.toml",
        "extends = \"default\"\n[limits]\ndisk = \"1MiB\"\n",
    );
    let script = format!(
        "import os, sys\nfd = os.open({f:?}, os.O_WRONLY | os.O_CREAT)\nn = 0\ntry:\n    while n < 4 << 20:\n        n += os.write(fd, b'x' * 65536)\nexcept OSError as e:\n    print('REFUSED', e.errno, 'after', n, file=sys.stderr)\n",
        f = s.path("rw/big").display().to_string()
    );
    let rw = s.path("rw");
    let (_, _, err) = learn(
        &s,
        base.to_str().unwrap(),
        &["--no-verify", "--rw", rw.to_str().unwrap()],
        &script,
    );
    assert!(
        err.contains("REFUSED 28 after "),
        "ENOSPC in the guest: {err}"
    );
    let after: u64 = err
        .split("REFUSED 28 after ")
        .nth(1)
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(after <= 1 << 20, "{after} bytes: {err}");
    assert!(!s.path("rw/big").exists(), "{err}");
}

/// The processes whose command line names `needle`, by pid (to find what a run left behind).
fn processes_naming(needle: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(needle) {
            found.push(pid);
        }
    }
    found
}

/// A base that turns the namespaces off (they are best-effort unless required) gave the
/// learning run, which lets through what the base denies, the host's System V IPC and process
/// table: a shared memory segment it made stayed on the host after learn, and a process it
/// forked outlived learn (reading whatever it liked). Both runs now have a PID and an IPC
/// namespace of their own, required whatever the base says.
#[test]
fn a_base_without_namespaces_leaves_no_process_and_no_ipc_object_on_the_host() {
    let s = Scratch::new("lh-nons");
    let base = s.write(
        "base.toml",
        "extends = \"default\"\n[namespaces]\nuser = false\nnet = false\npid = false\nipc = false\nuts = false\nmount = false\n",
    );
    let key = 0x5746_0000 + (std::process::id() & 0xffff) as i32;
    let script = format!(
        "import ctypes, os, sys, time\nlibc = ctypes.CDLL(None, use_errno=True)\nprint('SHM', libc.shmget({key}, 4096, 0o1600), file=sys.stderr)\nif os.fork() == 0:\n    os.setsid()\n    os.closerange(0, 3)\n    time.sleep(60)\n    os._exit(0)\nprint('FORKED', file=sys.stderr)\n"
    );
    let (_, _, err) = learn(&s, base.to_str().unwrap(), &[], &script);
    let app = s.path("app/app.py").display().to_string();
    let survivors = processes_naming(&app);
    for pid in &survivors {
        // Processes this test's program started.
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
    let ipcs = Command::new("ipcs").arg("-m").output().unwrap();
    let left = String::from_utf8_lossy(&ipcs.stdout).contains(&format!("0x{key:08x} "));
    if left {
        let _ = Command::new("ipcrm")
            .args(["-M", &key.to_string()])
            .status();
    }
    assert!(err.contains("FORKED"), "the program ran: {err}");
    assert!(
        survivors.is_empty(),
        "processes of the run outlived learn: {survivors:?}: {err}"
    );
    assert!(
        !left,
        "a System V shared memory segment stayed on the host: {err}"
    );
}

/// The draft resolved the paths the program named in wfjail's own context: `/dev/stdin`,
/// `/dev/fd/1` are links through `/proc/self`, which there are wfjail's descriptors, so a
/// program that opened its own stdin and stdout got a read grant on the files wfjail's were
/// redirected to (and on their directory), which it never read. Paths are now resolved
/// without /proc's magic links: those grant nothing.
#[test]
fn a_path_through_proc_magic_links_grants_nothing_of_wfjail_s_own() {
    let s = Scratch::new("lh-magic");
    std::fs::create_dir_all(s.path("app")).unwrap();
    std::fs::create_dir_all(s.path("private")).unwrap();
    let input = s.write("private/input.txt", "request");
    let output = s.path("private/output.log");
    let app = s.write(
        "app/app.py",
        "import os, sys\nfor p in ('/dev/stdin', '/dev/fd/0', '/dev/stdout', '/dev/fd/1', '/proc/self/fd/1'):\n    try:\n        os.close(os.open(p, os.O_RDONLY | os.O_NONBLOCK))\n    except OSError:\n        pass\nprint('OPENED', file=sys.stderr)\n",
    );
    let draft = s.path("draft.toml");
    let out = Command::new(wfjail_bin())
        .args(["learn", "-p", "default", "--no-verify", "--raw", "--output"])
        .arg(&draft)
        .arg("--ro")
        .arg(s.path("app"))
        .args(["--", PY])
        .arg(&app)
        .stdin(std::fs::File::open(&input).unwrap())
        .stdout(std::fs::File::create(&output).unwrap())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("OPENED"), "{err}");
    assert_eq!(out.status.code(), Some(0), "{err}");
    let text = std::fs::read_to_string(&draft).unwrap();
    let private = s.path("private").display().to_string();
    assert!(
        !text.contains(&format!("\"{private}")),
        "the draft grants what wfjail's own descriptors are:\n{text}"
    );
}

/// The draft wrote the paths the run read as they are, and a policy reads `${...}` in a path
/// as a variable: a directory of the program's own files named `${exe_dir}` became a grant
/// that, loaded, stands for another path (here, through a link the program's files hold, a
/// directory it never touched); a bare `$`, or a DEL character (which TOML strings must
/// escape), made a draft that does not load at all. Such paths are now listed as not granted,
/// control characters escaped, and the draft loads.
#[test]
fn a_path_that_a_policy_would_read_otherwise_is_not_granted() {
    let s = Scratch::new("lh-dollar");
    std::fs::create_dir_all(s.path("private")).unwrap();
    let mut reads = Vec::new();
    for dir in ["${exe_dir}", "a$b", "del\u{7f}x"] {
        std::fs::create_dir_all(s.path(&format!("app/data/{dir}"))).unwrap();
        for f in ["one.txt", "two.txt"] {
            reads.push(s.write(&format!("app/data/{dir}/{f}"), "x"));
        }
    }
    // ${exe_dir} is /usr/bin for python3: data/usr/bin leads to a directory the run never read.
    std::fs::create_dir_all(s.path("app/data/usr")).unwrap();
    std::os::unix::fs::symlink(s.path("private"), s.path("app/data/usr/bin")).unwrap();
    // The program's files are read from outside its --ro grant, so that the draft grants them.
    let text = draft_of_reading(&s, &reads);
    let p = wfjail::policy::from_source("draft.toml", &text)
        .unwrap_or_else(|e| panic!("the draft does not load: {e}\n{text}"));
    for g in &p.filesystem.read {
        assert!(!g.value.0.contains('$'), "{:?} in\n{text}", g.value.0);
    }
    assert!(
        text.contains("${exe_dir}/one.txt\" (read): a `$` in its path"),
        "the draft says what it did not grant:\n{text}"
    );
    assert!(text.contains("del\\u007fx"), "{text}");
}

/// The floor kept out the home directory of the user who ran learn ($HOME), not the others':
/// a program that listed another user's home (`/home/NAME`, with root's HOME /root, as
/// under sudo) got it granted as a whole, keys and all. A directory right under `/home` is
/// now never granted, for reading or writing.
#[test]
fn a_draft_never_grants_another_user_s_home() {
    struct Gone(std::path::PathBuf);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let s = Scratch::new("lh-home");
    let home = Gone(std::path::PathBuf::from(format!(
        "/home/wfjail-lh-{}",
        std::process::id()
    )));
    std::fs::create_dir_all(home.0.join(".ssh")).unwrap();
    std::fs::write(home.0.join(".ssh/id_ed25519"), "key").unwrap();
    let script = format!(
        "import os\nprint(os.listdir({h:?}))\ntry:\n    open({w:?}, 'w')\nexcept OSError:\n    pass\n",
        h = home.0.display().to_string(),
        w = home.0.join("planted").display().to_string()
    );
    std::fs::create_dir_all(s.path("app")).unwrap();
    let app = s.write("app/app.py", &script);
    let draft = s.path("draft.toml");
    let out = Command::new(wfjail_bin())
        .args(["learn", "-p", "default", "--no-verify", "--raw", "--output"])
        .arg(&draft)
        .arg("--ro")
        .arg(s.path("app"))
        .args(["--", PY])
        .arg(&app)
        .env("HOME", "/root")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let text = std::fs::read_to_string(&draft).unwrap();
    let shown = home.0.display().to_string();
    assert!(
        !text.contains(&format!("    \"{shown}\",")),
        "another user's home is granted:\n{text}"
    );
    assert!(
        text.contains(&format!("#   \"{shown}\" (read): a home directory"))
            && text.contains(&format!("#   \"{shown}\" (write): a home directory")),
        "{text}"
    );
}

/// A program that swallows the refusal of what learn withholds from an unreviewed draft (here
/// a chmod, which the verifying run does not get) does not make learn pass: it says "not
/// verified" and exits with the run's status (3, a violation), never 0. (Holds on the build
/// before this test too.)
#[test]
fn a_draft_that_is_not_verified_never_exits_0() {
    let s = Scratch::new("lh-unverified");
    std::fs::create_dir_all(s.path("app")).unwrap();
    let f = s.write("app/data.txt", "x");
    let script = format!(
        "import os\ntry:\n    os.chmod({f:?}, 0o600)\nexcept OSError:\n    pass\n",
        f = f.display().to_string()
    );
    let (rc, draft, err) = learn(&s, "default", &[], &script);
    assert!(draft.contains("\"chmod\""), "{draft}");
    assert!(err.contains("not verified"), "{err}");
    assert_eq!(rc, 3, "{err}");
}

/// A write the learning run was refused became a read-write grant on its directory, wherever
/// that was: a program that tried `~/.ssh/authorized_keys` and a file in `/var/tmp` got a
/// draft granting `~/.ssh` (and any dot-directory of a home: shell start-up files, autostart,
/// what runs unconfined later) and the shared `/var/tmp` (other users' files, like `/tmp`).
/// Neither is granted now, and the draft says why.
#[test]
fn a_draft_never_grants_writing_a_home_s_dot_directories_or_var_tmp() {
    let s = Scratch::new("lh-dot");
    std::fs::create_dir_all(s.path("home/.ssh")).unwrap();
    std::fs::create_dir_all(s.path("home/.config/autostart")).unwrap();
    let home = s.path("home");
    let targets = [
        home.join(".ssh/authorized_keys"),
        home.join(".config/autostart/x.desktop"),
        std::path::PathBuf::from(format!("/var/tmp/wfjail-lh-{}", std::process::id())),
    ];
    let list: Vec<String> = targets.iter().map(|p| p.display().to_string()).collect();
    let script = format!(
        "for p in {list:?}:\n    try:\n        open(p, 'w')\n    except OSError:\n        pass\n"
    );
    std::fs::create_dir_all(s.path("app")).unwrap();
    let app = s.write("app/app.py", &script);
    let draft = s.path("draft.toml");
    let out = Command::new(wfjail_bin())
        .args(["learn", "-p", "default", "--no-verify", "--raw", "--output"])
        .arg(&draft)
        .arg("--ro")
        .arg(s.path("app"))
        .args(["--", PY])
        .arg(&app)
        .env("HOME", &home)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(!targets[2].exists(), "{err}");
    let text = std::fs::read_to_string(&draft).unwrap();
    assert!(!text.contains("write = ["), "no write grant:\n{text}");
    let h = home.display().to_string();
    for refused in [
        format!("#   \"{h}/.ssh\" (write): a home's dot-directory"),
        format!("#   \"{h}/.config/autostart\" (write): a home's dot-directory"),
        "#   \"/var/tmp\" (write): a directory every user shares".to_string(),
    ] {
        assert!(text.contains(&refused), "{refused} in\n{text}");
    }
}

/// The learning run lifted the process limit (so that threads and forks are seen, not
/// stopped), and as root nothing else bounded them: a fork bomb ran unchecked on the host.
/// It now meets `learn::MAX_TASKS` (through a pids cgroup as root, where RLIMIT_NPROC does not
/// bind), and the draft still says how many the run started.
#[test]
fn a_fork_bomb_while_learning_meets_a_bound() {
    let s = Scratch::new("lh-forks");
    let script = "import os, sys\nn = 0\nfor i in range(800):\n    try:\n        pid = os.fork()\n    except OSError as e:\n        print('REFUSED', e.errno, 'after', n, file=sys.stderr)\n        break\n    if pid == 0:\n        os.execv('/bin/sleep', ['sleep', '3'])\n    n += 1\nprint('FORKED', n, file=sys.stderr)\n";
    let (rc, draft, err) = learn(&s, "default", &["--no-verify"], script);
    assert_eq!(rc, 0, "{err}");
    let forked: u64 = err
        .split("FORKED ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{err}"));
    assert!(
        forked < wfjail::learn::MAX_TASKS,
        "{forked} processes at once: {err}"
    );
    assert!(err.contains("REFUSED 11 after"), "EAGAIN: {err}");
    assert!(draft.contains("subprocess = \"allow\""), "{draft}");
}

/// Each call the learning run records is kept for the draft, up to 100 000 of them, with its
/// arguments: a run that opened that many paths of 4 KiB each made wfjail hold about 1 GiB of
/// the host's memory. What is kept is now bounded in bytes too
/// (`notify::MAX_LEARNED_BYTES`): past it, calls are not learned (the draft lacks
/// them, and its run is not verified).
#[test]
fn what_learn_keeps_of_a_run_is_bounded_in_bytes() {
    let s = Scratch::new("lh-learned");
    let script = "import os\nlong = '/tmp/' + '/'.join(['x' * 250] * 15) + '/'\nfor i in range(12000):\n    try:\n        os.open(long + str(i), os.O_RDONLY)\n    except OSError:\n        pass\nprint('OPENED')\n";
    let (rc, _, err) = learn(&s, "default", &["--no-verify"], script);
    assert_eq!(rc, 0, "{err}");
    let recorded: usize = err
        .split("ended ok (")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{err}"));
    let kept = 3800 * recorded;
    assert!(
        kept <= wfjail::notify::MAX_LEARNED_BYTES + (1 << 20),
        "{recorded} calls of about 3.8 KiB kept"
    );
}

/// A base that allows a metadata call outright (`fchmod`, for the command's own output) let
/// the learning run, which can open any file for reading, change the mode of any file the
/// user owns: Landlock does not check metadata changes, and the learning run's reads are not
/// the base's. A run of the base cannot open the file at all. While learning, those calls
/// are now refused and recorded like the ones the base denies (the verifying run, whose
/// reads are the draft's, keeps what the base allows).
#[test]
fn a_metadata_call_the_base_allows_changes_nothing_outside_its_grants_while_learning() {
    let s = Scratch::new("lh-fchmod");
    let base = s.write(
        "base.toml",
        "extends = \"default\"\n[syscalls]\nallow = [\"fchmod\", \"fchown\", \"fsetxattr\", \"fremovexattr\"]\n",
    );
    std::fs::create_dir_all(s.path("outside")).unwrap();
    let victim = s.write("outside/victim", "x");
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    let script = format!(
        "import os, sys\nfd = os.open({v:?}, os.O_RDONLY)\ntry:\n    os.fchmod(fd, 0o666)\n    print('CHANGED', file=sys.stderr)\nexcept OSError as e:\n    print('REFUSED', e.errno, file=sys.stderr)\n",
        v = victim.display().to_string()
    );
    let (rc, draft, err) = learn(&s, base.to_str().unwrap(), &["--no-verify"], &script);
    assert_eq!(rc, 0, "{err}");
    let mode = std::fs::metadata(&victim).unwrap().permissions().mode() & 0o777;
    assert_eq!(
        mode, 0o600,
        "the learning run changed a host file's mode: {err}"
    );
    assert!(err.contains("REFUSED 1"), "{err}");
    assert!(
        draft.contains("fchmod(") && draft.contains("refused while learning"),
        "{draft}"
    );
}

/// The draft allows the processes the learning run started, with `limits.processes` at twice
/// their number, and the verifying run (not reviewed) ran under it: a program that forked
/// and reaped 700 times while learning (seen as such: it can list `/` only there) had 1402
/// tasks at once in the verifying run. That run now has at most `learn::MAX_TASKS` too (or
/// the base's limit, when higher); the draft still says what the run started.
#[test]
fn the_verifying_run_meets_the_same_bound_on_tasks() {
    let s = Scratch::new("lh-verify-forks");
    let script = "import os, sys\ntry:\n    os.listdir('/')\n    learning = True\nexcept OSError:\n    learning = False\nn = 0\nfor i in range(700 if learning else 900):\n    try:\n        pid = os.fork()\n    except OSError as e:\n        break\n    if pid == 0:\n        os.execv('/bin/sleep', ['sleep', '0' if learning else '3'])\n    if learning:\n        os.waitpid(pid, 0)\n    n += 1\nprint('LEARNING', n, file=sys.stderr)\nif not learning:\n    # Its stderr is not shown: a refused write is, with its path.\n    try:\n        open('/VERIFYING-%d-' % n, 'w')\n    except OSError:\n        pass\n";
    let (_, draft, err) = learn(&s, "default", &[], script);
    assert!(err.contains("LEARNING 700"), "{err}");
    assert!(draft.contains("processes = 1402"), "{draft}");
    let verifying: u64 = err
        .split("/VERIFYING-")
        .nth(1)
        .and_then(|t| t.split('-').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{err}"));
    assert!(
        verifying < wfjail::learn::MAX_TASKS,
        "{verifying} processes at once in the verifying run: {err}"
    );
}

/// The copies' tmpfs held at most `limits.disk` bytes, but files without data take none: its
/// inodes were bounded only by the kernel's default (half the host's RAM in pages), and each
/// costs the host memory. A run that made 5 000 empty files under a 1 MiB copy made them all;
/// now the tmpfs has one inode per 8 KiB of its size (at least 1 024).
#[test]
fn the_copies_hold_a_bounded_number_of_files() {
    let s = Scratch::new("lh-inodes");
    std::fs::create_dir_all(s.path("rw")).unwrap();
    let base = s.write(
        "base.toml",
        "extends = \"default\"\n[limits]\ndisk = \"1MiB\"\n",
    );
    let script = format!(
        "import os, sys\nn = 0\ntry:\n    while n < 5000:\n        os.close(os.open({d:?} + '/f%d' % n, os.O_WRONLY | os.O_CREAT))\n        n += 1\nexcept OSError as e:\n    print('REFUSED', e.errno, file=sys.stderr)\nprint('MADE', n, file=sys.stderr)\n",
        d = s.path("rw").display().to_string()
    );
    let rw = s.path("rw");
    let (_, _, err) = learn(
        &s,
        base.to_str().unwrap(),
        &["--no-verify", "--rw", rw.to_str().unwrap()],
        &script,
    );
    let made: u64 = err
        .split("MADE ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{err}"));
    assert!(made <= 1024, "{made} files in a 1 MiB copy: {err}");
    assert!(err.contains("REFUSED 28"), "ENOSPC: {err}");
    assert_eq!(std::fs::read_dir(&rw).unwrap().count(), 0, "{err}");
}

/// A draft is for review, and the names of the program's files are the program's: Unicode
/// bidirectional controls (U+202E and the like) in a path made its grant line, and the
/// comments, show in another order than they mean (a grant that reads as another path). They
/// are now escaped in the paths (`\u202e`) and blanked in the comments.
#[test]
fn a_draft_shows_no_bidirectional_controls() {
    let s = Scratch::new("lh-bidi");
    let dir = "data/\u{202e}txt.exe";
    std::fs::create_dir_all(s.path(&format!("app/{dir}"))).unwrap();
    let files = [
        s.write(&format!("app/{dir}/a"), "x"),
        s.write(&format!("app/{dir}/b"), "x"),
    ];
    let text = draft_of_reading(&s, &files);
    assert!(!text.contains('\u{202e}'), "{text}");
    assert!(text.contains("\\u202etxt.exe\","), "{text}");
    let p = wfjail::policy::from_source("draft.toml", &text).unwrap();
    assert!(
        p.filesystem
            .read
            .iter()
            .any(|g| g.value.0.contains('\u{202e}')),
        "the grant is the path: {text}"
    );
}

/// Both runs read the request learn keeps from its stdin in a file of its temp dir: that
/// file was made with the umask's mode (0644 here: any local user could read the request)
/// at a name anyone can guess, following a link already there. It is now made new (never
/// through a link or over a file already there), 0600.
#[test]
fn the_request_learn_keeps_is_its_own() {
    let s = Scratch::new("lh-request");
    std::fs::create_dir_all(s.path("tmp")).unwrap();
    let app = s.write(
        "app.py",
        &format!(
            "import glob, os, sys\nfor p in glob.glob({t:?} + '/wfjail-learn-*.request'):\n    print('MODE', oct(os.stat(p).st_mode & 0o777), file=sys.stderr)\n",
            t = s.path("tmp").display().to_string()
        ),
    );
    let out = Command::new(wfjail_bin())
        .args(["learn", "-p", "default", "--no-verify", "--raw", "--", PY])
        .arg(&app)
        .env("TMPDIR", s.path("tmp"))
        .stdin(std::fs::File::open(&app).unwrap())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("MODE 0o600"), "{err}");
}

/// With a base given as a file, the draft (`extends = "/path/base.toml"`) was loaded as text,
/// which may extend a built-in only: learn said "the draft does not load (a bug in learn)"
/// and never ran the verifying run. It is loaded with its `extends` read from the file now,
/// and verified like any other (its writes into the throw-away copies).
#[test]
fn a_draft_that_extends_a_policy_file_is_verified() {
    let s = Scratch::new("lh-extends");
    let base = s.write("base.toml", "extends = \"default\"\n");
    std::fs::create_dir_all(s.path("out")).unwrap();
    let script = format!(
        "open({f:?}, 'w').write('x')\n",
        f = s.path("out/f.txt").display().to_string()
    );
    let (rc, draft, err) = learn(&s, base.to_str().unwrap(), &[], &script);
    assert!(draft.contains("base.toml\""), "{draft}");
    assert!(err.contains("the command passes under the draft"), "{err}");
    assert_eq!(rc, 0, "{err}");
    assert!(!s.path("out/f.txt").exists(), "{err}");
}

/// Ways around the copies that hold (kept as a check): a host file hard-linked into the
/// `--rw` directory is written in the copy (copy-up), never through its other name; a rename
/// out of the copy and a link into it fail with EXDEV; a host file opened for reading cannot
/// be reopened for writing through `/proc/self/fd`; a link planted in the copy is not
/// followed out by a write.
#[test]
fn links_renames_and_reopens_do_not_cross_the_copy() {
    let s = Scratch::new("lh-cross");
    for d in ["rw", "outside"] {
        std::fs::create_dir_all(s.path(d)).unwrap();
    }
    let host = s.write("outside/host.txt", "host");
    std::fs::hard_link(&host, s.path("rw/linked.txt")).unwrap();
    let script = format!(
        r#"import os, sys
def t(name, f):
    try:
        f()
        print(name, 'OK', file=sys.stderr)
    except OSError as e:
        print(name, e.errno, file=sys.stderr)
rw, out = {rw:?}, {out:?}
t('hardlink', lambda: open(rw + '/linked.txt', 'r+').write('PWND'))
t('rename-out', lambda: os.rename(rw + '/linked.txt', out + '/moved.txt'))
t('link-in', lambda: os.link(out + '/host.txt', rw + '/in.txt'))
fd = os.open(out + '/host.txt', os.O_RDONLY)
t('reopen', lambda: os.open('/proc/self/fd/%d' % fd, os.O_WRONLY))
t('symlink', lambda: os.symlink(out + '/host.txt', rw + '/sl'))
t('through-symlink', lambda: open(rw + '/sl', 'w').write('PWND'))
"#,
        rw = s.path("rw").display().to_string(),
        out = s.path("outside").display().to_string(),
    );
    let rw = s.path("rw");
    let (_, _, err) = learn(
        &s,
        "default",
        &["--no-verify", "--rw", rw.to_str().unwrap()],
        &script,
    );
    for expected in [
        "hardlink OK",
        "rename-out 18",
        "link-in 18",
        "reopen 13",
        "symlink OK",
        "through-symlink 13",
    ] {
        assert!(err.contains(expected), "{expected}: {err}");
    }
    assert_eq!(std::fs::read_to_string(&host).unwrap(), "host", "{err}");
    let mut left: Vec<String> = std::fs::read_dir(&rw)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["linked.txt"], "{err}");
    assert_eq!(std::fs::read_dir(s.path("outside")).unwrap().count(), 1);
}

/// A path is data in the draft, never TOML: a directory of the program's files whose name
/// closes the string and the array and opens `[network]` (quotes, `]`, newlines) is one
/// escaped grant, and the loaded draft allows no network (held before this pass too).
#[test]
fn a_path_cannot_inject_toml_into_the_draft() {
    let s = Scratch::new("lh-inject");
    let dir = "x\",]\n[network]\nmode = \"allow\"\n[filesystem]\nwrite = [\"/\"]\n#";
    std::fs::create_dir_all(s.path(&format!("app/{dir}"))).unwrap();
    let files = [
        s.write(&format!("app/{dir}/a"), "x"),
        s.write(&format!("app/{dir}/b"), "x"),
    ];
    let text = draft_of_reading(&s, &files);
    let p = wfjail::policy::from_source("draft.toml", &text).unwrap();
    assert_eq!(p.network.mode, wfjail::policy::NetworkMode::None, "{text}");
    assert!(
        p.filesystem.write.iter().all(|w| w.value.0 != "/"),
        "{text}"
    );
    let grants: Vec<&str> = p
        .filesystem
        .read
        .iter()
        .map(|g| g.value.0.as_str())
        .filter(|g| g.contains("[network]"))
        .collect();
    assert_eq!(
        grants,
        [s.path(&format!("app/{dir}")).to_str().unwrap()],
        "{text}"
    );
}
