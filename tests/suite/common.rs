//! Shared helpers for the integration tests: run the real `wfjail` binary, read its report.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::Value;

/// The interpreter used by tests: Debian's, which the default policy can read (`/usr`).
pub const PY: &str = "/usr/bin/python3";

pub fn wfjail_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_wfjail"))
}

/// A fresh scratch directory under the system temp dir, removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "wfjail-test-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What one `wfjail` invocation did.
#[derive(Debug)]
pub struct Outcome {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    /// The JSON report (`Value::Null` when none was written).
    pub report: Value,
}

impl Outcome {
    /// The exit code, output and JSON report (if `report_path` was written) of a finished run.
    pub fn collect(out: std::process::Output, report_path: &Path) -> Outcome {
        let report = std::fs::read_to_string(report_path)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(Value::Null);
        Outcome {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            report,
        }
    }

    pub fn status(&self) -> &str {
        self.report["status"].as_str().unwrap_or("")
    }

    /// Whether the report's `error` says `text`.
    pub fn error_says(&self, text: &str) -> bool {
        self.report["error"]
            .as_str()
            .is_some_and(|e| e.contains(text))
    }

    /// The first violation of `syscall`, if any.
    pub fn violation(&self, syscall: &str) -> Option<&Value> {
        self.report["violations"]
            .as_array()?
            .iter()
            .find(|v| v["syscall"] == syscall)
    }

    /// Panics with the whole outcome when `cond` is false.
    pub fn check(&self, cond: bool, what: &str) {
        assert!(
            cond,
            "{what}\nexit {}\nstdout: {}\nstderr: {}\nreport: {:#}",
            self.code, self.stdout, self.stderr, self.report
        );
    }

    /// Asserts a violation of `syscall` in `category` (one syscall can be in two: `clone`
    /// makes a thread or a process), with a hint and a rule, and returns it.
    pub fn assert_violation(&self, syscall: &str, category: &str) -> &Value {
        let v = self.report["violations"].as_array().and_then(|list| {
            list.iter()
                .find(|v| v["syscall"] == syscall && v["category"] == category)
        });
        self.check(
            v.is_some(),
            &format!("expected a {category} violation of {syscall}"),
        );
        let v = v.unwrap();
        self.check(
            !v["hint"].as_str().unwrap_or("").is_empty(),
            "a violation carries a hint",
        );
        self.check(
            !v["rule"].as_str().unwrap_or("").is_empty(),
            "a violation names its rule",
        );
        v
    }
}

/// Runs `wfjail <args>` with `--report` inserted after `run`, and collects everything.
pub fn wfjail(args: &[&str]) -> Outcome {
    wfjail_with(args, |_| {})
}

/// Like [`wfjail`], letting the caller adjust the command (env, uid...).
pub fn wfjail_with(args: &[&str], adjust: impl FnOnce(&mut Command)) -> Outcome {
    let scratch = Scratch::new("report");
    let mut cmd = Command::new(wfjail_bin());
    adjust(&mut cmd);
    run_reported(cmd, args, &scratch.path("report.json"))
}

/// Runs `cmd` (wfjail, or a wrapper whose last argument is wfjail) with `args`, inserting
/// `--report report_path` after `run`, stdin from /dev/null; collects everything.
pub fn run_reported(mut cmd: Command, args: &[&str], report_path: &Path) -> Outcome {
    let mut iter = args.iter();
    if let Some(first) = iter.next() {
        cmd.arg(first);
        if *first == "run" {
            cmd.arg("--report").arg(report_path);
        }
    }
    cmd.args(iter);
    cmd.stdin(Stdio::null());
    Outcome::collect(cmd.output().expect("spawn wfjail"), report_path)
}

/// `wfjail run -p POLICY [extra...] --raw -- /usr/bin/python3 -c CODE`.
pub fn py(policy: &str, extra: &[&str], code: &str) -> Outcome {
    let mut args = vec!["run", "-p", policy];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--raw", "--", PY, "-c", code]);
    wfjail(&args)
}

/// `wfjail run -p FILE --raw -- /usr/bin/python3 -c CODE`, FILE holding the policy `toml`.
pub fn py_policy(toml: &str, code: &str) -> Outcome {
    let s = Scratch::new("policy");
    let policy = s.write("policy.toml", toml);
    py(policy.to_str().unwrap(), &[], code)
}

