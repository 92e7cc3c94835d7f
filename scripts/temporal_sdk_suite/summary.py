"""Side-by-side counts of scripts/temporal-sdk-suite's runs: summary.py OUT_DIR RUNNER..."""

import json
import os
import sys

out, runners = sys.argv[1], sys.argv[2:]
results = {}
for r in runners:
    path = os.path.join(out, r + ".json")
    if os.path.exists(path):
        with open(path) as f:
            results[r] = json.load(f)
    else:
        print("%s: no results (%s; see %s.log)" % (r, path, os.path.join(out, r)))
keys = ("passed", "failed", "error", "skipped")
print("%-12s" % "runner" + "".join("%9s" % k for k in keys) + "%9s" % "total")
for r, res in results.items():
    counts = [len(res[k]) for k in keys]
    print("%-12s" % r + "".join("%9d" % c for c in counts) + "%9d" % sum(counts)
          + ("" if res.get("complete") else "  (stopped before the end)"))
if "unsandboxed" in results and "jailed" in results:
    jailed = results["jailed"]
    ran = set().union(*(jailed[k] for k in keys))
    lost = [n for n in results["unsandboxed"]["passed"] if n in ran and n not in jailed["passed"]]
    print("\npasses unsandboxed, fails jailed: %d (of the %d tests both ran)"
          % (len(lost), len(ran & set().union(*(results["unsandboxed"][k] for k in keys)))))
    for n in lost:
        print("  " + n)
        for line in jailed["errors"].get(n, "skipped").splitlines()[:3]:
            print("      " + line[:200])
