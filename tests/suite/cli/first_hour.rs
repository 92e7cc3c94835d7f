//! The first hour with wfjail (issue 11): no silent outcomes. A report that cannot be
//! written stops the run before it starts; a policy that does not load still gives a JSON
//! report to a caller that asked for one; a violation is printed once; a script the policy
//! does not let the guest read is named with the grant that would.

use std::process::{Command, Stdio};

use crate::common::{PY, REPO, Scratch, wfjail_bin};

fn run(args: &[&str], stdin: &str) -> (i32, String, String) {
    let mut child = Command::new(wfjail_bin())
        .args(args)
        .current_dir(REPO)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_report_that_cannot_be_written_stops_the_run_before_the_guest_starts() {
    let s = Scratch::new("fh-report");
    let marker = s.path("ran");
    let code = format!("open({:?}, 'w').write('x')", marker.display().to_string());
    let (rc, _, err) = run(
        &[
            "run",
            "-p",
            "default",
            "--rw",
            s.0.to_str().unwrap(),
            "--report",
            "/nonexistent-dir/report.json",
            "--raw",
            "--",
            PY,
            "-c",
            &code,
        ],
        "",
    );
    assert_eq!(rc, 2, "{err}");
    assert!(
        err.contains("--report /nonexistent-dir/report.json"),
        "{err}"
    );
    assert!(!marker.exists(), "the guest did not run");
}

#[test]
fn a_policy_that_does_not_load_still_gives_a_json_report() {
    let s = Scratch::new("fh-policy");
    let bad = s.write("bad.toml", "[time]\nsleep = \"sometimes\"\n");
    let (rc, out, err) = run(
        &[
            "run",
            "-p",
            bad.to_str().unwrap(),
            "--report",
            "-",
            "--",
            "/bin/true",
        ],
        "",
    );
    assert_eq!(rc, 2);
    let r: serde_json::Value = serde_json::from_str(&out).expect("a JSON report on stdout");
    assert_eq!(r["status"], "launch_error");
    assert!(r["error"].as_str().unwrap().contains("bad.toml:2"), "{r:#}");
    assert!(err.contains("bad.toml:2"), "and on stderr: {err}");
}

#[test]
fn a_violation_is_printed_once() {
    let (rc, _, err) = run(
        &[
            "run",
            "-p",
            "default",
            "--ro",
            REPO,
            "--",
            PY,
            "examples/misbehaving_guest.py",
        ],
        "{\"try\": \"network\"}",
    );
    assert_eq!(rc, 3, "{err}");
    assert_eq!(
        err.matches("network is denied in workflow code").count(),
        1,
        "{err}"
    );
    assert!(
        err.contains("misbehaving_guest.py\", line"),
        "the traceback still shows the line that made it: {err}"
    );
}

#[test]
fn a_script_the_guest_may_not_read_is_named_with_the_grant() {
    let (rc, _, err) = run(
        &[
            "run",
            "-p",
            "default",
            "--",
            PY,
            "examples/misbehaving_guest.py",
        ],
        "{\"try\": \"network\"}",
    );
    assert_eq!(rc, 1, "{err}");
    assert!(
        err.contains("examples/misbehaving_guest.py is not readable under policy default")
            && err.contains("--ro"),
        "{err}"
    );
}

#[test]
fn the_console_summary_names_each_degraded_layer() {
    // As root with forks allowed, RLIMIT_NPROC cannot bind the guest: `rlimit-nproc` is
    // degraded (as another user, nothing is; the summary then says nothing of it).
    let s = Scratch::new("fh-degraded");
    let policy = s.write(
        "forks.toml",
        "extends = \"default\"\n[process]\nsubprocess = \"allow\"\n",
    );
    let p = policy.to_str().unwrap();
    let (_, out, _) = run(
        &["run", "-p", p, "--report", "-", "--raw", "--", "/bin/true"],
        "",
    );
    let r: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let degraded: Vec<String> = r["layers"]["degraded"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap().split(':').next().unwrap().to_string())
        .collect();
    let (rc, _, err) = run(&["run", "-p", p, "--raw", "--", "/bin/true"], "");
    assert_eq!(rc, 0, "{err}");
    if degraded.is_empty() {
        assert!(!err.contains("degraded:"), "{err}");
    } else {
        assert!(
            err.contains("wfjail: ok"),
            "an ok run with a degraded layer says so: {err}"
        );
        for d in &degraded {
            assert!(err.contains(d.as_str()), "{d} named in {err}");
        }
    }
}

#[test]
fn hints_point_the_right_way() {
    let s = Scratch::new("fh-hints");
    let target = s.path("x.txt");
    let write = crate::common::py(
        "default",
        &[],
        &format!("open({:?}, 'w')", target.display().to_string()),
    );
    let v = write.assert_violation("openat", "filesystem");
    write.check(
        v["hint"].as_str().unwrap().contains("--rw")
            && !v["hint"].as_str().unwrap().contains("--ro"),
        "a write names --rw, not --ro",
    );
    // glibc's nscd lookup (a Unix stream socket) is not "network, do it in an activity" only.
    let unix = crate::common::py(
        "default",
        &[],
        "import socket\ntry:\n    socket.socket(socket.AF_UNIX)\nexcept OSError:\n    pass\n",
    );
    let v = unix.assert_violation("socket", "network");
    unix.check(
        v["hint"].as_str().unwrap().contains("nscd"),
        "a Unix socket's hint names nscd's lookups",
    );
}

#[test]
fn the_report_says_its_version_and_keeps_every_key() {
    let (rc, out, _) = run(
        &[
            "run",
            "-p",
            "default",
            "--report",
            "-",
            "--raw",
            "--",
            "/bin/true",
        ],
        "",
    );
    assert_eq!(rc, 0);
    let r: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(r["schema_version"], 2);
    assert_eq!(r["wfjail_version"], env!("CARGO_PKG_VERSION"));
    let at = r["finished_at"].as_str().unwrap();
    assert!(at.starts_with("20") && at.ends_with('Z'), "{at}");
    let keys = r.as_object().unwrap();
    for k in [
        "limit",
        "error",
        "guest_error",
        "seed",
        "clock",
        "skipped_paths",
        "signal",
    ] {
        assert!(keys.contains_key(k), "{k} is present even when unset");
    }
    let ms = r["duration_ms"].as_f64().unwrap();
    assert_eq!((ms * 1000.0).round() / 1000.0, ms, "to the microsecond");
}

#[test]
fn the_command_may_come_without_a_double_dash() {
    // Everything from the command on is the command's, options included.
    let (rc, out, err) = run(
        &[
            "run",
            "-q",
            "--raw",
            "/bin/echo",
            "-n",
            "x",
            "--report",
            "-q",
        ],
        "",
    );
    assert_eq!(rc, 0, "{err}");
    assert_eq!(out, "x --report -q");
    let (rc, out, _) = run(&["run", "-q", "--raw", "--", "/bin/echo", "-n", "y"], "");
    assert_eq!((rc, out.as_str()), (0, "y"), "`--` still works");
}

#[test]
fn a_policy_can_take_away_a_grant_it_inherits() {
    let s = Scratch::new("fh-drop");
    let p = s.write(
        "p.toml",
        "extends = \"default\"\n[filesystem]\ndrop = [\"/dev/zero\"]\n",
    );
    let o = crate::common::py(
        p.to_str().unwrap(),
        &[],
        &crate::common::errno_of("open('/dev/zero', 'rb')"),
    );
    o.check(
        o.stdout.contains("errno=13"),
        "/dev/zero is no longer readable",
    );
    let bad = s.write(
        "bad.toml",
        "extends = \"default\"\n[filesystem]\ndrop = [\"/etc\"]\n",
    );
    let (rc, _, err) = run(&["policy", "validate", bad.to_str().unwrap()], "");
    assert_eq!(rc, 2);
    assert!(
        err.contains("bad.toml:3:9")
            && err.contains("takes nothing away")
            && err.contains("\"/usr\""),
        "{err}"
    );
}

#[test]
fn learn_drafts_a_policy_that_lets_the_run_pass() {
    let s = Scratch::new("fh-learn");
    std::fs::create_dir_all(s.path("data")).unwrap();
    std::fs::create_dir_all(s.path("out")).unwrap();
    s.write("data/a.txt", "a");
    s.write("data/b.txt", "b");
    s.write("config.ini", "x");
    let app = s.write(
        "app.py",
        &format!(
            "import time\nd = {dir:?}\nfor n in ('data/a.txt', 'data/b.txt', 'config.ini'):\n    open(d + '/' + n).read()\n\
             time.sleep(0.01)\nopen(d + '/out/result.txt', 'w').write('done')\nprint('done')\n",
            dir = s.0.display().to_string()
        ),
    );
    let draft = s.path("learned.toml");
    let (rc, _, err) = run(
        &[
            "learn",
            "-p",
            "strict",
            "--output",
            draft.to_str().unwrap(),
            "--raw",
            "--",
            PY,
            app.to_str().unwrap(),
        ],
        "",
    );
    assert_eq!(rc, 0, "the run under the draft passes: {err}");
    assert!(err.contains("the command passes under the draft"), "{err}");
    assert!(
        err.contains("were refused"),
        "the learning run's write was refused: {err}"
    );
    let text = std::fs::read_to_string(&draft).unwrap();
    let dir = s.0.display().to_string();
    // Python opened the script's directory itself (sys.path[0]): granted as it is, with the
    // files read under it counted there; the write, read-write; the sleep, its setting.
    for want in [
        "extends = \"strict\"".to_string(),
        format!("\"{dir}\",  # openat({dir}/app.py (read)) (+4 more)"),
        format!("\"{dir}/out\",  # openat({dir}/out/result.txt (write))"),
        "sleep = \"allow\"  # clock_nanosleep(".to_string(),
    ] {
        assert!(text.contains(&want), "{want} in:\n{text}");
    }
    assert!(
        !text.contains(&format!("\"{dir}/data\"")),
        "inside a grant: {text}"
    );
    // Neither run wrote to the host: the verifying run's write went to a throw-away copy.
    assert!(!s.path("out/result.txt").exists(), "{err}");
    // The draft is a policy of its own: the run passes under it.
    let (rc, out, err) = run(
        &[
            "run",
            "-p",
            draft.to_str().unwrap(),
            "--raw",
            "--",
            PY,
            app.to_str().unwrap(),
        ],
        "",
    );
    assert_eq!((rc, out.trim()), (0, "done"), "{err}");
}

#[test]
fn permissive_reports_sleep_and_randomness_and_lets_them_run() {
    let o = crate::common::py(
        "permissive",
        &[],
        "import time, os\ntime.sleep(0.01)\nprint(len(os.urandom(4)))\n",
    );
    o.check(
        o.status() == "ok" && o.stdout.trim() == "4",
        "everything ran",
    );
    o.assert_violation("clock_nanosleep", "sleep");
    o.assert_violation("getrandom", "random");
}

#[test]
fn permissive_reports_reads_and_writes_outside_the_default_grants_and_lets_them_run() {
    let s = Scratch::new("fh-permissive-fs");
    let out = s.path("out.txt");
    let code = format!(
        "print(open('/etc/hostname').read() != '')
open('{}', 'w').write('x')
print('wrote')
",
        out.display()
    );
    let o = crate::common::py("permissive", &[], &code);
    o.check(
        o.status() == "ok" && o.stdout.contains("True") && o.stdout.contains("wrote"),
        "the read and the write ran",
    );
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "x");
    let v = o.assert_violation("openat", "filesystem");
    let args: Vec<&str> = o.report["violations"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["args"].as_str())
        .collect();
    o.check(
        args.contains(&"/etc/hostname (read)")
            && args.contains(&format!("{} (write)", out.display()).as_str()),
        &format!("both named, as warned: {args:?} ({v})"),
    );
}

