//! The zygote's heap in 2 MiB pages (`python/wfjail/hugepages.py`): collapsed once, after its
//! READY (then SETTLED), so that each fork copies and each exit drops fewer page-table entries; under the
//! policy's `[env]` `WFJAIL_HUGEPAGES = "0"` it stays in 4 KiB pages. Sessions answer either
//! way. (A kernel without `MADV_COLLAPSE` or with THP `never` fails this unless
//! `WFJAIL_ALLOW_NO_THP=1` says that is expected there.)

use crate::common::serve_scratch;

/// A preloaded module with ~80 MiB of objects (dicts of atoms, which the collector does not
/// track: found through the spans between those it does).
const BIG_HEAP: &str = r#"
DATA = [{"i": i} for i in range(400_000)]
def size(req):
    return str(len(DATA)).encode()
"#;

/// The zygote's AnonHugePages (KiB) once it has settled (its heap collapsed after READY,
/// SETTLED: STATUS counts it), before any session, then a session's answer.
const WORKER: &str = r#"
c = Client()
while c.status()["zygotes_settled"] < 1:
    time.sleep(0.02)
serve = os.getppid()
def children(pid):
    with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
        return [int(p) for p in f.read().split()]
zygotes = [p for p in children(serve) if b"wfjail.zygote" in open("/proc/%d/cmdline" % p, "rb").read()]
huge = 0
for line in open("/proc/%d/smaps_rollup" % zygotes[0]):
    if line.startswith("AnonHugePages:"):
        huge = int(line.split()[1])
with c.session(handler=MOD + ":size") as s:
    answer = s.call(b"").decode()
print(json.dumps({"huge_kib": huge, "answer": answer, "status": s.report["status"]}))
"#;

fn thp_missing() -> bool {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .map_or(true, |s| s.contains("[never]"))
}

#[test]
fn the_zygotes_heap_is_collapsed_into_huge_pages_unless_the_policy_says_0() {
    if thp_missing() && std::env::var("WFJAIL_ALLOW_NO_THP").as_deref() == Ok("1") {
        eprintln!("skipped: transparent huge pages are off here (WFJAIL_ALLOW_NO_THP=1)");
        return;
    }
    for collapsed in [true, false] {
        let (s, module) = serve_scratch("hugepages", "huge", BIG_HEAP, "", &[], WORKER);
        if !collapsed {
            // The policy's one `[env]` table: its `set` gains the switch.
            let policy = std::fs::read_to_string(s.path("policy.toml")).unwrap();
            let off = policy.replace("set = { ", "set = { WFJAIL_HUGEPAGES = \"0\", ");
            assert_ne!(off, policy);
            s.write("policy.toml", &off);
        }
        let out = super::sessions::serve(&s, &module, true, &["--zygotes", "1"]);
        out.check(out.code == 0, "wfjail serve exits 0");
        let r: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
        assert_eq!(r["answer"], "400000", "{r}");
        assert_eq!(r["status"], "ok", "{r}");
        let huge = r["huge_kib"].as_u64().unwrap();
        if collapsed {
            assert!(huge >= 2048, "some of the heap in huge pages: {r}");
        } else {
            assert_eq!(
                huge, 0,
                "WFJAIL_HUGEPAGES=0 leaves the heap in 4 KiB pages: {r}"
            );
        }
    }
}
