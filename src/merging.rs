//! Same-page merging (the kernel's KSM) for the zygote family: what the host does
//! (`/sys/kernel/mm/ksm`, a host-wide setting only root changes), what a process opted into
//! (`/proc/PID/ksm_stat`), and the line `wfjail serve --merge-pages` writes in the operator
//! log for each zygote it starts. The opt-in is the server's, never the guest's: the zygote's
//! pre-exec child calls `prctl(PR_SET_MEMORY_MERGE, 1)` before its filter is installed
//! (`confine::apply`), the exec keeps it and every child the zygote forks inherits it; every
//! policy's filter refuses that call, and `madvise(MADV_MERGEABLE)`, to the guest itself
//! (`policy::syscalls::ArgRule::PrctlNoMergeOptIn`). The zygote only says what the kernel
//! tells it (`python/wfjail/merging.py`: `PR_GET_MEMORY_MERGE`); `wfjail serve` itself is
//! never opted in. docs/temporal.md, "Same-page merging", is the operator's side.

use std::path::Path;

use serde::Serialize;

/// Where the kernel keeps KSM's settings.
pub const KSM_DIR: &str = "/sys/kernel/mm/ksm";

/// Where the operator guide says how to switch it on.
pub const GUIDE: &str = "docs/temporal.md, \"Same-page merging\"";

/// The host's KSM settings, as `wfjail check` and `wfjail serve --merge-pages` report them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Host {
    /// The kernel has KSM (`/sys/kernel/mm/ksm` exists: `CONFIG_KSM`).
    pub present: bool,
    /// `run`: 0 stopped (the default), 1 merging, 2 stopped with every merged page unmerged.
    pub run: Option<u64>,
    /// Pages `ksmd` scans per wake-up (the advisor tunes it when `advisor_mode` is
    /// `scan-time`)...
    pub pages_to_scan: Option<u64>,
    /// ...and how long it sleeps between wake-ups.
    pub sleep_millisecs: Option<u64>,
    /// The nominal scan rate of those two, pages per second.
    pub pages_per_second: Option<u64>,
    /// `none` or `scan-time` (Linux 6.9+; absent before).
    pub advisor_mode: Option<String>,
    /// The advisor's target for a full scan, seconds.
    pub advisor_target_scan_time: Option<u64>,
    /// The advisor's CPU ceiling for `ksmd`, percent of one CPU.
    pub advisor_max_cpu: Option<u64>,
    /// Pages merged now, host-wide: shared copies, and the mappings that use them.
    pub pages_shared: Option<u64>,
    pub pages_sharing: Option<u64>,
    /// Whether a process may opt in as a whole (`PR_GET_MEMORY_MERGE` answered: Linux 6.4+),
    /// or why not.
    pub prctl: String,
}

impl Host {
    /// Reads this host's settings (and asks the prctl of this process).
    pub fn read() -> Host {
        let prctl = match crate::sys::memory_merge() {
            Ok(_) => "yes".to_string(),
            Err(nix::errno::Errno::EINVAL) => {
                "no: PR_SET_MEMORY_MERGE is not in this kernel (Linux 6.4+, with KSM): `serve \
                 --merge-pages` stays off here"
                    .to_string()
            }
            Err(e) => format!("no: PR_GET_MEMORY_MERGE refused ({e}): a seccomp profile?"),
        };
        Host::read_from(Path::new(KSM_DIR), prctl)
    }