#[test]
fn serve_keeps_counters_readable_while_it_runs_and_says_them_at_exit() {
    let (s, module) = crate::common::serve_scratch(
        "fh-metrics",
        "met",
        "import socket\ndef ok(req):\n    return b'ok'\ndef net(req):\n    socket.socket(socket.AF_INET)\n",
        "",
        &[],
        "import time\nc = Client()\nwith c.session(handler=MOD + ':ok') as s:\n    s.call(b'1'); s.call(b'2')\n\
         try:\n    with c.session(handler=MOD + ':net') as s:\n        s.call(b'x')\nexcept Exception:\n    pass\n\
         time.sleep(1.5)\nprint(open(DIR + '/metrics.prom').read())\n",
    );
    let metrics = s.path("metrics.prom");
    let (code, stdout, stderr) = crate::common::serve_with_metrics(&s, &module, &metrics);
    assert_eq!(code, 0, "{stderr}");
    // While running: the worker read the file.
    assert!(
        stdout.contains("wfjail_sessions_opened_total 2"),
        "{stdout}"
    );
    assert!(stdout.contains("wfjail_call_seconds_count 3"), "{stdout}");
    assert!(
        stdout.contains("wfjail_violations_total{category=\"network\"} 1"),
        "{stdout}"
    );
    // At exit: on stderr, and the file's last state.
    assert!(
        stderr.contains("wfjail: served 2 sessions") && stderr.contains("3 calls"),
        "{stderr}"
    );
    let last = std::fs::read_to_string(&metrics).unwrap();
    assert!(
        last.contains("wfjail_sessions_ended_total{status=\"ok\"} 1"),
        "{last}"
    );
}

