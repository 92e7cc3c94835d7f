//! The execution report (docs/contract.md, "The report") and how an outcome maps to a
//! status and exit code (docs/contract.md, "Statuses and exit codes").

use serde::Serialize;

use crate::policy::syscalls::Category;

/// The outcome of one execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Ok,
    GuestError,
    Violation,
    Timeout,
    Limit,
    Crashed,
    /// wfjail itself was asked to stop (SIGTERM, SIGINT, SIGHUP): the guest was killed.
    Interrupted,
    LaunchError,
}

impl Status {
    /// Every status, in declaration order (tests/suite/cli/contract_doc.rs checks each against
    /// docs/contract.md, and this list against the enum).
    pub const ALL: [Status; 8] = [
        Status::Ok,
        Status::GuestError,
        Status::Violation,
        Status::Timeout,
        Status::Limit,
        Status::Crashed,
        Status::Interrupted,
        Status::LaunchError,
    ];

    /// wfjail's exit status for this outcome (docs/contract.md, "Statuses and exit codes").
    /// Launch errors carry their own code (125, 126, 127 or 2) in [`Report::exit_status`].
    pub fn exit_code(self) -> i32 {
        match self {
            Status::Ok => 0,
            Status::GuestError => 1,
            Status::Violation => 3,
            Status::Timeout => 4,
            Status::Limit => 5,
            Status::Crashed => 6,
            // 128 + the signal, as shells report it; the report carries the exact one.
            Status::Interrupted => 128 + libc::SIGTERM,
            Status::LaunchError => 125,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::GuestError => "guest_error",
            Status::Violation => "violation",
            Status::Timeout => "timeout",
            Status::Limit => "limit",
            Status::Crashed => "crashed",
            Status::Interrupted => "interrupted",
            Status::LaunchError => "launch_error",
        }
    }
}

/// What the supervisor did about a violation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Denied,
    Killed,
    Warned,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Denied => "denied",
            Action::Killed => "killed",
            Action::Warned => "warned",
        }
    }
}

/// One forbidden operation the guest attempted.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Violation {
    pub category: Category,
    pub syscall: String,
    pub args: String,
    pub action: Action,
    /// The policy rule that forbids it.
    pub rule: String,
    pub hint: String,
    /// How many times this same call was made (identical category, syscall, arguments).
    pub count: u32,
}

impl Violation {
    /// The one-line human summary the supervisor prints to stderr.
    pub fn summary(&self) -> String {
        // The arguments come from the guest (paths, argv): escaped, so that they cannot end
        // the line and start one of wfjail's.
        let args = one_line(&self.args);
        let times = if self.count > 1 {
            format!(" (x{})", self.count)
        } else {
            String::new()
        };
        format!(
            "wfjail: violation: {} {}({}) {}{} [{}]: {}",
            self.category.as_str(),
            self.syscall,
            args,
            self.action.as_str(),
            times,
            self.rule,
            self.hint
        )
    }
}

/// Landlock ABI versions: what the kernel offers and what wfjail enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LandlockAbi {
    pub kernel: u32,
    pub enforced: u32,
}

/// The layers that were actually applied.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Layers {
    /// `abi-N` (the ABI the ruleset was built for), or `none`.
    pub landlock: String,
    /// The kernel's Landlock ABI and the one enforced (at most the pinned ABI wfjail was
    /// tested on); `null` without Landlock.
    pub landlock_abi: Option<LandlockAbi>,
    /// `user-notify` (violations named), `filter` (in-filter actions only), or `none`.
    pub seccomp: String,
    pub namespaces: Vec<&'static str>,
    /// `none` when every capability set is empty; otherwise what remains.
    pub capabilities: String,
    pub no_new_privs: bool,
    /// Layers that could not be applied, as `layer: reason`.
    pub degraded: Vec<String>,
}

/// An error the guest reported over the protocol (exception type, message, traceback).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GuestError {
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
    pub traceback: String,
}

/// The version of the report's format: 2 added `schema_version`, `wfjail_version`,
/// `finished_at`, `clock`, and every key present (null when unset).
pub const SCHEMA_VERSION: u32 = 2;

/// A report with what a reader needs to interpret it first.
#[derive(Serialize)]
struct Stamped<'a> {
    schema_version: u32,
    wfjail_version: &'static str,
    /// When the report was made (RFC 3339, UTC, to the microsecond).
    finished_at: String,
    #[serde(flatten)]
    report: &'a Report,
}

/// What a `wfjail learn` run saw: the policy's own grants (canonical) and every violation,
/// reads included.
#[derive(Debug, Clone, Default)]
pub struct Learned {
    pub read: Vec<std::path::PathBuf>,
    pub write: Vec<std::path::PathBuf>,
    pub violations: Vec<Violation>,
    /// The base policy's `limits.processes` (threads and processes count against it).
    pub processes: Option<u64>,
}

