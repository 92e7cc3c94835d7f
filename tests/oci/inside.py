"""Runs inside a real OCI container (see scripts/test-oci): wfjail under the container's
seccomp profile and user, checked as a user would see it.

Mounted by the caller: the static wfjail binary at /usr/local/bin/wfjail, this directory at
/oci and the repository's python/ (the `wfjail` package) at /wfjail-python, all read-only.
Prints one line per check ("ok NAME" or "FAIL NAME: why") and a last JSON line with what the
host side asserts across configurations; exits 1 when a check failed.
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time

WFJAIL = "/usr/local/bin/wfjail"
PY = "/usr/bin/python3"
WORK = tempfile.mkdtemp(prefix="wfjail-oci-")
failed = []
summary = {"uid": os.getuid()}


def check(name, ok, why=""):
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else ": " + why), flush=True)
    if not ok:
        failed.append(name)


def write(name, text):
    path = os.path.join(WORK, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def run(policy, code, *extra):
    """`wfjail run --raw` of a Python snippet with a JSON report: (exit code, report,
    stdout + stderr)."""
    report = os.path.join(WORK, "report.json")
    if os.path.exists(report):
        os.unlink(report)
    p = subprocess.run(
        [WFJAIL, "run", "--raw", "-p", policy, "--report", report, *extra, "--", PY, "-c",
         code],
        capture_output=True, text=True, timeout=60, cwd=WORK,
    )
    doc = None
    if os.path.exists(report):
        with open(report) as f:
            doc = json.load(f)
    return p.returncode, doc, p.stdout + p.stderr


def violation(doc, category, syscall, arg_part=""):
    return any(
        v["category"] == category and v["syscall"] == syscall and arg_part in (v["args"] or "")
        for v in (doc or {}).get("violations", [])
    )


def show(doc, err):
    return "report %s; stderr %r" % (json.dumps(doc)[:1500], err[-800:])


# What this runtime lets wfjail enforce, as `check` predicts it.
p = subprocess.run([WFJAIL, "check", "--json"], capture_output=True, text=True)
rows = {r["layer"]: r for r in json.loads(p.stdout)["rows"]}
missing = sorted(name for name, r in rows.items() if not r["available"])
summary["check_missing"] = missing
# What a run of this policy degrades: the missing rows it uses.
missing_used = sorted(name for name, r in rows.items() if not r["available"] and r["used"])
check("check exits 0 (default requires only Landlock and seccomp)", p.returncode == 0, p.stderr)
for needed in ("landlock", "seccomp", "seccomp-notify"):
    check("check: %s available" % needed, rows[needed]["available"], rows[needed]["detail"])

# A clean run: status ok, and `degraded` lists exactly the namespaces check said were missing.
code, doc, err = run("default", "print('hello from the guest')")
check("clean run exits 0 with status ok", code == 0 and doc and doc["status"] == "ok",
      show(doc, err))
degraded = sorted(d.split(":")[0] for d in (doc or {}).get("layers", {}).get("degraded", []))
summary["run_degraded"] = degraded
predicted = missing_used
check("run's degraded layers are the ones check reported missing", degraded == predicted,
      "run %s, check %s" % (degraded, predicted))
# Calls the container's profile answers before wfjail's filter (an errno outranks a user
# notification): check and run must name them, since their violations cannot be reported.
detail = rows["container-seccomp"]["detail"]
unseen = []
if not rows["container-seccomp"]["available"]:
    unseen = detail.split("refuses ", 1)[1].split(" itself", 1)[0].split(", ")
summary["unreported"] = unseen
check("the console summary names what is degraded",
      all(d in err for d in degraded), err[-800:])

# Enforcement, each with its report entry.
code, doc, err = run("default", "import socket; socket.socket(socket.AF_INET)")
check("network: socket(AF_INET) reported, exit 3",
      code == 3 and violation(doc, "network", "socket", "AF_INET"), show(doc, err))
code, doc, err = run("default", "open('/etc/wfjail-oci-probe', 'w')")
check("a write outside the grants is reported with its path, exit 3",
      code == 3 and violation(doc, "filesystem", "openat", "/etc/wfjail-oci-probe"),
      show(doc, err))
check("... and the file was not created", not os.path.exists("/etc/wfjail-oci-probe"))
code, doc, err = run("default", "import threading; threading.Thread(target=print).start()")
check("thread: clone3 reported, exit 3",
      code == 3 and any(v["category"] == "thread" for v in doc["violations"]),
      show(doc, err))
code, doc, err = run("default", "import os; os.fork()")
check("process: fork reported, exit 3",
      code == 3 and any(v["category"] == "subprocess" for v in doc["violations"]),
      show(doc, err))
code, doc, err = run("default", "import os; os.execv('/bin/true', ['true'])")
check("exec: execve reported with its path, exit 3",
      code == 3 and violation(doc, "exec", "execve", "/bin/true"), show(doc, err))
# unshare(CLONE_NEWUSER) through ctypes (Python 3.11 has no os.unshare).
code, doc, err = run(
    "default",
    "import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
    "r = libc.unshare(0x10000000); print('unshare', r, ctypes.get_errno())",
    "--ro", "/usr/lib/x86_64-linux-gnu",
)
if "unshare" in unseen:
    check("unshare refused by the container first: EPERM, and the report says it is unseen",
          code == 0 and "unshare -1 1" in err and doc["status"] == "ok"
          and any(d.startswith("container-seccomp: ") and "unshare" in d
                  for d in doc["layers"]["degraded"]), show(doc, err))
else:
    check("unshare from the guest: refused and reported, exit 3",
          code == 3 and "unshare -1 1" in err
          and any(v["syscall"] == "unshare" for v in doc["violations"]), show(doc, err))

# Workflow time and seeded randomness need ptrace at exec (the vDSO is patched).
policy = write("time.toml", 'extends = "default"\n[filesystem]\ndrop = ["/dev/urandom"]\n'
               '[time]\nclock = "virtual"\n[random]\ngetrandom = "seeded"\n')
code, doc, err = run(policy, "import time, os; print('T', time.time(), os.urandom(4).hex())",
                     "--clock", "@1700000000", "--seed", "7")
if rows["exec-stop"]["available"]:
    check("virtual clock and seeded getrandom work (exec-stop available)",
          code == 0 and "T 1700000000.0 " in err,
          show(doc, err))
else:
    check("virtual clock without exec-stop: exit 125 naming ptrace",
          code == 125 and "ptrace" in err, show(doc, err))

# `require`d namespaces: 125 exactly when check said they are missing.
policy = write("require.toml", 'extends = "default"\nrequire = ["landlock", "seccomp", '
               '"namespaces"]\n')
code, doc, err = run(policy, "print('required layers present')")
want = 125 if any(m in missing for m in
                  ("user-ns", "pid-ns", "net-ns", "ipc-ns", "uts-ns", "mount-ns")) else 0
summary["require_namespaces_exit"] = code
check("require namespaces: exit %d" % want, code == want, show(doc, err))

def stop(server):
    """Ends a `wfjail serve` (SIGTERM, then SIGKILL after 20 s): its stderr."""
    if server.poll() is None:
        server.terminate()
    try:
        return server.communicate(timeout=20)[1]
    except subprocess.TimeoutExpired:
        server.kill()
        return server.communicate()[1]


# serve --zygote: one server, two sessions forked from a preloaded zygote.
policy = write("serve.toml", 'extends = "default"\n[filesystem]\nread = ["/oci", '
               '"/wfjail-python"]\n[env]\nset = { PYTHONPATH = "/wfjail-python:/oci" }\n')
sock = os.path.join(WORK, "serve.sock")
server = subprocess.Popen(
    [WFJAIL, "serve", "-p", policy, "--socket", sock, "--zygote", "--zygotes", "1",
     "--python", PY, "--preload", "oci_handler"],
    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
)
try:
    sys.path.insert(0, "/wfjail-python")
    from wfjail import Violation  # noqa: E402
    from wfjail.client import Client  # noqa: E402

    deadline = time.monotonic() + 30
    client = Client(sock)
    while True:
        try:
            client.status()
            break
        except (OSError, ConnectionError):
            if time.monotonic() > deadline or server.poll() is not None:
                raise
            time.sleep(0.1)
    results = []
    for name in ("a", "b"):
        with client.session(handler="oci_handler:echo") as s:
            results.append(s.call(name.encode()))
    check("serve --zygote: two sessions answer", results == [b"echo a", b"echo b"],
          repr(results))
    with client.session(handler="oci_handler:connect") as s:
        try:
            s.call(b"")
            denied = "no error"
        except Violation as e:
            denied = [e.category, e.syscall]
    check("serve --zygote: a session's socket() is denied and reported",
          denied == ["network", "socket"], repr(denied))
except Exception as e:  # noqa: BLE001 (every failure becomes a FAIL line)
    check("serve --zygote works", False, "%s: %s" % (type(e).__name__, e))
finally:
    err = stop(server)
check("serve exits 0 on SIGTERM", server.returncode == 0,
      "exit %s: %s" % (server.returncode, err[-1500:]))


# ---- Every built-in policy: `check` predicts what `run` and `serve` do -------------------------
#
# For each policy, check's rows say which layers are missing (`available` false) and which of
# those the policy uses (`used`): a used, required one makes run and serve exit 125 naming it;
# a used, best-effort one is listed in their reports' `degraded`, and nothing else is.

# (label, built-in, what the label adds to it): the built-ins, and temporal-python with the
# pinned layout required, which default profiles refuse.
POLICIES = [(name, name, "") for name in ("default", "permissive", "strict", "temporal-python")]
POLICIES.append(("temporal-python+require", "temporal-python",
                 'require = ["seccomp", "landlock", "address-layout"]\n'))
# What a 125's message says for each layer that can be required here.
FATAL_WORDS = {"exec-stop": "ptrace", "address-layout": "address-layout", "landlock": "Landlock",
               "seccomp": "seccomp", "seccomp-notify": "listener"}


def layer_names(entries):
    return sorted({d.split(":")[0] for d in entries})


def serve_session(policy_file, calls, extra=()):
    """`wfjail serve --zygote` under `policy_file`: one session per (handler, request, seed,
    time_ns) of `calls`, each {"result", "report"}; or the server's exit code and stderr when
    it stopped before answering."""
    sock = os.path.join(WORK, "serve-%d.sock" % len(os.listdir(WORK)))
    server = subprocess.Popen(
        [WFJAIL, "serve", "-q", "-p", policy_file, "--socket", sock, "--zygote", "--zygotes",
         "1", "--python", PY, "--preload", "oci_handler", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=WORK,
    )
    out = {"sessions": [], "exit": None, "stderr": ""}
    try:
        sys.path.insert(0, "/wfjail-python")
        from wfjail.client import Client  # noqa: E402
        client = Client(sock)
        deadline = time.monotonic() + 30
        while server.poll() is None:
            try:
                client.status()
                break
            except (OSError, ConnectionError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        if server.poll() is None:
            for handler, request, seed, time_ns in calls:
                with client.session(handler="oci_handler:" + handler, seed=seed,
                                    time_ns=time_ns) as s:
                    result = s.call(request)
                out["sessions"].append({"result": result.decode(), "report": s.report})
    except Exception as e:  # noqa: BLE001 (reported by the caller)
        out["error"] = "%s: %s" % (type(e).__name__, e)
    finally:
        out["stderr"] = stop(server)
        out["exit"] = server.returncode
    return out


WORKFLOW_CODE = (
    "import sys; sys.path.insert(0, '/oci'); import oci_handler; "
    "print(oci_handler.workflow(b'').decode())"
)
matrix = {}
for name, base, adds in POLICIES:
    m = matrix[name] = {}
    policy = write("%s.toml" % name, 'extends = "%s"\n%s' % (base, adds)) if adds else name
    p = subprocess.run([WFJAIL, "check", "-p", policy, "--json"], capture_output=True,
                       text=True, cwd=WORK)
    doc = json.loads(p.stdout)
    rows = doc["rows"]
    fatal = sorted(r["layer"] for r in rows if r["used"] and r["required"] and not r["available"])
    best_effort = sorted(r["layer"] for r in rows
                         if r["used"] and not r["required"] and not r["available"])
    m["check_exit"], m["fatal"], m["degraded"] = p.returncode, fatal, best_effort
    m["missing_unused"] = sorted(r["layer"] for r in rows
                                 if not r["used"] and not r["available"]
                                 and r["layer"] not in ("cgroups",))
    check("%s: check exits 125 exactly when a used, required layer is missing" % name,
          p.returncode == (125 if fatal else 0), "exit %d, fatal %s" % (p.returncode, fatal))

    # run: 125 naming each missing required layer, else ok with `degraded` as predicted.
    code, doc, err = run(policy, "print('ran under %s')" % name)
    m["run_exit"] = code
    if fatal:
        check("%s: run exits 125 naming %s" % (name, fatal),
              code == 125 and all(FATAL_WORDS.get(f, f) in err for f in fatal), show(doc, err))
    else:
        got = layer_names((doc or {}).get("layers", {}).get("degraded", []))
        m["run_degraded"] = got
        check("%s: run is ok and degrades exactly what check predicted" % name,
              code == 0 and doc["status"] == "ok" and got == best_effort,
              "run %s, check %s; %s" % (got, best_effort, show(doc, err)))

    # serve --zygote under the same policy (with the test's modules readable).
    served_policy = write("serve-%s.toml" % name,
                          'extends = "%s"\n%s[filesystem]\nread = ["/oci", "/wfjail-python"]\n'
                          '[env]\nset = { PYTHONPATH = "/wfjail-python:/oci" }\n' % (base, adds))
    calls = [("echo", b"x", None, None)]
    if base == "temporal-python":
        t_ns = 1_700_000_000_000_000_000
        calls = [("workflow", b"", 7, t_ns), ("workflow", b"", 7, t_ns)]
    served = serve_session(served_policy, calls)
    m["serve_exit"] = served["exit"]
    if fatal:
        check("%s: serve exits 125 naming %s" % (name, fatal),
              served["exit"] == 125 and not served["sessions"]
              and all(FATAL_WORDS.get(f, f) in served["stderr"] for f in fatal),
              repr(served)[-1500:])
    else:
        ok = len(served["sessions"]) == len(calls) and served["exit"] == 0
        got = [layer_names(s["report"]["layers"]["degraded"]) for s in served["sessions"]]
        m["serve_degraded"] = got[0] if got else None
        check("%s: serve --zygote sessions complete, degrading what check predicted" % name,
              ok and all(s["report"]["status"] == "ok" for s in served["sessions"])
              and all(g == best_effort for g in got),
              "serve %s, check %s; sessions (status, violations) %s; %s"
              % (got, best_effort,
                 [(s["report"]["status"], [[v["syscall"], v["args"], v["action"]]
                                           for v in s["report"].get("violations", [])])
                  for s in served["sessions"]],
                 repr(served)[-1500:]))
        if base == "temporal-python" and ok:
            a, b = (json.loads(s["result"]) for s in served["sessions"])
            check("temporal-python sessions: workflow time and seeded randomness repeat",
                  a["time"] == 1700000000.0 and a["now"].startswith("2023-11-14T22:13:20")
                  and {k: a[k] for k in ("time", "random", "uuid")}
                  == {k: b[k] for k in ("time", "random", "uuid")}, "%r %r" % (a, b))

    # A workflow-like program under temporal-python, run twice: it works, and repeats; its
    # addresses repeat exactly when check said the layout can be pinned.
    if base == "temporal-python" and not fatal:
        outs = []
        for _ in range(2):
            code, doc, err = run(policy, WORKFLOW_CODE, "--clock", "@1700000000", "--seed", "7",
                                 "--ro", "/oci")
            line = [ln for ln in err.splitlines() if ln.startswith("{")]
            outs.append(json.loads(line[0]) if code == 0 and line else None)
        check("temporal-python: a workflow-like program reads the workflow time and seed",
              all(outs) and outs[0]["time"] == 1700000000.0
              and all(outs[0][k] == outs[1][k] for k in ("time", "now", "random", "uuid")),
              "%r; %s" % (outs, show(doc, err)))
        pinned = "address-layout" not in best_effort
        m["ids_repeat"] = bool(all(outs) and outs[0]["id"] == outs[1]["id"])
        check("temporal-python: id() repeats between runs exactly when address-layout is there",
              all(outs) and m["ids_repeat"] == pinned, "%r, pinned %s" % (outs, pinned))
summary["policies"] = matrix

summary["failed"] = failed
print(json.dumps(summary))
sys.exit(1 if failed else 0)
