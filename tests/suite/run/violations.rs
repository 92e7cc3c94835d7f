//! Every forbidden operation a workflow author is likely to write, under each of `deny`,
//! `kill` and `warn`: the report names the syscall, its decoded arguments, the category and a
//! hint, and the supervisor prints a one-line summary. The guest is the bundled
//! examples/misbehaving_guest.py, framed, under `strict`.

use crate::common::{Outcome, PY, Scratch, wfjail};

/// (what the guest tries, syscall, category, a piece of the decoded arguments)
const CASES: [(&str, &str, &str, &str); 5] = [
    ("network", "socket", "network", "AF_INET SOCK_STREAM"),
    ("thread", "clone", "thread", "CLONE_THREAD"),
    ("fork", "clone", "subprocess", "SIGCHLD"),
    ("exec", "execve", "exec", "/bin/true"),
    ("urandom", "getrandom", "random", "16 bytes"),
];

fn attempt(mode: &str, what: &str) -> Outcome {
    let s = Scratch::new("matrix");
    let policy = s.write(
        "p.toml",
        // strict allows one task; under warn the thread and the fork run, and
        // limits.processes still binds them (a pids cgroup when wfjail is root), so room for
        // them is made here.
        &format!("extends = \"strict\"\non_violation = \"{mode}\"\n[limits]\nprocesses = 8\n"),
    );
    let input = s.write("req.json", &format!("{{\"try\": \"{what}\"}}"));
    let guest = format!(
        "{}/examples/misbehaving_guest.py",
        env!("CARGO_MANIFEST_DIR")
    );
    wfjail(&[
        "run",
        "-p",
        policy.to_str().unwrap(),
        "--ro",
        env!("CARGO_MANIFEST_DIR"),
        "--input",
        input.to_str().unwrap(),
        "--",
        PY,
        &guest,
    ])
}

fn check_named(o: &Outcome, what: &str, syscall: &str, category: &str, args: &str, action: &str) {
    let v = o.assert_violation(syscall, category);
    o.check(
        v["args"].as_str().unwrap().contains(args),
        &format!("{what}: args decoded ({args})"),
    );
    o.check(v["action"] == action, &format!("{what}: action {action}"));
    let line = format!("wfjail: violation: {category} {syscall}(");
    o.check(
        o.stderr
            .lines()
            .any(|l| l.starts_with(&line) && l.contains(action)),
        &format!("{what}: summary line on stderr"),
    );
}

#[test]
fn deny_fails_the_call_and_the_guest_learns_why() {
    for (what, syscall, category, args) in CASES {
        let o = attempt("deny", what);
        check_named(&o, what, syscall, category, args, "denied");
        o.check(
            o.code == 3 && o.status() == "violation",
            &format!("{what}: status violation, exit 3"),
        );
        let g = &o.report["guest_error"];
        o.check(
            g["type"] == "wfjail.Violation",
            &format!("{what}: the guest raised wfjail.Violation"),
        );
        if what == "network" {
            o.check(
                g["message"].as_str().unwrap().contains("socket(AF_INET"),
                "naming the syscall",
            );
            o.check(
                g["traceback"].as_str().unwrap().contains("PermissionError"),
                "with the original traceback",
            );
            o.check(o.stderr.contains("Traceback"), "the traceback is printed");
        }
    }
}

#[test]
fn kill_ends_the_execution_at_once() {
    for (what, syscall, category, args) in CASES {
        let o = attempt("kill", what);
        check_named(&o, what, syscall, category, args, "killed");
        o.check(
            o.code == 3 && o.status() == "violation",
            &format!("{what}: status violation, exit 3"),
        );
        o.check(
            o.report["signal"] == "SIGKILL",
            &format!("{what}: killed by SIGKILL"),
        );
        o.check(o.stdout.is_empty(), &format!("{what}: no result"));
    }
}

#[test]
fn warn_lets_the_call_run_and_lists_it() {
    for (what, syscall, category, args) in CASES {
        let o = attempt("warn", what);
        check_named(&o, what, syscall, category, args, "warned");
        match what {
            // The call ran: the thread, the fork and the randomness worked, so the guest answered.
            "thread" | "fork" | "urandom" => {
                o.check(
                    o.code == 0 && o.status() == "ok",
                    &format!("{what}: status stays ok under warn"),
                );
                o.check(
                    o.stdout.contains("allowed"),
                    &format!("{what}: the guest's result"),
                );
            }
            // The socket was made, but the empty network namespace has nowhere to connect to.
            "network" => o.check(
                o.status() == "guest_error",
                "network: the connection itself failed",
            ),
            // exec replaced the guest: no result frame.
            _ => o.check(
                o.status() == "guest_error",
                "exec: the guest was replaced, so no result",
            ),
        }
    }
}