    /// Reads the settings in `dir` (a copy of `/sys/kernel/mm/ksm` in the tests).
    pub fn read_from(dir: &Path, prctl: String) -> Host {
        let num = |name: &str| -> Option<u64> {
            std::fs::read_to_string(dir.join(name))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        // "[none] scan-time": the bracketed one is selected.
        let advisor_mode = std::fs::read_to_string(dir.join("advisor_mode"))
            .ok()
            .and_then(|s| {
                let s = s.trim();
                let a = s.find('[')?;
                let b = s[a..].find(']')?;
                Some(s[a + 1..a + b].to_string())
            });
        let pages_to_scan = num("pages_to_scan");
        let sleep_millisecs = num("sleep_millisecs");
        Host {
            present: dir.is_dir(),
            run: num("run"),
            pages_to_scan,
            sleep_millisecs,
            pages_per_second: match (pages_to_scan, sleep_millisecs) {
                (Some(p), Some(ms)) => Some(p * 1000 / ms.max(1)),
                _ => None,
            },
            advisor_mode,
            advisor_target_scan_time: num("advisor_target_scan_time"),
            advisor_max_cpu: num("advisor_max_cpu"),
            pages_shared: num("pages_shared"),
            pages_sharing: num("pages_sharing"),
            prctl,
        }
    }

    /// Whether `ksmd` runs (`run` = 1).
    pub fn merges(&self) -> bool {
        self.run == Some(1)
    }

    /// Why this host merges nothing, or `None` when it merges.
    pub fn why_not(&self) -> Option<String> {
        if !self.present {
            return Some(format!(
                "this kernel has no same-page merging (no {KSM_DIR}: a kernel built without \
                 CONFIG_KSM)"
            ));
        }
        match self.run {
            Some(1) => None,
            Some(r) => Some(format!(
                "this host does not merge ({KSM_DIR}/run = {r}: a host-wide setting; root \
                 enables it with `echo 1 > {KSM_DIR}/run`, see {GUIDE})"
            )),
            None => Some(format!("{KSM_DIR}/run is not readable here")),
        }
    }

    /// How fast `ksmd` scans: the advisor, or the fixed rate.
    pub fn rate(&self) -> String {
        let now = match (
            self.pages_to_scan,
            self.sleep_millisecs,
            self.pages_per_second,
        ) {
            (Some(p), Some(ms), Some(pps)) => {
                format!("{p} pages every {ms} ms (~{pps} pages/s)")
            }
            _ => "rate not readable".to_string(),
        };
        match self.advisor_mode.as_deref() {
            Some("scan-time") => format!(
                "the kernel's advisor (scan-time: a full scan every {} s, at most {} % of a \
                 CPU), now {now}",
                self.advisor_target_scan_time
                    .map_or("?".into(), |t| t.to_string()),
                self.advisor_max_cpu.map_or("?".into(), |t| t.to_string()),
            ),
            _ => now,
        }
    }
}

/// What `/proc/PID/ksm_stat` says of one process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessKsm {
    /// `ksm_merge_any`: opted in as a whole (`PR_SET_MEMORY_MERGE`; Linux 6.8+ shows it).
    pub merge_any: Option<bool>,
    /// `ksm_mergeable`: some mapping of it may be merged (either way of opting in).
    pub mergeable: Option<bool>,
    /// `ksm_merging_pages`: its pages merged now.
    pub merging_pages: Option<u64>,
}

impl ProcessKsm {
    /// Reads `/proc/{pid}/ksm_stat` (`None`: gone, not readable, or a kernel without it).
    pub fn of(pid: i32) -> Option<ProcessKsm> {
        std::fs::read_to_string(format!("/proc/{pid}/ksm_stat"))
            .ok()
            .map(|t| ProcessKsm::parse(&t))
    }

    /// Parses the file's text ("ksm_merging_pages 12", "ksm_merge_any: yes").
    pub fn parse(text: &str) -> ProcessKsm {
        let mut out = ProcessKsm::default();
        for line in text.lines() {
            let mut it = line.split_whitespace();
            let (Some(key), Some(value)) = (it.next(), it.next()) else {
                continue;
            };
            let yes = match value {
                "yes" => Some(true),
                "no" => Some(false),
                _ => None,
            };
            match key.trim_end_matches(':') {
                "ksm_merge_any" => out.merge_any = yes,
                "ksm_mergeable" => out.mergeable = yes,
                "ksm_merging_pages" => out.merging_pages = value.parse().ok(),
                _ => {}
            }
        }
        out
    }
}

/// The zygote's words (it ran the preload) fit for one line of the log: control characters
/// blanked, at most 300 characters.
fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(300)
        .collect()
}

/// What the zygote's start knows of its opt-in, for [`notice`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptIn {
    /// `--merge-pages` was not given (the zygote was asked by its policy's `[env]` only).
    NotAsked,
    /// The pre-exec child's `prctl(PR_SET_MEMORY_MERGE, 1)` returned 0.
    Set,
    /// It failed with this errno (`confine::records::Step::MemoryMerge`).
    Refused(nix::errno::Errno),
}