/// The JSON report of one execution.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub status: Status,
    /// The guest's exit code, when it exited.
    pub exit_code: Option<i32>,
    /// The signal that ended the guest, e.g. `SIGKILL`.
    pub signal: Option<String>,
    pub violations: Vec<Violation>,
    pub duration_ms: f64,
    pub cpu_ms: f64,
    pub max_rss_kb: u64,
    pub policy: String,
    pub layers: Layers,
    pub stderr_tail: String,
    /// For `limit`: which one (`memory`, `cpu`, `file_size`, `output`).
    pub limit: Option<String>,
    /// For `launch_error` and protocol failures: what went wrong and what to do.
    pub error: Option<String>,
    pub guest_error: Option<GuestError>,
    pub command: Vec<String>,
    /// The seed the guest's randomness came from, under `[random] getrandom = "seeded"`.
    pub seed: Option<u64>,
    /// The workflow time the guest's wall clock read, under `[time] clock = "virtual"`
    /// (RFC 3339; `wfjail run --clock` repeats it).
    pub clock: Option<String>,
    /// Policy paths that do not exist on this host and were skipped.
    pub skipped_paths: Vec<String>,
    /// `wfjail learn`: what the learning run saw (not part of the JSON report).
    #[serde(skip)]
    pub learned: Option<Learned>,
    /// wfjail's own exit status for this report.
    #[serde(skip)]
    pub exit_status: i32,
}

impl Report {
    /// A report for a run that failed before the guest started.
    pub fn launch_error(
        policy: &str,
        command: &[String],
        error: String,
        exit_status: i32,
    ) -> Report {
        Report {
            status: Status::LaunchError,
            exit_code: None,
            signal: None,
            violations: vec![],
            duration_ms: 0.0,
            cpu_ms: 0.0,
            max_rss_kb: 0,
            policy: policy.to_string(),
            layers: Layers::default(),
            stderr_tail: String::new(),
            limit: None,
            error: Some(error),
            guest_error: None,
            command: command.to_vec(),
            seed: None,
            clock: None,
            skipped_paths: vec![],
            learned: None,
            exit_status,
        }
    }

    /// The report as JSON: every key present (null or empty when it does not apply), times
    /// to the microsecond, behind what a reader needs to interpret it — the report format's
    /// version, wfjail's version and when the report was made.
    pub fn to_json(&self) -> String {
        let mut report = self.clone();
        report.duration_ms = (report.duration_ms * 1000.0).round() / 1000.0;
        report.cpu_ms = (report.cpu_ms * 1000.0).round() / 1000.0;
        let stamped = Stamped {
            schema_version: SCHEMA_VERSION,
            wfjail_version: env!("CARGO_PKG_VERSION"),
            finished_at: crate::workflow_time::format(
                crate::workflow_time::host_now() / 1000 * 1000,
            ),
            report: &report,
        };
        serde_json::to_string_pretty(&stamped).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }

    /// One line for a human (stderr), e.g. `wfjail: violation (exit 3) in 2.1 ms ...`.
    /// The guest's error is the `wfjail.Violation` of a violation the report lists (the
    /// guest library raised it for a denied call): the console has shown it already.
    pub fn guest_error_is_a_violation(&self) -> bool {
        self.guest_error.as_ref().is_some_and(|g| {
            g.kind == "wfjail.Violation"
                && self
                    .violations
                    .iter()
                    .any(|v| g.message.starts_with(&format!("{}: ", v.category.as_str())))
        })
    }

    pub fn summary(&self) -> String {
        let mut s = format!(
            "wfjail: {} in {:.1} ms under policy {}",
            self.status.as_str(),
            self.duration_ms,
            self.policy
        );
        if let Some(code) = self.exit_code {
            s.push_str(&format!("; guest exit code {code}"));
        }
        if let Some(sig) = &self.signal {
            s.push_str(&format!("; guest killed by {sig}"));
        }
        if let Some(l) = &self.limit {
            s.push_str(&format!("; {l} limit reached"));
        }
        if let Some(e) = &self.error {
            s.push_str(&format!("; {}", one_line(e)));
        }
        if !self.layers.degraded.is_empty() {
            // What was not applied, by name (the report has why and what would enable it).
            let names: Vec<&str> = self
                .layers
                .degraded
                .iter()
                .map(|d| d.split(':').next().unwrap_or(d).trim())
                .collect();
            s.push_str(&format!(
                "; degraded: {} (see the report's layers.degraded)",
                names.join(", ")
            ));
        }
        if self.status != Status::LaunchError && self.layers.seccomp == "filter" {
            s.push_str(
                "; violations cannot be named here (no seccomp user notification): a denied call may show as a guest error, not as exit 3",
            );
        }
        if let Some(g) = self
            .guest_error
            .as_ref()
            .filter(|_| !self.guest_error_is_a_violation())
        {
            // The guest's own words: escaped, so that they stay on this line. A violation
            // the guest raised was printed when it happened: not again here.
            s.push_str(&format!(
                "; {}: {}",
                one_line(&g.kind),
                one_line(&g.message)
            ));
        }
        s
    }
}

/// `text` on one line: control characters (newlines, escape sequences) written as `\xNN`.
pub fn one_line(text: &str) -> String {
    crate::echo::escape_guest_text(text.as_bytes())
}

/// Signal names for reports.
pub fn signal_name(sig: i32) -> String {
    nix::sys::signal::Signal::try_from(sig)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| format!("signal {sig}"))
}
