//! The server's counters: sessions by how they ended, calls and their latency, violations by
//! category, zygote restarts. Readable while it runs (`wfjail serve --metrics FILE`: the
//! Prometheus text format, rewritten every second by rename, so a reader never sees half a
//! file; [`MetricsFile`]), in the answer to STATUS (zygote restarts: a worker relays them) and
//! printed on stderr when it stops.

use std::collections::BTreeMap;
use std::ffi::{CString, OsString};
use std::hash::{BuildHasher, Hasher};
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the call-latency histogram, in seconds.
const BUCKETS: [f64; 10] = [0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 10.0];

#[derive(Debug, Default)]
pub struct Metrics {
    sessions_opened: AtomicU64,
    sessions_busy: AtomicU64,
    /// By the status of the session's report (`ok`, `violation`, `timeout`...).
    sessions_ended: Mutex<BTreeMap<String, u64>>,
    calls: AtomicU64,
    call_errors: AtomicU64,
    call_micros: AtomicU64,
    /// Calls at or under each of [`BUCKETS`] (cumulative, as Prometheus wants them).
    call_buckets: [AtomicU64; BUCKETS.len()],
    violations: Mutex<BTreeMap<String, u64>>,
    zygote_restarts: AtomicU64,
    /// Lingering guests killed before their grace ended, displaced by newer ones.
    linger_displaced: AtomicU64,
}

impl Metrics {
    /// A dead zygote was replaced.
    pub fn zygote_restarted(&self) {
        self.zygote_restarts.fetch_add(1, Ordering::Relaxed);
    }

    /// Zygotes replaced since the server started (STATUS's `zygote_restarts`).
    pub fn zygote_restarts(&self) -> u64 {
        self.zygote_restarts.load(Ordering::Relaxed)
    }

    pub fn session_opened(&self) {
        self.sessions_opened.fetch_add(1, Ordering::Relaxed);
    }

    /// A lingering guest was killed before its grace ended: a newer one took its place.
    pub fn linger_displaced(&self) {
        self.linger_displaced.fetch_add(1, Ordering::Relaxed);
    }

    pub fn session_busy(&self) {
        self.sessions_busy.fetch_add(1, Ordering::Relaxed);
    }

    /// A session ended with a report of `status` listing `violations` (category, count).
    pub fn session_ended<'a>(
        &self,
        status: &str,
        violations: impl Iterator<Item = (&'a str, u64)>,
    ) {
        *self
            .sessions_ended
            .lock()
            .unwrap()
            .entry(status.to_string())
            .or_default() += 1;
        let mut v = self.violations.lock().unwrap();
        for (category, count) in violations {
            *v.entry(category.to_string()).or_default() += count;
        }
    }

