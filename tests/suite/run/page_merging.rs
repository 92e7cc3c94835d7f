//! A guest cannot opt itself into same-page merging (KSM): under every built-in policy,
//! `prctl(PR_SET_MEMORY_MERGE, 1)` and `madvise(addr, len, MADV_MERGEABLE)` fail with EPERM
//! (also under `permissive`'s `warn`: a merged page's copy-on-write timing is a side channel
//! to every other opted-in process on the host), and the report names each call, its
//! decoded arguments, the rule and the hint. Opting out (`PR_SET_MEMORY_MERGE, 0`,
//! `MADV_UNMERGEABLE`) and asking (`PR_GET_MEMORY_MERGE`) still run. Only `wfjail serve
//! --merge-pages` opts a zygote in (`serve::merging`).

use crate::common::{PY, wfjail};

/// Each call, its result and errno, on one line each.
const OPT_IN: &str = r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
buf = ctypes.create_string_buffer(3 * 4096)
page = (ctypes.addressof(buf) + 4095) & ~4095
def say(what, r):
    os.write(1, b"%s %d %d\n" % (what, r, ctypes.get_errno() if r < 0 else 0))
say(b"set", libc.prctl(67, 1, 0, 0, 0))
say(b"madvise", libc.madvise(page, 4096, 12))
say(b"get", libc.prctl(68, 0, 0, 0, 0))
say(b"unset", libc.prctl(67, 0, 0, 0, 0))
say(b"unmerge", libc.madvise(page, 4096, 13))
"#;

fn line<'a>(stdout: &'a str, key: &str) -> &'a str {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no {key} line in {stdout:?}"))
}

#[test]
fn no_built_in_policy_lets_a_guest_opt_into_same_page_merging() {
    let eperm = format!("-1 {}", libc::EPERM);
    for policy in ["default", "strict", "permissive", "temporal-python"] {
        let o = wfjail(&["run", "-p", policy, "--raw", "--", PY, "-c", OPT_IN]);
        let what = |s: &str| format!("{policy}: {s}");
        o.check(
            line(&o.stdout, "set") == eperm,
            &what("prctl(67, 1): EPERM"),
        );
        o.check(
            line(&o.stdout, "madvise") == eperm,
            &what("madvise(MADV_MERGEABLE): EPERM"),
        );
        o.check(
            line(&o.stdout, "get") == "0 0",
            &what("PR_GET_MEMORY_MERGE answers 0"),
        );
        o.check(line(&o.stdout, "unset") == "0 0", &what("opting out runs"));
        o.check(
            line(&o.stdout, "unmerge") == "0 0",
            &what("MADV_UNMERGEABLE runs"),
        );
        for (call, arg) in [
            ("prctl", "PR_SET_MEMORY_MERGE"),
            ("madvise", "MADV_MERGEABLE"),
        ] {
            let v = o.assert_violation(call, "privilege");
            o.check(
                v["args"].as_str().unwrap().contains(arg),
                &what(&format!("{call}: {arg} named")),
            );
            o.check(
                v["rule"].as_str().unwrap().contains("same-page merging"),
                &what(&format!("{call}: the rule")),
            );
            o.check(
                v["hint"].as_str().unwrap().contains("--merge-pages"),
                &what(&format!("{call}: the hint")),
            );
            o.check(v["action"] == "denied", &what(&format!("{call}: denied")));
        }
        // No other prctl or madvise (CPython's and glibc's own run).
        let calls = o.report["violations"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|v| v["syscall"] == "prctl" || v["syscall"] == "madvise")
            .count();
        o.check(calls == 2, &what("only the two opt-ins are violations"));
    }
}