/// Python that runs `stmt` and prints `errno=N` for the OSError it raises.
pub fn errno_of(stmt: &str) -> String {
    format!("try:\n    {stmt}\nexcept OSError as e:\n    print('errno=%d' % e.errno)\n")
}

/// Python source that calls syscall `nr` with integer arguments through ctypes and prints
/// `errno=N` (0 on success).
pub fn raw_syscall(nr: u64, args: &[u64]) -> String {
    let args: Vec<String> = args.iter().map(|a| format!("ctypes.c_long({a})")).collect();
    format!(
        "import ctypes, os\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         r = libc.syscall(ctypes.c_long({nr}){}{})\n\
         print('errno=%d' % (ctypes.get_errno() if r == -1 else 0))\n",
        if args.is_empty() { "" } else { ", " },
        args.join(", ")
    )
}

/// Whether a path exists (for optional checks).
pub fn exists(p: &str) -> bool {
    Path::new(p).exists()
}

/// The arguments that make `wfjail serve` fork its sessions from `zygotes` zygotes of
/// Debian's interpreter that preloaded `module`.
pub fn zygote_args(module: &str, zygotes: &str) -> Vec<String> {
    [
        "--zygote",
        "--python",
        PY,
        "--preload",
        module,
        "--zygotes",
        zygotes,
    ]
    .map(String::from)
    .to_vec()
}

/// `wfjail serve` with one zygote that preloads `source` (as module `name`), under the
/// scratch's policy (`policy_extra` added) and with `worker` as the worker, run in the
/// scratch: the zygote-session determinism tests share it.
pub fn serve_one_zygote(
    tag: &str,
    name: &str,
    source: &str,
    policy_extra: &str,
    worker: &str,
) -> Outcome {
    let (s, module) = serve_scratch(tag, name, source, policy_extra, &[], worker);
    let policy = s.path("policy.toml").display().to_string();
    let worker = s.path("worker.py").display().to_string();
    let zygote_args = crate::common::zygote_args(&module, "1");
    let mut args = vec!["serve", "-p", &policy];
    args.extend(zygote_args.iter().map(String::as_str));
    args.extend(["--", PY, &worker]);
    wfjail_with(&args, |c| {
        c.current_dir(&s.0);
    })
}

/// Runs `wfjail serve` on a scratch dir's policy and module with `worker.py`, `--metrics`
/// at `metrics`; returns its exit code, stdout and stderr.
pub fn serve_with_metrics(
    s: &Scratch,
    module: &str,
    metrics: &std::path::Path,
) -> (i32, String, String) {
    let policy = s.path("policy.toml").display().to_string();
    let worker = s.path("worker.py").display().to_string();
    let zygote = zygote_args(module, "1");
    let mut args = vec![
        "serve",
        "-p",
        &policy,
        "--metrics",
        metrics.to_str().unwrap(),
    ];
    args.extend(zygote.iter().map(String::as_str));
    args.extend(["--", PY, &worker]);
    let out = std::process::Command::new(wfjail_bin())
        .args(&args)
        .current_dir(&s.0)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `examples/container_sim`, next to the test binaries: `cargo test` builds examples, but
/// `cargo test --test suite` does not, so build it here if it is missing, with the same
/// profile, target and target directory as the wfjail binary. One lock for the whole suite:
/// a second caller waits for the build instead of seeing a half-copied file.
pub fn container_sim() -> PathBuf {
    static BUILD: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let wfjail = wfjail_bin();
    let profile_dir = wfjail.parent().unwrap();
    let sim = profile_dir.join("examples/container_sim");
    let _guard = BUILD.lock().unwrap_or_else(|e| e.into_inner());
    if sim.exists() {
        return sim;
    }
    let profile = match profile_dir.file_name().unwrap().to_str().unwrap() {
        "debug" => "dev",
        other => other,
    };
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.args(["build", "--example", "container_sim", "--profile", profile])
        .arg("--manifest-path")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"));
    // target/<triple>/<profile> when a target is set (.cargo/config.toml sets one),
    // target/<profile> otherwise.
    let above = profile_dir.parent().unwrap();
    let triple = above.file_name().unwrap().to_str().unwrap();
    let target_dir = if triple.contains("-linux-") {
        cmd.args(["--target", triple]);
        above.parent().unwrap()
    } else {
        above
    };
    cmd.arg("--target-dir").arg(target_dir);
    let out = cmd
        .output()
        .expect("run cargo build --example container_sim");
    assert!(
        out.status.success() && sim.exists(),
        "building container_sim failed ({:?}): {}",
        cmd,
        String::from_utf8_lossy(&out.stderr)
    );
    sim
}

/// Compiles the C program `src` (`cc FLAGS -o out src`), failing the test with cc's errors.
pub fn cc(flags: &[&str], src: &Path, out: &Path) {
    let o = Command::new("cc")
        .args(flags)
        .arg("-o")
        .arg(out)
        .arg(src)
        .output()
        .unwrap_or_else(|e| panic!("run cc ({}): {e}", src.display()));
    assert!(
        o.status.success(),
        "cc {} failed:\n{}",
        src.display(),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// `src` compiled statically (`strict` reads only `${exe_dir}/..`, so the binary needs
/// nothing else) into `$CARGO_TARGET_TMPDIR/DIR/bin/NAME`, kept there between runs: under a
/// name of this process first, then renamed, so that two runs at once never see a
/// half-written file. Callers compile once per run (a `OnceLock`).
pub fn cc_static(dir: &str, name: &str, src: &Path, flags: &[&str]) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(dir).join("bin");
    std::fs::create_dir_all(&dir).unwrap();
    let bin = dir.join(name);
    let part = dir.join(format!("{name}.{}", std::process::id()));
    cc(&[&["-O0", "-static"], flags].concat(), src, &part);
    std::fs::rename(&part, &bin).unwrap();
    bin
}

/// The repository (the tests read its `python/` package).
pub const REPO: &str = env!("CARGO_MANIFEST_DIR");

/// A copy of `src` (a file, or a directory's files) inside `s`, mode 0755: what an
/// unprivileged wfjail (nobody) must reach. The build tree and the checkout may not be
/// traversable by nobody (a CI clone under a 0700 directory is not); the scratch dir is.
pub fn reachable_copy(s: &Scratch, src: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dst = s.path(src.file_name().unwrap().to_str().unwrap());
    if src.is_dir() {
        std::fs::create_dir_all(&dst).unwrap();
        for e in std::fs::read_dir(src).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_file() {
                std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
            }
        }
    } else {
        std::fs::copy(src, &dst).unwrap();
    }
    std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(0o755)).unwrap();
    dst
}