    /// A call answered after `took` (`error`: with ERROR).
    pub fn call(&self, took: Duration, error: bool) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if error {
            self.call_errors.fetch_add(1, Ordering::Relaxed);
        }
        self.call_micros
            .fetch_add(took.as_micros() as u64, Ordering::Relaxed);
        let s = took.as_secs_f64();
        for (i, b) in BUCKETS.iter().enumerate() {
            if s <= *b {
                self.call_buckets[i].fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The Prometheus text exposition of the counters.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut counter = |name: &str, help: &str, lines: Vec<(String, u64)>| {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} counter\n"));
            for (labels, v) in lines {
                out.push_str(&format!("{name}{labels} {v}\n"));
            }
        };
        counter(
            "wfjail_sessions_opened_total",
            "Sessions whose guest said HELLO.",
            vec![(String::new(), self.sessions_opened.load(Ordering::Relaxed))],
        );
        counter(
            "wfjail_sessions_busy_total",
            "OPENs answered BUSY (every slot taken).",
            vec![(String::new(), self.sessions_busy.load(Ordering::Relaxed))],
        );
        counter(
            "wfjail_sessions_ended_total",
            "Sessions ended, by the status of their report.",
            self.sessions_ended
                .lock()
                .unwrap()
                .iter()
                .map(|(s, n)| (format!("{{status=\"{s}\"}}"), *n))
                .collect(),
        );
        counter(
            "wfjail_violations_total",
            "Violations recorded in ended sessions, by category.",
            self.violations
                .lock()
                .unwrap()
                .iter()
                .map(|(c, n)| (format!("{{category=\"{c}\"}}"), *n))
                .collect(),
        );
        counter(
            "wfjail_zygote_restarts_total",
            "Zygotes that died and were replaced.",
            vec![(String::new(), self.zygote_restarts())],
        );
        counter(
            "wfjail_lingering_displaced_total",
            "Closed guests killed before their exit grace ended: a newer closed guest took \
             the place of the one that had lingered longest (at most --max-executions linger).",
            vec![(String::new(), self.linger_displaced.load(Ordering::Relaxed))],
        );
        counter(
            "wfjail_waits_timed_out_total",
            "Waits on a session's path that ended on their timeout (a backstop) instead of \
             their event, by wait: 0 unless some session stalled.",
            super::waits::counts()
                .into_iter()
                .map(|(w, n)| (format!("{{wait=\"{w}\"}}"), n))
                .collect(),
        );
        counter(
            "wfjail_pid_answers_total",
            "A zygote session's pinned pid: answered by the router (notified), sessions whose \
             own C library answers it (in_guest), sessions left to the router (skipped_*).",
            super::pid_answers::counts()
                .into_iter()
                .map(|(w, n)| (format!("{{answer=\"{w}\"}}"), n))
                .collect(),
        );
        counter(
            "wfjail_call_errors_total",
            "Calls answered with ERROR.",
            vec![(String::new(), self.call_errors.load(Ordering::Relaxed))],
        );
        let calls = self.calls.load(Ordering::Relaxed);
        out.push_str(
            "# HELP wfjail_call_seconds Time from a call's request to its answer.\n# TYPE wfjail_call_seconds histogram\n",
        );
        for (i, b) in BUCKETS.iter().enumerate() {
            out.push_str(&format!(
                "wfjail_call_seconds_bucket{{le=\"{b}\"}} {}\n",
                self.call_buckets[i].load(Ordering::Relaxed)
            ));
        }
        out.push_str(&format!(
            "wfjail_call_seconds_bucket{{le=\"+Inf\"}} {calls}\nwfjail_call_seconds_sum {}\nwfjail_call_seconds_count {calls}\n",
            self.call_micros.load(Ordering::Relaxed) as f64 / 1e6
        ));
        out
    }

    /// [`Metrics::render`], with the gauges of the slots: sessions `open`, and closed guests
    /// `lingering` (not exited yet, holding no slot).
    pub fn render_with_gauges(&self, open: usize, lingering: usize) -> String {
        let mut out = self.render();
        for (name, help, v) in [
            ("wfjail_sessions_open", "Sessions holding a slot now.", open),
            (
                "wfjail_guests_lingering",
                "Closed guests not exited yet (killed at their exit grace); they hold no slot.",
                lingering,
            ),
        ] {
            out.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}\n"
            ));
        }
        out
    }

    /// One line for stderr when the server stops.
    pub fn summary(&self) -> String {
        let ended: Vec<String> = self
            .sessions_ended
            .lock()
            .unwrap()
            .iter()
            .map(|(s, n)| format!("{n} {s}"))
            .collect();
        let calls = self.calls.load(Ordering::Relaxed);
        let mean = if calls > 0 {
            format!(
                ", {:.2} ms mean",
                self.call_micros.load(Ordering::Relaxed) as f64 / calls as f64 / 1000.0
            )
        } else {
            String::new()
        };
        let violations: u64 = self.violations.lock().unwrap().values().sum();
        format!(
            "wfjail: served {} sessions ({}), {} busy; {calls} calls{mean}; {violations} violations",
            self.sessions_opened.load(Ordering::Relaxed),
            if ended.is_empty() {
                "none ended".to_string()
            } else {
                ended.join(", ")
            },
            self.sessions_busy.load(Ordering::Relaxed),
        )
    }
}

/// Where `--metrics` writes: the file's directory, opened once, and the file's name in it.
/// Each write creates a temporary file of a random name there that must not exist yet
/// (`O_CREAT | O_EXCL | O_NOFOLLOW`, beneath the directory), writes it and renames it over
/// the file: a symbolic link or a file planted at any name in that directory is never
/// followed nor written (a planted link at the file's own name is replaced, not followed).
#[derive(Debug)]
pub struct MetricsFile {
    dir: OwnedFd,
    name: CString,
    /// The temporary names' prefix: `.NAME.`, then a random number and `.tmp`.
    prefix: OsString,
}