#[test]
fn conventions_completions_a_man_page_and_json_for_policies() {
    let (rc, out, _) = run(&["completions", "bash"], "");
    assert_eq!(rc, 0);
    assert!(
        out.contains("_wfjail()") && out.contains("learn"),
        "bash completion"
    );
    let (rc, out, _) = run(&["manpage"], "");
    assert_eq!(rc, 0);
    assert!(
        out.contains(".TH wfjail 1") && out.contains("SUBCOMMANDS"),
        "a roff man page"
    );
    let (rc, out, _) = run(&["policy", "list", "--json"], "");
    assert_eq!(rc, 0);
    let list: serde_json::Value = serde_json::from_str(&out).unwrap();
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["default", "strict", "temporal-python", "permissive"]
    );
    let s = Scratch::new("fh-validate");
    let bad = s.write("bad.toml", "[limits]\ntimeout = \"soon\"\n");
    let good = s.write("good.toml", "extends = \"strict\"\n");
    let (rc, out, _) = run(
        &[
            "policy",
            "validate",
            "--json",
            bad.to_str().unwrap(),
            good.to_str().unwrap(),
        ],
        "",
    );
    assert_eq!(rc, 2);
    let docs: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(docs[0]["ok"], false);
    assert_eq!(docs[0]["error"]["line"], 2);
    assert_eq!(docs[0]["error"]["field"], "limits.timeout");
    assert_eq!(docs[1]["ok"], true);
    assert!(docs[1]["error"].is_null());
}
