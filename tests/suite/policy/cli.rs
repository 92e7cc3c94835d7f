//! Policy files and the command line: every kind of bad policy exits 2 and names
//! file:line:column, the field and the fix; built-ins list, show and validate.

use crate::common::{Scratch, py_policy, wfjail};

/// Runs `wfjail policy validate FILE` on `text`: (exit code, stderr, FILE).
fn validate(text: &str) -> (i32, String, String) {
    let s = Scratch::new("policy");
    let f = s.write("p.toml", text);
    let o = wfjail(&["policy", "validate", f.to_str().unwrap()]);
    (o.code, o.stderr, f.display().to_string())
}

#[test]
fn builtins_list_show_and_validate() {
    let o = wfjail(&["policy", "list"]);
    for name in ["default", "strict", "temporal-python", "permissive"] {
        o.check(o.stdout.contains(name), name);
    }
    let o = wfjail(&["policy", "show", "temporal-python"]);
    o.check(
        o.code == 0 && o.stdout.contains("sleep = \"deny\"") && o.stdout.contains("${exe_dir}/.."),
        "show resolves extends",
    );
    // What `show` prints is itself a valid policy.
    let (code, err, _) = validate(&o.stdout);
    o.check(code == 0, &format!("show output validates: {err}"));
    let j = wfjail(&["policy", "show", "strict", "--json"]);
    let parsed: serde_json::Value = serde_json::from_str(&j.stdout).unwrap();
    j.check(parsed["random"]["getrandom"] == "deny", "json output");
    for f in [
        "policies/default.toml",
        "policies/strict.toml",
        "policies/permissive.toml",
    ] {
        let path = format!("{}/{f}", env!("CARGO_MANIFEST_DIR"));
        let v = wfjail(&["policy", "validate", &path]);
        v.check(v.code == 0, f);
    }
}

#[test]
fn syntax_error_names_file_line_and_column() {
    let (code, err, file) = validate("extends = \"default\"\n[limits\ntimeout = \"1s\"\n");
    assert_eq!(code, 2, "{err}");
    assert!(err.contains(&format!("{file}:2:")), "{err}");
}

#[test]
fn unknown_key_is_rejected_with_a_suggestion() {
    let (code, err, file) = validate("[limits]\ntimout = \"30s\"\n");
    assert_eq!(code, 2, "{err}");
    assert!(err.contains(&format!("{file}:2:1")), "{err}");
    assert!(
        err.contains("timout") && err.contains("did you mean `timeout`"),
        "{err}"
    );
}

#[test]
fn unknown_syscall_is_rejected_with_the_closest_names() {
    let (code, err, file) = validate("[syscalls]\nallow = [\n  \"read\",\n  \"opneat\",\n]\n");
    assert_eq!(code, 2, "{err}");
    assert!(err.contains(&format!("{file}:4:3")), "{err}");
    assert!(
        err.contains("syscalls.allow") && err.contains("openat"),
        "{err}"
    );
}

#[test]
fn bad_duration_and_size_say_how_to_write_them() {
    let (code, err, file) = validate("[limits]\ntimeout = \"30 sec\"\n");
    assert_eq!(code, 2);
    assert!(
        err.contains(&format!("{file}:2:11"))
            && err.contains("limits.timeout")
            && err.contains("\"30s\""),
        "{err}"
    );
    let (code, err, _) = validate("[limits]\nmemory = \"lots\"\n");
    assert_eq!(code, 2);
    assert!(err.contains("512MiB"), "{err}");
}

#[test]
fn wrong_value_type_and_enum() {
    let (code, err, file) = validate("on_violation = \"explode\"\n");
    assert_eq!(code, 2);
    assert!(
        err.contains(&format!("{file}:1:")) && err.contains("deny") && err.contains("warn"),
        "{err}"
    );
    let (code, err, _) = validate("require = [\"landlok\"]\n");
    assert_eq!(code, 2);
    assert!(err.contains("landlock"), "{err}");
}

#[test]
fn extends_cycle_is_rejected() {
    let s = Scratch::new("cycle");
    s.write("a.toml", "extends = \"b.toml\"\n");
    let b = s.write("b.toml", "description = \"b\"\nextends = \"a.toml\"\n");
    let o = wfjail(&["policy", "validate", s.path("a.toml").to_str().unwrap()]);
    o.check(o.code == 2, "exit 2");
    o.check(
        o.stderr.contains(&format!("{}:2:11", b.display())),
        "points at the extends that closes the cycle",
    );
    o.check(
        o.stderr.contains("cycle")
            && o.stderr.contains("a.toml -> ")
            && o.stderr.contains("b.toml"),
        "names the chain",
    );
}

#[test]
fn extends_depth_is_bounded() {
    let s = Scratch::new("deep");
    for i in 0..12 {
        s.write(
            &format!("p{i}.toml"),
            &format!("extends = \"p{}.toml\"\n", i + 1),
        );
    }
    s.write("p12.toml", "description = \"end\"\n");
    let o = wfjail(&["policy", "validate", s.path("p0.toml").to_str().unwrap()]);
    o.check(
        o.code == 2 && o.stderr.contains("levels of `extends`"),
        "depth bound",
    );
}