/// The operator's line for a zygote started with `--merge-pages`: whether its family is
/// merged, and if not, why (`opt_in`: what its pre-exec child did; `took`: what its READY
/// said, `"any"` or `"off: why"`; `stat`: its `/proc/PID/ksm_stat`). `(on, text)`.
pub fn notice(
    opt_in: OptIn,
    took: Option<&str>,
    stat: Option<&ProcessKsm>,
    host: &Host,
) -> (bool, String) {
    match opt_in {
        OptIn::NotAsked => {
            return (
                false,
                "off: only `wfjail serve --merge-pages` opts a zygote in (WFJAIL_MERGE_PAGES in \
                 the policy's [env] does not)"
                    .into(),
            );
        }
        OptIn::Refused(e) => {
            let why = match e {
                nix::errno::Errno::EINVAL => {
                    "a kernel without it: Linux 6.4+ built with CONFIG_KSM".to_string()
                }
                e => format!("{e}: a seccomp profile or LSM refusing it?"),
            };
            return (
                false,
                format!(
                    "off: prctl(PR_SET_MEMORY_MERGE, 1) before the zygote's exec failed ({why})"
                ),
            );
        }
        OptIn::Set => {}
    }
    match took {
        None => {
            return (
                false,
                "off: the zygote did not say whether it is opted in (is its `wfjail` Python \
                 package older than this wfjail?)"
                    .into(),
            );
        }
        Some(t) if t.starts_with("off") => {
            // The zygote's words (it ran the preload): one line, bounded, in the log.
            let why = one_line(t.trim_start_matches("off").trim_start_matches(':').trim());
            return (
                false,
                format!("off: the zygote is not opted in after its exec ({why})"),
            );
        }
        Some("any") => {}
        // Only what the zygote says: anything else is its word, not the kernel's.
        Some(_) => {
            return (
                false,
                "off: the zygote answered an unknown merging mode".into(),
            );
        }
    }
    // The zygote's word checked against the kernel's, where the kernel shows it.
    if stat.and_then(|s| s.merge_any) == Some(false) {
        return (
            false,
            "off: the zygote said it is opted in but its /proc/PID/ksm_stat says \
             ksm_merge_any: no"
                .into(),
        );
    }
    let what = "the zygote and its session children opted in (merge-any, set by wfjail serve \
                before the zygote's exec)";
    match host.why_not() {
        Some(why) => (
            false,
            format!("off: {what}, but {why}; nothing is merged until then"),
        ),
        None => (
            true,
            format!("on: {what}; the host merges at {}", host.rate()),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(run: &str, advisor: &str) -> Host {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("wfjail-ksm-test-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (f, v) in [
            ("run", run),
            ("pages_to_scan", "100"),
            ("sleep_millisecs", "20"),
            ("advisor_mode", advisor),
            ("advisor_target_scan_time", "200"),
            ("advisor_max_cpu", "70"),
        ] {
            std::fs::write(dir.join(f), format!("{v}\n")).unwrap();
        }
        let h = Host::read_from(&dir, "yes".into());
        std::fs::remove_dir_all(&dir).unwrap();
        h
    }

    #[test]
    fn the_hosts_settings_and_rate_are_read() {
        let h = host("0", "[none] scan-time");
        assert_eq!(h.run, Some(0));
        assert_eq!(h.pages_per_second, Some(5000));
        assert_eq!(h.advisor_mode.as_deref(), Some("none"));
        assert!(!h.merges());
        assert!(h.why_not().unwrap().contains("run = 0"), "{h:?}");
        assert_eq!(h.rate(), "100 pages every 20 ms (~5000 pages/s)");
        let a = host("1", "none [scan-time]");
        assert!(a.merges() && a.why_not().is_none());
        assert!(
            a.rate()
                .starts_with("the kernel's advisor (scan-time: a full scan every 200 s")
        );
        let gone = Host::read_from(Path::new("/nonexistent/ksm"), "yes".into());
        assert!(!gone.present);
        assert!(gone.why_not().unwrap().contains("CONFIG_KSM"));
    }

    #[test]
    fn ksm_stat_is_parsed() {
        let s = ProcessKsm::parse(
            "ksm_rmap_items 10\nksm_zero_pages 0\nksm_merging_pages 7\n\
             ksm_process_profit 100\nksm_merge_any: yes\nksm_mergeable: yes\n",
        );
        assert_eq!(s.merge_any, Some(true));
        assert_eq!(s.mergeable, Some(true));
        assert_eq!(s.merging_pages, Some(7));
        assert_eq!(ProcessKsm::parse("ksm_rmap_items 0\n").merge_any, None);
    }

    #[test]
    fn the_notice_says_on_only_when_the_zygote_opted_in_and_the_host_merges() {
        let off = host("0", "[none] scan-time");
        let on = host("1", "[none] scan-time");
        let any = ProcessKsm {
            merge_any: Some(true),
            mergeable: Some(true),
            merging_pages: Some(0),
        };
        let set = OptIn::Set;
        let (ok, text) = notice(set, Some("any"), Some(&any), &on);
        assert!(
            ok && text.starts_with("on: ") && text.contains("5000 pages/s"),
            "{text}"
        );
        let (ok, text) = notice(set, Some("any"), Some(&any), &off);
        assert!(!ok && text.contains("run = 0"), "{text}");
        let einval = OptIn::Refused(nix::errno::Errno::EINVAL);
        let (ok, text) = notice(einval, Some("any"), Some(&any), &on);
        assert!(!ok && text.contains("Linux 6.4+"), "{text}");
        let (ok, text) = notice(OptIn::NotAsked, Some("any"), Some(&any), &on);
        assert!(
            !ok && text.contains("only `wfjail serve --merge-pages`"),
            "{text}"
        );
        let said = "off: PR_GET_MEMORY_MERGE answered 0";
        let (ok, text) = notice(set, Some(said), None, &on);
        assert!(
            !ok && text.contains("not opted in after its exec (PR_GET"),
            "{text}"
        );
        let not = ProcessKsm {
            merge_any: Some(false),
            ..any.clone()
        };
        let (ok, text) = notice(set, Some("any"), Some(&not), &on);
        assert!(!ok && text.contains("ksm_merge_any: no"), "{text}");
        let (ok, text) = notice(set, None, None, &on);
        assert!(!ok && text.contains("did not say"), "{text}");
        let (ok, text) = notice(set, Some("off: a\nwfjail: forged"), None, &on);
        assert!(!ok && !text.contains('\n'), "{text}");
        for other in ["all\nof it", "heap"] {
            let (ok, text) = notice(set, Some(other), Some(&any), &on);
            assert!(!ok && text.contains("unknown merging mode"), "{text}");
        }
    }
}
