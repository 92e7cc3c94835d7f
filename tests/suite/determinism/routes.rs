//! Issue 27's determinism routes: what differed between a run and its replay under
//! `temporal-python` (same seed, same workflow time) and is now the execution's own. A pipe's
//! or a socket's inode number (a host-wide counter) reads a number of the execution's, and a
//! file system's free blocks and inodes (`shutil.disk_usage`, `statvfs`, `fstatvfs`) read
//! all free. Each probe runs twice, with the host making pipes and filling the disk between,
//! as a run and its replay would meet it. The routes that stay open are rows of
//! docs/security.md ("Issue 27: determinism routes").

use std::io::Write;

use crate::common::{Outcome, PY, Scratch, serve_one_zygote, wfjail};

const CLOCK: &str = "2026-12-01T09:30:00Z";

/// A pipe's and a socket pair's inode numbers, the same descriptor's again, and the free
/// space of the directory given (`DIR`) and of a pipe, as a JSON line.
const PROBE: &str = r#"
import json, os, shutil, socket
def routes(d):
    r, w = os.pipe()
    a, b = socket.socketpair()
    ino = [os.fstat(r).st_ino, os.fstat(w).st_ino, os.fstat(a.fileno()).st_ino,
           os.fstat(b.fileno()).st_ino, os.fstat(r).st_ino]
    du = shutil.disk_usage(d)
    v = os.statvfs(d)
    fv = os.fstatvfs(r)
    try:
        os.statvfs(os.path.join(d, "missing"))
        missing = 0
    except OSError as e:
        missing = e.errno
    try:
        os.statvfs("/proc/self")  # names no process of the supervisor's: the kernel answers
        proc_self = 0
    except OSError as e:
        proc_self = e.errno
    return json.dumps({"ino": ino, "du": list(du), "ffree": [v.f_ffree, v.f_files, v.f_favail],
                       "pipefs": [fv.f_bfree, fv.f_blocks], "missing": missing,
                       "proc_self": proc_self})
"#;

/// What the host does between a run and its replay: pipes made (the inode counter moves)
/// and 8 MiB written to the disk the probe asks about (its free blocks move).
fn host_activity(s: &Scratch, n: usize) {
    let _pipes: Vec<_> = (0..64)
        .map(|_| std::os::unix::net::UnixStream::pair().unwrap())
        .collect();
    let mut f = std::fs::File::create(s.path(&format!("fill-{n}"))).unwrap();
    f.write_all(&vec![7u8; 8 << 20]).unwrap();
    f.sync_all().unwrap();
}

fn checks(o: &Outcome, v: &serde_json::Value, what: &str) {
    let ino: Vec<u64> = serde_json::from_value(v["ino"].clone()).unwrap();
    o.check(
        ino[0] == ino[1] && ino[0] == ino[4],
        &format!("{what}: a pipe's two ends read one number, every time ({v})"),
    );
    o.check(
        ino[0] >= 1000 && ino[0] < ino[2] && ino[2] < ino[3] && ino[3] < 1100,
        &format!("{what}: the execution's own numbers, in the order first seen ({v})"),
    );
    let du: Vec<u64> = serde_json::from_value(v["du"].clone()).unwrap();
    o.check(
        du[0] > 0 && du[1] == 0 && du[2] == du[0],
        &format!("{what}: disk_usage: nothing used, all free ({v})"),
    );
    o.check(
        v["ffree"][0] == v["ffree"][1] && v["ffree"][2] == v["ffree"][1],
        &format!("{what}: statvfs: every inode free ({v})"),
    );
    o.check(
        v["pipefs"][0] == v["pipefs"][1],
        &format!("{what}: fstatvfs of a pipe: all free ({v})"),
    );
    o.check(
        v["missing"] == libc::ENOENT,
        &format!("{what}: statvfs of a missing path: ENOENT, as the kernel's ({v})"),
    );
    o.check(
        v["proc_self"] == 0,
        &format!("{what}: statvfs of /proc/self works as in the kernel ({v})"),
    );
}