/// The `wfjail` Python package copied into `s/pylib` (readable by anyone): the directory to
/// put on PYTHONPATH.
pub fn python_lib(s: &Scratch) -> String {
    let lib = s.path("pylib");
    if !lib.join("wfjail").exists() {
        std::fs::create_dir_all(&lib).unwrap();
        let pkg = reachable_copy(s, Path::new(&format!("{REPO}/python/wfjail")));
        std::fs::rename(&pkg, lib.join("wfjail")).unwrap();
    }
    lib.display().to_string()
}

/// A scratch dir for a `wfjail serve` test. It holds the workflow module (named `prefix`
/// and the directory's name, returned) with `workflows`; the `wfjail` package
/// ([`python_lib`]); `policy.toml`, extending temporal-python (`policy_extra` first), that
/// lets Debian's interpreter import both and read `extra_reads`; and `worker.py`: the
/// client's names, `MOD`, `DIR`, a parent-death signal (a worker never outlives the wfjail
/// that started it), then `worker`.
pub fn serve_scratch(
    tag: &str,
    prefix: &str,
    workflows: &str,
    policy_extra: &str,
    extra_reads: &[&str],
    worker: &str,
) -> (Scratch, String) {
    let s = Scratch::new(tag);
    let module = format!(
        "{prefix}_{}",
        s.0.file_name().unwrap().to_string_lossy().replace('-', "_")
    );
    s.write(&format!("{module}.py"), workflows);
    let lib = python_lib(&s);
    let dir = s.0.display().to_string();
    let reads: String = [lib.as_str(), dir.as_str()]
        .iter()
        .chain(extra_reads)
        .map(|r| format!("{r:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    s.write(
        "policy.toml",
        &format!(
            "extends = \"temporal-python\"\n{policy_extra}\n[filesystem]\nread = [{reads}]\n\
             [env]\nset = {{ PYTHONPATH = \"{lib}:{dir}\" }}\n"
        ),
    );
    s.write(
        "worker.py",
        &format!(
            "import sys, os, json, time, threading, ctypes\n\
             ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL\n\
             sys.path.insert(0, {lib:?})\n\
             from wfjail.client import Client, AsyncClient, Busy, GuestError, SessionFailed\n\
             from wfjail import Violation\nMOD = {module:?}\nDIR = {dir:?}\n{worker}"
        ),
    );
    (s, module)
}
