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
