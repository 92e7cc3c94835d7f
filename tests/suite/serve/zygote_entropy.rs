//! The zygote's own entropy: while preloading it reads real entropy under every policy
//! (`src/serve/route.rs`), whatever the policy says of a session's `getrandom` (`seeded`,
//! `deny`, or a violation only warned of under `on_violation = "warn"`, as `permissive`
//! says). Judged as a session's call, its draw was denied, and under `warn` it was
//! reported as a violation at every start. A spare's draw (Python reseeds at fork) is
//! answered from a fixed seed under every policy: refused, it made CPython give up getrandom
//! for the session's life, so that a session's draw never reached its policy. Sessions keep
//! their policy's rule.

use crate::common::serve_scratch;

/// A module that draws entropy at import, as `random` and `tempfile` do (the SDK too), and
/// a session's handlers: what the import drew, and a draw of the session's own.
const DRAWS_AT_IMPORT: &str = r#"
import os
try:
    DRAWN = "drew %d bytes" % len(os.urandom(16))
except OSError as e:
    DRAWN = "refused: %r" % e
def drawn(req):
    return DRAWN.encode()
def draw(req):
    try:
        return ("drew %d bytes" % len(os.urandom(16))).encode()
    except Exception as e:  # refused getrandom, then no /dev/urandom to read
        return type(e).__name__.encode()
"#;

const WORKER: &str = r#"
c = Client()
out = {}
with c.session(handler=MOD + ":drawn") as s:
    out["preload"] = s.call(b"").decode()
s = c.session(handler=MOD + ":draw").open()
out["session"] = s.call(b"").decode()
report = s.close()
out["violations"] = [[v["syscall"], v["action"]] for v in report.get("violations", [])]
print(json.dumps(out))
"#;

/// (what it is, the policy's lines before temporal-python's, what a session's draw gives,
/// the violations of its report).
const POLICIES: &[(&str, &str, &str, &str)] = &[
    ("seeded (temporal-python)", "", "drew 16 bytes", "[]"),
    (
        "deny, as strict",
        "[random]\ngetrandom = \"deny\"\n",
        // Refused (EPERM), then CPython looks for /dev/urandom, which is not readable.
        "NotImplementedError",
        r#"[["getrandom","denied"]]"#,
    ),
    (
        "deny under warn, as permissive",
        "on_violation = \"warn\"\n[random]\ngetrandom = \"deny\"\n",
        "drew 16 bytes",
        r#"[["getrandom","warned"]]"#,
    ),
];

#[test]
fn the_zygote_draws_real_entropy_at_preload_under_every_getrandom_rule_and_no_violation() {
    for (what, extra, session, violations) in POLICIES {
        let (s, module) = serve_scratch(
            "zygote-entropy",
            "entropy",
            DRAWS_AT_IMPORT,
            extra,
            &[],
            WORKER,
        );
        let out = super::sessions::serve(&s, &module, true, &["--zygotes", "1"]);
        out.check(out.code == 0, &format!("wfjail serve exits 0 ({what})"));
        let r: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
        assert_eq!(r["preload"], "drew 16 bytes", "{what}: {r}");
        assert!(
            !out.stderr.contains("zygote 0: violation"),
            "{what}: the zygote's draw was no violation: {}",
            out.stderr
        );
        // Nor was a spare's (Python reseeds `random` in each forked child): refused, it
        // made CPython give up getrandom for the session's life.
        assert!(
            !out.stderr.contains("refused"),
            "{what}: a spare's draw was not refused: {}",
            out.stderr
        );
        // A session's draw is its policy's.
        assert_eq!(r["session"], *session, "{what}: {r}");
        let want: serde_json::Value = serde_json::from_str(violations).unwrap();
        assert_eq!(r["violations"], want, "{what}: {r}");
    }
}

/// A preloaded module that imports `random` (which reseeds in every forked child) and one
/// the session imports itself, drawing at import.
const RESEEDS_AT_FORK: &str = r#"
import random
def echo(req):
    return b"echo " + req
"#;
const DRAWS_WHEN_IMPORTED: &str = r#"
import os
try:
    os.urandom(16)
except Exception:
    pass
def echo(req):
    return b"late " + req
"#;

const BACK_TO_BACK: &str = r#"
c = Client()
out = {"odd": []}
# Back to back: the zygote forks the next spare only once idle, so most of these children are
# forked for their session, registered by FORKED while they still run CPython's reseed.
for i in range(40):
    with c.session(handler=MOD + ":echo") as s:
        s.call(b"x")
    r = s.report
    if r["status"] != "ok" or r.get("violations"):
        out["odd"].append([i, r["status"], [v["syscall"] for v in r.get("violations", [])]])
s = c.session(handler=MOD + "_late:echo").open()
out["late"] = s.call(b"x").decode()
report = s.close()
out["late_violations"] = [[v["syscall"], v["action"]] for v in report.get("violations", [])]
print(json.dumps(out))
"#;

#[test]
fn a_childs_reseed_at_fork_is_never_its_sessions_draw_and_the_sessions_own_code_is_judged() {
    // Under `deny` the reseed judged as the session's failed one session in three back to
    // back (a violation in a session that drew nothing; under `warn` a spurious warning):
    // whether it came before or after FORKED was timing. A module the session imports itself
    // draws as the session's code, before HELLO: judged.
    for (what, extra, action) in [
        (
            "deny, as strict",
            "[random]\ngetrandom = \"deny\"\n",
            "denied",
        ),
        (
            "deny under warn, as permissive",
            "on_violation = \"warn\"\n[random]\ngetrandom = \"deny\"\n",
            "warned",
        ),
    ] {
        let (s, module) = serve_scratch(
            "zygote-reseed",
            "reseed",
            RESEEDS_AT_FORK,
            extra,
            &[],
            BACK_TO_BACK,
        );
        s.write(&format!("{module}_late.py"), DRAWS_WHEN_IMPORTED);
        let out = super::sessions::serve(&s, &module, true, &["--zygotes", "1"]);
        out.check(out.code == 0, &format!("wfjail serve exits 0 ({what})"));
        let r: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
        assert_eq!(r["odd"], serde_json::json!([]), "{what}: {r}");
        assert_eq!(r["late"], "late x", "{what}: {r}");
        assert_eq!(
            r["late_violations"],
            serde_json::json!([["getrandom", action]]),
            "{what}: {r}"
        );
    }
}