#[test]
fn a_runs_pipe_inodes_and_free_space_are_the_same_in_its_replay() {
    let s = Scratch::new("det-routes");
    s.write("probe.py", PROBE);
    let dir = s.0.display().to_string();
    let code = format!(
        "import sys; sys.path.insert(0, {dir:?}); import probe; print(probe.routes({dir:?}))"
    );
    let run = || {
        wfjail(&[
            "run",
            "-p",
            "temporal-python",
            "--clock",
            CLOCK,
            "--seed",
            "5",
            "--ro",
            &dir,
            "--raw",
            "--",
            PY,
            "-c",
            &code,
        ])
    };
    let a = run();
    host_activity(&s, 0);
    let b = run();
    let mut seen = Vec::new();
    for (o, what) in [(&a, "run"), (&b, "replay")] {
        o.check(o.status() == "ok", &format!("{what}: status ok"));
        let v: serde_json::Value = serde_json::from_str(o.stdout.trim()).unwrap();
        checks(o, &v, what);
        seen.push(v);
    }
    a.check(
        seen[0] == seen[1],
        &format!(
            "the run and its replay read the same: {} / {}",
            seen[0], seen[1]
        ),
    );
}

const WORKER: &str = r#"
def fill(n):
    with open(os.path.join(DIR, "fill-%d" % n), "wb") as f:
        f.write(b"\7" * (8 << 20))
        f.flush()
        os.fsync(f.fileno())
c = Client()
out = []
for i in range(2):
    with c.session(handler=MOD + ":probe", seed=1, time_ns=1_000_000_000_000) as s:
        out.append(json.loads(s.call(b"a")))
    # Another session between, making pipes, and the host filling the disk.
    with c.session(handler=MOD + ":noise", seed=2, time_ns=2_000_000_000_000) as s:
        s.call(b"a")
    fill(i)
print(json.dumps(out))
"#;

#[test]
fn a_zygote_sessions_pipe_inodes_and_free_space_are_the_same_in_its_replay() {
    let module_src = format!(
        "{PROBE}\nimport os\nDIR = os.path.dirname(os.path.abspath(__file__))\n\
         def probe(req):\n    return routes(DIR).encode()\n\
         def noise(req):\n    return str([os.pipe() for _ in range(50)]).encode()\n"
    );
    let out = serve_one_zygote("det-routes-z", "routes", &module_src, "", WORKER);
    out.check(out.code == 0, "wfjail serve exits 0");
    let r: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    checks(&out, &r[0], "first session");
    out.check(
        r[0] == r[1],
        &format!("two sessions of the same seed and time, others between, read the same: {r}"),
    );
}

const GC_WORKER: &str = r#"
c = Client()
out = []
for i in range(3):
    with c.session(handler=MOD + ":probe", seed=1, time_ns=1_000_000_000_000) as s:
        out.append(json.loads(s.call(b"a")))
    # Other sessions between, and the zygote's own work for them.
    for j in range(i + 1):
        with c.session(handler=MOD + ":noise", seed=2, time_ns=2_000_000_000_000, init={"k": "v" * 100 * j}) as s:
            s.call(b"a")
print(json.dumps(out))
"#;

// `gc.get_count()` in a zygote session was the zygote's history (how much its loop allocated
// since the preloaded heap was frozen): the child freezes its heap, which zeroes them, before
// the session's first call. `sys.getallocatedblocks()` is read here too but stays open
// (docs/security.md): the blocks the zygote's loop left alive are in every child.
#[test]
fn a_zygote_sessions_gc_counts_are_the_same_in_its_replay() {
    let module_src = "import gc, json, sys\n\
         def probe(req):\n    return json.dumps([gc.get_count(), sys.getallocatedblocks()]).encode()\n\
         def noise(init):\n    junk = [[object()] for _ in range(5000)]\n    return lambda req: str(len(junk)).encode()\n";
    let out = serve_one_zygote("det-routes-gc", "gcr", module_src, "", GC_WORKER);
    out.check(out.code == 0, "wfjail serve exits 0");
    let r: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    out.check(
        r[0][0] == r[1][0] && r[1][0] == r[2][0],
        &format!("gc.get_count(): the same in three sessions of the same seed and time: {r}"),
    );
}