#[test]
fn extends_missing_file_names_the_referencing_line() {
    let (code, err, file) = validate("description = \"x\"\nextends = \"nope.toml\"\n");
    assert_eq!(code, 2);
    assert!(
        err.contains(&format!("{file}:2:11")) && err.contains("nope.toml"),
        "{err}"
    );
}

#[test]
fn missing_policy_file_on_the_command_line() {
    let o = wfjail(&[
        "run",
        "-p",
        "/no/such/policy.toml",
        "--raw",
        "--",
        "/bin/true",
    ]);
    o.check(
        o.code == 2 && o.stderr.contains("/no/such/policy.toml"),
        "exit 2 naming the file",
    );
    let o = wfjail(&["run", "-p", "strcit", "--raw", "--", "/bin/true"]);
    o.check(
        o.code == 2 && o.stderr.contains("did you mean strict"),
        "unknown built-in with suggestion",
    );
}

#[test]
fn forbidden_and_conflicting_settings() {
    let (code, err, file) = validate("[syscalls]\nallow = [\"bpf\"]\n");
    assert_eq!(code, 2);
    assert!(
        err.contains(&format!("{file}:2:10")) && err.contains("always denied"),
        "{err}"
    );
    let (code, err, _) = validate("[syscalls]\nallow = [\"socketpair\"]\n");
    assert_eq!(code, 2);
    assert!(err.contains("argument checks"), "{err}");
    let (code, err, _) = validate("[syscalls]\nallow = [\"clone\"]\n");
    assert_eq!(code, 2);
    assert!(err.contains("[process]"), "{err}");
    let (code, err, _) =
        validate("[random]\ngetrandom = \"deny\"\n[filesystem]\nread = [\"/dev\"]\n");
    assert_eq!(code, 2);
    assert!(err.contains("/dev/urandom"), "{err}");
    let (code, err, _) = validate("[limits]\nopen_files = 3\n");
    assert_eq!(code, 2);
    assert!(err.contains("at least 16"), "{err}");
    let (code, err, _) = validate("[filesystem]\nread = [\"${nope}/x\"]\n");
    assert_eq!(code, 2);
    assert!(err.contains("unknown variable ${nope}"), "{err}");
}

#[test]
fn a_policy_file_layers_over_a_builtin() {
    let o = py_policy(
        "extends = \"strict\"\n[time]\nsleep = \"allow\"\n",
        "import time; time.sleep(0.001); print('ok')",
    );
    o.check(
        o.code == 0 && o.stdout.trim() == "ok",
        "sleep re-allowed over strict",
    );
}

#[test]
fn require_replaces_what_it_extends() {
    let s = Scratch::new("require");
    let p = s.write("p.toml", "extends = \"default\"\nrequire = [\"seccomp\"]\n");
    let o = wfjail(&["policy", "show", p.to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    o.check(
        v["require"] == serde_json::json!(["seccomp"]),
        "landlock made best-effort again",
    );
    let o = wfjail(&["policy", "show", "temporal-python", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    o.check(
        v["require"] == serde_json::json!(["landlock", "seccomp"]),
        "inherited when not set",
    );
}

#[test]
fn help_teaches_and_bad_usage_is_2() {
    let o = wfjail(&["--help"]);
    o.check(
        o.code == 0 && o.stdout.contains("Exit status") && o.stdout.contains("wfjail run"),
        "--help",
    );
    let o = wfjail(&["run", "--help"]);
    o.check(
        o.code == 0 && o.stdout.contains("--ro") && o.stdout.contains("--raw"),
        "run --help",
    );
    let o = wfjail(&["run", "--timeout", "soon", "--raw", "--", "/bin/true"]);
    o.check(o.code == 2 && o.stderr.contains("30s"), "bad --timeout");
    let o = wfjail(&["frobnicate"]);
    o.check(o.code == 2, "unknown subcommand");
}

#[test]
fn check_reports_every_layer() {
    let o = wfjail(&["check", "--json"]);
    o.check(o.code == 0, "everything required is available on this host");
    let r: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    let rows = r["rows"].as_array().unwrap();
    for layer in [
        "landlock",
        "seccomp",
        "seccomp-notify",
        "user-ns",
        "net-ns",
        "pid-ns",
        "ipc-ns",
        "uts-ns",
        "capabilities",
        "no-new-privs",
        "address-layout",
        "cgroups",
        "page-merging",
    ] {
        o.check(rows.iter().any(|row| row["layer"] == layer), layer);
    }
    // Same-page merging, as the host has it (only read here: a host-wide setting).
    let m = &r["merging"];
    let run = std::fs::read_to_string("/sys/kernel/mm/ksm/run").ok();
    o.check(m["present"] == run.is_some(), "merging.present");
    if let Some(run) = run {
        o.check(
            m["run"] == run.trim().parse::<u64>().unwrap()
                && m["pages_to_scan"].is_u64()
                && m["sleep_millisecs"].is_u64()
                && m["pages_per_second"].is_u64()
                && m["prctl"].is_string(),
            "merging: run, rate and prctl",
        );
        let row = rows
            .iter()
            .find(|row| row["layer"] == "page-merging")
            .unwrap();
        o.check(
            row["available"] == (run.trim() == "1" && m["prctl"] == "yes"),
            "page-merging row",
        );
    }
    let t = wfjail(&["check", "-p", "strict"]);
    t.check(
        t.stdout.contains("LAYER") && t.stdout.contains("landlock"),
        "table",
    );
}
