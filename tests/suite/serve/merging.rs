//! Same-page merging (`wfjail serve --merge-pages`): the server opts the zygote in before its
//! exec and its filter (`prctl(PR_SET_MEMORY_MERGE)` in the pre-exec child), so the kernel
//! shows `ksm_merge_any: yes` for it and for every session child it forks, and not for the
//! server; the log says at the zygote's start whether the host merges, and why not (its
//! `run`, a host-wide setting this test only reads). Without the flag nothing is opted in and
//! nothing is said; the policy's `[env]` `WFJAIL_MERGE_PAGES` opts nothing in (the log says
//! so). A session's own opt-in, with or without the flag, is refused and reported. (A kernel
//! before 6.4, or one whose exec drops the opt-in, fails this and says why in the log.)

use crate::common::serve_scratch;

const HANDLER: &str = r#"
import ctypes
def echo(req):
    return req
def opt_in(req):
    """The session's own opt-in: both calls, with their errno."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    buf = ctypes.create_string_buffer(3 * 4096)
    page = (ctypes.addressof(buf) + 4095) & ~4095
    p = libc.prctl(67, 1, 0, 0, 0)
    pe = ctypes.get_errno()
    m = libc.madvise(page, 4096, 12)
    me = ctypes.get_errno()
    return ("%d %d %d %d" % (p, pe, m, me)).encode()
"#;

/// `ksm_merge_any` of the server, its zygote and the zygote's children while a session is
/// open, and the session's answer.
const WORKER: &str = r#"
c = Client()
serve = os.getppid()
def children(pid):
    with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
        return [int(p) for p in f.read().split()]
def merge_any(pid):
    stat = {l.split()[0]: l.split()[1] for l in open("/proc/%d/ksm_stat" % pid)}
    return stat["ksm_merge_any:"] + "/" + stat["ksm_mergeable:"]
zygote = [p for p in children(serve) if b"wfjail.zygote" in open("/proc/%d/cmdline" % p, "rb").read()][0]
with c.session(handler=MOD + ":echo") as s:
    answer = s.call(b"hi").decode()
    kids = {str(k): merge_any(k) for k in children(zygote)}
with c.session(handler=MOD + ":opt_in") as s:
    try:
        refused = s.call(b"").decode()
    except (GuestError, Violation) as e:
        refused = repr(e)
violations = [[v["syscall"], v["category"], v["args"], v["rule"], v["hint"], v["action"]]
              for v in s.report["violations"]]
print(json.dumps({"serve": merge_any(serve), "zygote": merge_any(zygote), "children": kids,
                  "answer": answer, "refused": refused, "violations": violations}))
"#;

fn host_run() -> String {
    std::fs::read_to_string("/sys/kernel/mm/ksm/run").map_or("absent".into(), |s| s.trim().into())
}

/// The session's own opt-in: both calls failed with EPERM, and the report has both, named
/// with their rule and hint.
fn check_refused(r: &serde_json::Value) {
    assert_eq!(
        r["refused"],
        format!("-1 {} -1 {}", libc::EPERM, libc::EPERM),
        "{r}"
    );
    let v = r["violations"].as_array().unwrap();
    for (call, arg) in [
        ("prctl", "PR_SET_MEMORY_MERGE"),
        ("madvise", "MADV_MERGEABLE"),
    ] {
        let found = v
            .iter()
            .find(|v| v[0] == call)
            .unwrap_or_else(|| panic!("{call}: {r}"));
        assert_eq!(found[1], "privilege", "{r}");
        assert!(found[2].as_str().unwrap().contains(arg), "{r}");
        assert!(
            found[3].as_str().unwrap().contains("same-page merging"),
            "{r}"
        );
        assert!(found[4].as_str().unwrap().contains("--merge-pages"), "{r}");
        assert_eq!(found[5], "denied", "{r}");
    }
}

#[test]
fn merge_pages_opts_the_zygote_and_its_children_in_and_says_whether_the_host_merges() {
    for mode in ["any", "env", ""] {
        let (s, module) = serve_scratch("merging", "merge", HANDLER, "", &[], WORKER);
        let mut args = vec!["--zygotes", "1"];
        if mode == "any" {
            args.push("--merge-pages");
        }
        if mode == "env" {
            // The policy asks the zygote to say, but only the flag opts in.
            let policy = std::fs::read_to_string(s.path("policy.toml")).unwrap();
            let env = policy.replace("set = { ", "set = { WFJAIL_MERGE_PAGES = \"any\", ");
            assert_ne!(env, policy);
            s.write("policy.toml", &env);
        }
        let out = super::sessions::serve(&s, &module, true, &args);
        out.check(out.code == 0, "wfjail serve exits 0");
        let r: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
        assert_eq!(r["answer"], "hi", "{r}");
        check_refused(&r);
        let line = out
            .stderr
            .lines()
            .find(|l| l.starts_with("wfjail: zygote ") && l.contains(": same-page merging "))
            .map(str::to_string);
        assert_eq!(
            r["serve"], "no/no",
            "the server itself is never opted in: {r}"
        );
        let kids = r["children"].as_object().unwrap();
        assert!(!kids.is_empty(), "the session's child (and a spare): {r}");
        // ksm_merge_any / ksm_mergeable
        let want = if mode == "any" { "yes/yes" } else { "no/no" };
        assert_eq!(r["zygote"], want, "{r}");
        for (pid, any) in kids {
            assert_eq!(any, want, "child {pid}: {r}");
        }
        if mode.is_empty() {
            assert_eq!(line, None, "nothing said when not asked: {}", out.stderr);
            continue;
        }
        let line = line.unwrap_or_else(|| panic!("no merging line: {}", out.stderr));
        eprintln!("{line}\n{r}");
        assert!(
            line.starts_with("wfjail: zygote 0: same-page merging "),
            "{line}"
        );
        if mode == "env" {
            assert!(
                line.contains("merging off: only `wfjail serve --merge-pages`"),
                "{line}"
            );
            continue;
        }
        assert!(line.contains("(merge-any, set by wfjail serve"), "{line}");
        match host_run().as_str() {
            "1" => assert!(line.contains("merging on: "), "{line}"),
            run => assert!(
                line.contains("merging off: ")
                    && line.contains(&format!("/sys/kernel/mm/ksm/run = {run}")),
                "host run = {run}: {line}"
            ),
        }
    }
}
