//! The server's counters: sessions by how they ended, calls and their latency, violations by
//! category. Readable while it runs (`wfjail serve --metrics FILE`: the Prometheus text
//! format, rewritten every second by rename, so a reader never sees half a file) and printed
//! on stderr when it stops.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
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
}

impl Metrics {
    pub fn session_opened(&self) {
        self.sessions_opened.fetch_add(1, Ordering::Relaxed);
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

    /// Writes [`Metrics::render`] to `path` (a temporary file renamed over it).
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let tmp = PathBuf::from(format!("{}.tmp", path.display()));
        std::fs::write(&tmp, self.render())?;
        std::fs::rename(&tmp, path)
    }
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
    }
}
