//! Same-page merging (`wfjail serve --merge-pages`, `python/wfjail/merging.py`): the zygote
//! opts itself in after its preload (`prctl(PR_SET_MEMORY_MERGE)`), so the kernel shows
//! `ksm_merge_any: yes` for it and for every session child it forks, and not for the server;
//! the log says at the zygote's start whether the host merges, and why not (its `run`, a
//! host-wide setting this test only reads). With the policy's `[env]`
//! `WFJAIL_MERGE_PAGES = "heap"` only the zygote's heap is (`ksm_mergeable: yes`,
//! `ksm_merge_any: no`). Without the flag nothing is opted in and nothing is said. (A kernel
//! before 6.4 fails this: the zygote falls back to its heap and says so.)

use crate::common::serve_scratch;

const HANDLER: &str = r#"
def echo(req):
    return req
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
print(json.dumps({"serve": merge_any(serve), "zygote": merge_any(zygote), "children": kids,
                  "answer": answer}))
"#;

fn host_run() -> String {
    std::fs::read_to_string("/sys/kernel/mm/ksm/run").map_or("absent".into(), |s| s.trim().into())
}

#[test]
fn merge_pages_opts_the_zygote_and_its_children_in_and_says_whether_the_host_merges() {
    for mode in ["any", "heap", ""] {
        let (s, module) = serve_scratch("merging", "merge", HANDLER, "", &[], WORKER);
        let mut args = vec!["--zygotes", "1"];
        if !mode.is_empty() {
            args.push("--merge-pages");
        }
        if mode == "heap" {
            let policy = std::fs::read_to_string(s.path("policy.toml")).unwrap();
            let heap = policy.replace("set = { ", "set = { WFJAIL_MERGE_PAGES = \"heap\", ");
            assert_ne!(heap, policy);
            s.write("policy.toml", &heap);
        }
        let out = super::sessions::serve(&s, &module, true, &args);
        out.check(out.code == 0, "wfjail serve exits 0");
        let r: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
        assert_eq!(r["answer"], "hi", "{r}");
        let line = out
            .stderr
            .lines()
            .find(|l| l.contains("same-page merging"))
            .map(str::to_string);
        assert_eq!(
            r["serve"], "no/no",
            "the server itself is never opted in: {r}"
        );
        let kids = r["children"].as_object().unwrap();
        assert!(!kids.is_empty(), "the session's child (and a spare): {r}");
        // ksm_merge_any / ksm_mergeable
        let want = match mode {
            "any" => "yes/yes",
            "heap" => "no/yes",
            _ => "no/no",
        };
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
        let said = if mode == "any" {
            "(merge-any)"
        } else {
            "(heap)"
        };
        assert!(line.contains(said), "{line}");
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