/// Temporary names tried before a write gives up (each taken name was planted, or is
/// another writer's).
const TEMP_TRIES: usize = 16;

impl MetricsFile {
    /// Opens `path`'s directory (the file itself need not exist).
    pub fn open(path: &Path) -> std::io::Result<MetricsFile> {
        let invalid = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, what);
        let name = path
            .file_name()
            .ok_or_else(|| invalid("the metrics path names no file"))?;
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let dir = std::fs::File::open(dir)?;
        if !dir.metadata()?.is_dir() {
            return Err(invalid("the metrics path's parent is not a directory"));
        }
        let mut prefix = OsString::from(".");
        prefix.push(name);
        prefix.push(".");
        Ok(MetricsFile {
            dir: dir.into(),
            name: CString::new(name.as_bytes()).map_err(|_| invalid("a NUL in the path"))?,
            prefix,
        })
    }

    /// Writes `text` as the file's whole new content, atomically for a reader.
    pub fn write(&self, text: &str) -> std::io::Result<()> {
        let flags =
            (libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW) | libc::O_CLOEXEC;
        for _ in 0..TEMP_TRIES {
            let mut tmp = self.prefix.clone();
            tmp.push(format!("{:016x}.tmp", random_u64()));
            let tmp = CString::new(tmp.as_bytes()).expect("no NUL: checked at open");
            let fd = match crate::sys::openat2_beneath(self.dir.as_fd(), &tmp, flags as u64, 0o644)
            {
                Ok(fd) => fd,
                Err(nix::errno::Errno::EEXIST) => continue,
                Err(e) => return Err(e.into()),
            };
            let renamed = std::fs::File::from(fd)
                .write_all(text.as_bytes())
                .and_then(|()| {
                    crate::sys::path_op(
                        self.dir.as_fd(),
                        &crate::sys::PathOp::Rename {
                            from: &tmp,
                            to_dir: self.dir.as_fd(),
                            to: &self.name,
                            flags: 0,
                        },
                    )
                    .map_err(std::io::Error::from)
                });
            if renamed.is_err() {
                let _ = crate::sys::path_op(
                    self.dir.as_fd(),
                    &crate::sys::PathOp::Unlink {
                        name: &tmp,
                        flags: 0,
                    },
                );
            }
            return renamed;
        }
        Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            "every temporary name tried was taken",
        ))
    }
}

/// A random number for a temporary name (std's per-process random hash keys, and a count).
fn random_u64() -> u64 {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNT.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_render_as_prometheus_text() {
        let m = Metrics::default();
        m.session_opened();
        m.call(Duration::from_millis(3), false);
        m.call(Duration::from_millis(30), true);
        m.session_ended("violation", [("network", 2u64)].into_iter());
        let text = m.render();
        assert!(text.contains("wfjail_sessions_opened_total 1\n"), "{text}");
        assert!(text.contains("wfjail_sessions_ended_total{status=\"violation\"} 1\n"));
        assert!(text.contains("wfjail_violations_total{category=\"network\"} 2\n"));
        assert!(text.contains("wfjail_call_seconds_bucket{le=\"0.005\"} 1\n"));
        assert!(text.contains("wfjail_call_seconds_bucket{le=\"0.05\"} 2\n"));
        assert!(text.contains("wfjail_call_seconds_count 2\n"));
        assert!(text.contains("wfjail_call_errors_total 1\n"));
        assert!(
            m.summary().contains("1 sessions (1 violation)"),
            "{}",
            m.summary()
        );
        m.zygote_restarted();
        assert!(m.render().contains("wfjail_zygote_restarts_total 1\n"));
    }

    #[test]
    fn the_slots_gauges_and_displaced_lingering_guests_render() {
        let m = Metrics::default();
        m.linger_displaced();
        let text = m.render_with_gauges(3, 2);
        assert!(
            text.contains("wfjail_lingering_displaced_total 1\n"),
            "{text}"
        );
        assert!(text.contains("# TYPE wfjail_sessions_open gauge\nwfjail_sessions_open 3\n"));
        assert!(text.contains("# TYPE wfjail_guests_lingering gauge\nwfjail_guests_lingering 2\n"));
    }

    #[test]
    fn temporary_names_differ() {
        assert_ne!(random_u64(), random_u64());
    }
}
