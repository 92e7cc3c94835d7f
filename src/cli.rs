//! Command-line types (clap). Flags become policy overrides or run options; no syscalls here.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::plan::ExtraGrant;
use crate::policy::Dur;

const ABOUT: &str =
    "Run workflow code where the kernel, not a language-level proxy, keeps it deterministic.";

const LONG_ABOUT: &str = "\
Run workflow code where the kernel, not a language-level proxy, keeps it deterministic.

Each execution gets a fresh process confined by Landlock (which files it may read or write), a
seccomp allowlist (no network, threads, subprocesses or exec; optionally no sleep and no
randomness), namespaces, rlimits and dropped capabilities. A forbidden call fails (or kills)
and is reported with the syscall, its arguments, the policy rule and a hint.";

const EXIT_CODES: &str = "\
Exit status:
  0   ok                      3   policy violation       6   guest killed by a signal
  1   guest error             4   timeout                125 wfjail could not confine
  2   usage or invalid policy 5   resource limit         126 command not executable
                                                         127 command not found

Examples:
  wfjail run --ro /usr -- /usr/bin/python3 -c 'print(1)'
  wfjail run -p strict --raw --report - -- /usr/bin/python3 -c 'import os; os.urandom(8)'
  wfjail serve -p temporal-python --zygote --preload my_workflows -- python3 worker.py
  wfjail check -p temporal-python
  wfjail policy show default
  wfjail policy validate my-policy.toml";

#[derive(Debug, Parser)]
#[command(name = "wfjail", version, about = ABOUT, long_about = LONG_ABOUT, after_help = EXIT_CODES)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a command confined by a policy, and report what happened.
    #[command(after_help = RUN_HELP)]
    Run(RunArgs),
    /// Show which confinement layers this kernel and container can enforce for a policy.
    #[command(after_help = CHECK_HELP)]
    Check(CheckArgs),
    /// List, show and validate policies.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Run a worker and serve it confined sessions (prefork zygote or exec) on a Unix socket.
    #[command(after_help = SERVE_HELP)]
    Serve(ServeArgs),
    /// Run a command once, watch what it reads, writes and calls beyond a base policy, and
    /// draft the policy that extends the base and lets that run pass.
    #[command(after_help = LEARN_HELP)]
    Learn(LearnArgs),
    /// Print a shell completion script: `wfjail completions bash > /etc/bash_completion.d/wfjail`
    /// (also zsh, fish, elvish, powershell).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff): `wfjail manpage > wfjail.1 && man ./wfjail.1`.
    Manpage,
}

const LEARN_HELP: &str = "\
The learning run has the base policy's writes, everything readable, and every call the base
would deny let through and recorded (privileged calls excepted: they stay denied). It gives
the command nothing a reviewed policy would not: writes outside the base's grants fail, as
they would in production; every write grant (--rw included) is a throw-away copy, discarded
after the run (learn never changes a file of the host, so the command's output is gone
too); network calls and file metadata changes (chmod, utimensat...) are refused and
recorded. The copies live in a mount namespace of learn's own (unprivileged: inside a user
namespace of its own).

The draft extends the base by the directories the run read and tried to write, and the
settings or syscalls it needed, each with a comment naming the call. It never grants /, a
system directory as a whole, a device beyond the usual ones, the home directory or a
directory above a file the run wrote: a comment lists what it refused, and why.

Then the command runs again under the draft (unless --no-verify), with throw-away copies,
without the network or the metadata calls it learned, under deny rather than warn, and
wfjail says whether that run passes, or that it could not verify the draft without them. A
run that failed on a denied write gets further the second time: learn again with -p DRAFT
until the draft passes. Review a draft before use: a grant is a file's whole directory, and
what the learning run read may appear in its output and the draft's comments.

Example:
  wfjail learn -p strict --output learned.toml -- /usr/bin/python3 app.py
  wfjail run -p learned.toml -- /usr/bin/python3 app.py

Exit status: 0 when the run under the draft passed; otherwise that run's status (see
`wfjail run --help`); 2 for a usage error; 125 when learn cannot keep the runs' writes off
the host (no mount namespace could be made).";

/// The paths a guest is given beyond its policy, the same flags for run, serve and learn
/// (learn says what they mean there in its own words).
#[derive(Debug, Args)]
pub struct GrantArgs {
    /// Also allow reading and executing under PATH.
    #[arg(long = "ro", value_name = "PATH")]
    pub ro: Vec<PathBuf>,
    /// Also allow reading and writing under PATH.
    #[arg(long = "rw", value_name = "PATH")]
    pub rw: Vec<PathBuf>,
}

impl GrantArgs {
    /// The grants the flags give (`--ro` first).
    pub fn grants(&self) -> Vec<ExtraGrant> {
        ExtraGrant::from_flags(&self.ro, &self.rw)
    }
}

/// What `--ro` and `--rw` mean to learn, which gives them to both of its runs (the writable
/// ones as throw-away copies) and leaves them out of the draft.
fn learn_grant_help(arg: clap::Arg) -> clap::Arg {
    match arg.get_id().as_str() {
        "ro" => arg.help(
            "Also allow reading and executing under PATH (in both runs; not part of the draft)",
        ),
        "rw" => arg.help(
            "Also allow writing under PATH (in both runs, into a throw-away copy of it; not part of the draft)",
        ),
        _ => arg,
    }
}

#[derive(Debug, Args)]
#[command(mut_args(learn_grant_help))]
pub struct LearnArgs {
    /// The policy to extend (a built-in name or a .toml path).
    #[arg(short, long, default_value = "default", value_name = "POLICY")]
    pub policy: String,
    /// Where to write the drafted policy (default: stdout).
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub grants: GrantArgs,
    /// The request payload for a framed guest (default: stdin, read once for both runs).
    #[arg(long, value_name = "FILE")]
    pub input: Option<PathBuf>,
    /// The guest does not speak the wfjail protocol (its stdin is the request).
    #[arg(long)]
    pub raw: bool,
    /// Wall-clock limit of each run (default: the base policy's).
    #[arg(long, value_name = "DURATION", value_parser = parse_dur)]
    pub timeout: Option<Dur>,
    /// Do not run the command again under the draft.
    #[arg(long)]
    pub no_verify: bool,
    /// The command and its arguments.
    #[arg(required = true, value_name = "CMD", trailing_var_arg = true, num_args = 1..)]
    pub command: Vec<String>,
}

const SERVE_HELP: &str = "\
The worker command runs unconfined (it must reach its server) with WFJAIL_SOCKET set to the
socket path. It opens sessions there with the Python client (python/wfjail/client.py) or any
client of the worker wire (docs/protocol.md): each session is one confined guest that answers
many calls, and its state lives exactly as long as the session.

With --zygote, each session is forked from a Python process that imported the --preload
modules once (copy-on-write, no start-up per workflow); sessions name a handler
\"module:function\" (bytes -> bytes). Only the zygote may fork; every child is under the full
policy. Without --zygote (exec mode), sessions give the argv of a guest that speaks the guest
protocol, and each is exec'd fresh.

When the worker exits, wfjail ends every guest and exits with the worker's status. SIGTERM or
SIGINT to wfjail is passed to the worker (SIGKILL after 10s).

Without a worker command, wfjail serves --socket PATH for workers started otherwise (the
Temporal runner starts it this way, with --exit-with-parent) until SIGTERM or SIGINT, then
ends every guest and exits 0. `STATUS` on the socket answers once it is ready.

Example:
  wfjail serve -p temporal-python --zygote --python .venv/bin/python \\
      --preload temporalio,my_workflows -- .venv/bin/python my_worker.py";

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Policy for every guest: a built-in name or a .toml path.
    #[arg(short, long, default_value = "default", value_name = "POLICY")]
    pub policy: String,
    /// The Unix socket to serve on (default: $XDG_RUNTIME_DIR or /tmp, wfjail-PID.sock).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// At most this many sessions at once (each holds a slot until it ends); an OPEN that
    /// finds none free is answered BUSY at once. Size it to the sessions a worker keeps open.
    #[arg(long, default_value_t = 64, value_name = "N")]
    pub max_executions: usize,
    /// Prefork mode: fork each session from a preloaded Python zygote.
    #[arg(long)]
    pub zygote: bool,
    /// Number of zygotes (forks are spread over them; default: one per CPU).
    #[arg(long, value_name = "N")]
    pub zygotes: Option<usize>,
    /// The zygote's interpreter; the `wfjail` package must be importable by it.
    #[arg(long, default_value = "/usr/bin/python3", value_name = "PATH")]
    pub python: PathBuf,
    /// Modules the zygote imports before any fork, comma-separated.
    #[arg(long, value_delimiter = ',', value_name = "MODULES")]
    pub preload: Vec<String>,
    /// Opt the zygote and its session children (not this server) into the kernel's
    /// same-page merging (KSM), which folds their identical pages into one once the host
    /// merges (`/sys/kernel/mm/ksm/run` = 1, set by root; `wfjail check` shows it). The log
    /// says at each zygote's start whether merging is on, and why not. Costs ksmd CPU and
    /// opens a timing side channel between processes that opted in: docs/temporal.md,
    /// docs/security.md.
    #[arg(long, requires = "zygote")]
    pub merge_pages: bool,
    #[command(flatten)]
    pub grants: GrantArgs,
    /// Wall-clock limit per call (default: the policy's limits.timeout).
    #[arg(long, value_name = "DURATION", value_parser = parse_dur)]
    pub timeout: Option<Dur>,
    /// Do not print violations and guest logs.
    #[arg(short, long)]
    pub quiet: bool,
    /// End when the process that started wfjail ends (a worker that started the server
    /// itself, like the Temporal runner, takes it along when it goes).
    #[arg(long)]
    pub exit_with_parent: bool,
    /// Keep the server's counters (sessions by outcome, calls and their latency, violations
    /// by category) in FILE, in the Prometheus text format, rewritten every second; a summary
    /// is printed on stderr when the server stops either way.
    #[arg(long, value_name = "FILE")]
    pub metrics: Option<PathBuf>,
    /// The worker command and its arguments. Without one, wfjail only serves the socket
    /// (`--socket` is then required) until SIGTERM or SIGINT, for a worker started otherwise.
    #[arg(last = true, value_name = "WORKER_CMD")]
    pub worker: Vec<String>,
}

const RUN_HELP: &str = "\
The command's path must be readable under the policy: grant an interpreter's install prefix
with --ro (e.g. --ro /usr, or --ro \"$(python3 -c 'import sys; print(sys.base_prefix)')\").
Launcher shims such as pyenv's exec another program, which the policy forbids: run the real
interpreter.

Without --report, a one-line summary is printed to stderr when the status is not ok, and a
line per violation as it happens. Exit status: 0 ok, 1 guest error, 2 usage/policy error,
3 violation, 4 timeout, 5 resource limit, 6 killed by a signal, 125 could not confine,
126 not executable, 127 not found.";

const CHECK_HELP: &str = "\
One row per layer: whether this host can apply it, whether the policy requires it, and what
would enable it when it is missing. Exits 125 when the policy's `require` cannot be met.";

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Policy: a built-in name (default, strict, temporal-python, permissive) or a .toml path.
    #[arg(short, long, default_value = "default", value_name = "POLICY")]
    pub policy: String,
    #[command(flatten)]
    pub grants: GrantArgs,
    /// The request payload (default: stdin).
    #[arg(long, value_name = "FILE")]
    pub input: Option<PathBuf>,
    /// Write the JSON report to FILE, or to stdout with `-` (after the guest's output).
    #[arg(long, value_name = "FILE|-")]
    pub report: Option<String>,
    /// Wall-clock limit, e.g. 500ms, 30s, 2m (overrides the policy's limits.timeout).
    #[arg(long, value_name = "DURATION", value_parser = parse_dur)]
    pub timeout: Option<Dur>,
    /// The guest does not speak the wfjail protocol: the request is its stdin and the result
    /// is its stdout.
    #[arg(long)]
    pub raw: bool,
    /// Seed of the guest's randomness under a policy with `[random] getrandom = "seeded"`:
    /// the same seed gives the same bytes to os.urandom, random and uuid4 (default 0).
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// Workflow time under a policy with `[time] clock = "virtual"`: every wall-clock read
    /// (time.time, datetime.now, C time/gettimeofday/clock_gettime) returns this instant.
    /// RFC 3339 (2026-12-01T09:30:00Z) or @SECONDS; default: the host's time at start,
    /// named in the report so that a run can be repeated.
    #[arg(long, value_name = "TIME")]
    pub clock: Option<String>,
    /// Run the command N times (N >= 2), each run after the first under one perturbation of
    /// what a deterministic program must not depend on (Python's hash seed, the address
    /// layout; the seed and the workflow time where the policy makes them the caller's), and
    /// say which change the result. Exit 0: the same result every time; 7: results differ;
    /// else the first failing run's status. A CI step for workflow code.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(2..=100))]
    pub check_determinism: Option<u32>,
    /// Do not echo the guest's stderr or print summaries (the report still has them).
    #[arg(short, long)]
    pub quiet: bool,
    /// The command and its arguments: after `--`, or without it from the first argument
    /// that is not an option of wfjail's (what follows is the command's, options included).
    #[arg(
        required = true,
        value_name = "CMD",
        trailing_var_arg = true,
        allow_hyphen_values = false,
        num_args = 1..
    )]
    pub command: Vec<String>,
}

fn parse_dur(s: &str) -> Result<Dur, String> {
    Dur::parse(s)
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The policy whose `require` list is checked.
    #[arg(short, long, default_value = "default", value_name = "POLICY")]
    pub policy: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// List the built-in policies.
    List {
        /// Print JSON: `[{"name", "description"}]`.
        #[arg(long)]
        json: bool,
    },
    /// Print a policy with `extends` applied and defaults filled in (a valid policy file).
    Show {
        /// A built-in name or a path.
        policy: String,
        /// Print JSON instead of TOML.
        #[arg(long)]
        json: bool,
    },
    /// Check policy files: syntax, keys, values, syscall names, `extends` chains.
    Validate {
        /// Files to check.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Print JSON: `[{"file", "ok", "error": {"message", "file", "line", "column",
        /// "field"} | null}]`.
        #[arg(long)]
        json: bool,
    },
}

/// `wfjail run`'s arguments read without clap, for the common shapes of a one-shot run:
/// building clap's whole command tree costs ~0.1 ms of a ~2.5 ms run (docs/benchmarks.md,
/// "Issue 28, fourth round"). `args` is the whole command line, the program name first.
///
/// `None` whenever anything is not plainly understood (another subcommand, `--help`, an
/// unknown or repeated option, grouped short flags, a value that does not parse or starts
/// with `-`, an argument that is not UTF-8): the caller then parses with clap, which gives
/// its usual result or error. `Some` is exactly what clap gives for the same command line
/// (`tests` below compare the two).
pub fn fast_run_args<I>(args: I) -> Option<RunArgs>
where
    I: IntoIterator<Item = std::ffi::OsString>,
{
    let mut args = args.into_iter().skip(1).map(|a| a.into_string().ok());
    if args.next()?.as_deref()? != "run" {
        return None;
    }
    let mut out = RunArgs {
        policy: "default".to_string(),
        grants: GrantArgs {
            ro: Vec::new(),
            rw: Vec::new(),
        },
        input: None,
        report: None,
        timeout: None,
        raw: false,
        seed: None,
        clock: None,
        check_determinism: None,
        quiet: false,
        command: Vec::new(),
    };
    let mut policy_set = false;
    // A value of an option: the next argument, or `--opt=VALUE`'s.
    fn value(
        inline: Option<&str>,
        rest: &mut dyn Iterator<Item = Option<String>>,
    ) -> Option<String> {
        let v = match inline {
            Some(v) => v.to_string(),
            None => rest.next()??,
        };
        // clap reads `-x` as an option, not a value (`-` alone is a value).
        (v == "-" || !v.starts_with('-')).then_some(v)
    }
    fn set<T>(slot: &mut Option<T>, v: T) -> Option<()> {
        // A single-valued option given twice is clap's error.
        slot.is_none().then(|| *slot = Some(v))
    }
    while let Some(arg) = args.next() {
        let arg = arg?;
        if arg == "--" {
            break;
        }
        if !arg.starts_with('-') {
            out.command.push(arg);
            break;
        }
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v)),
            _ => (arg.as_str(), None),
        };
        let flag = |b: &mut bool| (!*b && inline.is_none()).then(|| *b = true);
        match name {
            "-p" | "--policy" if !policy_set => {
                out.policy = value(inline, &mut args)?;
                policy_set = true;
            }
            "--ro" => out.grants.ro.push(value(inline, &mut args)?.into()),
            "--rw" => out.grants.rw.push(value(inline, &mut args)?.into()),
            "--input" => set(&mut out.input, value(inline, &mut args)?.into())?,
            "--report" => set(&mut out.report, value(inline, &mut args)?)?,
            "--timeout" => set(
                &mut out.timeout,
                parse_dur(&value(inline, &mut args)?).ok()?,
            )?,
            "--raw" => flag(&mut out.raw)?,
            "-q" | "--quiet" => flag(&mut out.quiet)?,
            "--seed" => set(&mut out.seed, value(inline, &mut args)?.parse().ok()?)?,
            "--clock" => set(&mut out.clock, value(inline, &mut args)?)?,
            "--check-determinism" => {
                let n: u32 = value(inline, &mut args)?.parse().ok()?;
                set(
                    &mut out.check_determinism,
                    (2..=100).contains(&n).then_some(n)?,
                )?
            }
            _ => return None,
        }
    }
    for arg in args {
        out.command.push(arg?);
    }
    (!out.command.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What clap makes of `line` when it is a run: its arguments, `Debug`-printed.
    fn by_clap(line: &[&str]) -> Option<String> {
        match Cli::try_parse_from(line).ok()?.command {
            Command::Run(a) => Some(format!("{a:?}")),
            _ => None,
        }
    }

    fn fast(line: &[&str]) -> Option<String> {
        fast_run_args(line.iter().map(std::ffi::OsString::from)).map(|a| format!("{a:?}"))
    }

    #[test]
    fn the_fast_run_parse_agrees_with_clap_or_declines() {
        let lines: &[&[&str]] = &[
            &["wfjail", "run", "-p", "default", "--raw", "--", "/bin/true"],
            &[
                "wfjail",
                "run",
                "-q",
                "-p",
                "default",
                "--raw",
                "--",
                "/bin/true",
            ],
            &["wfjail", "run", "/bin/true"],
            &["wfjail", "run", "/bin/echo", "-q", "--raw", "--", "x"],
            &["wfjail", "run", "--", "-q"],
            &["wfjail", "run", "--", "--", "x"],
            &[
                "wfjail",
                "run",
                "--policy=strict",
                "--ro=/usr",
                "--ro",
                "/opt",
                "--rw",
                "/tmp",
                "x",
            ],
            &["wfjail", "run", "--policy=", "x"],
            &["wfjail", "run", "--report", "-", "--input", "in.bin", "x"],
            &["wfjail", "run", "--report=-", "x"],
            &["wfjail", "run", "--report", "--raw", "x"],
            &[
                "wfjail",
                "run",
                "--timeout",
                "500ms",
                "--seed",
                "7",
                "--clock",
                "@5",
                "x",
            ],
            &["wfjail", "run", "--timeout", "soon", "x"],
            &["wfjail", "run", "--seed", "+7", "x"],
            &["wfjail", "run", "--seed", "-7", "x"],
            &["wfjail", "run", "--seed", "18446744073709551615", "x"],
            &["wfjail", "run", "--seed", "18446744073709551616", "x"],
            &["wfjail", "run", "--check-determinism", "2", "x"],
            &["wfjail", "run", "--check-determinism", "+3", "x"],
            &["wfjail", "run", "--check-determinism", "1", "x"],
            &["wfjail", "run", "--check-determinism", "101", "x"],
            &["wfjail", "run", "--check-determinism=100", "x"],
            &["wfjail", "run", "-p", "a", "-p", "b", "x"],
            &["wfjail", "run", "-p", "a", "--policy", "b", "x"],
            &["wfjail", "run", "--raw", "--raw", "x"],
            &["wfjail", "run", "--raw=true", "x"],
            &["wfjail", "run", "-q", "--quiet", "x"],
            &["wfjail", "run", "--seed", "1", "--seed", "2", "x"],
            &["wfjail", "run", "-qp", "default", "x"],
            &["wfjail", "run", "-pdefault", "x"],
            &["wfjail", "run", "-p=default", "x"],
            &["wfjail", "run", "-p"],
            &["wfjail", "run", "--raw"],
            &["wfjail", "run", "--"],
            &["wfjail", "run"],
            &["wfjail", "run", "--help"],
            &["wfjail", "run", "-h", "x"],
            &["wfjail", "run", "--version"],
            &["wfjail", "run", "--unknown", "x"],
            &["wfjail", "run", "-", "x"],
            &["wfjail", "--version"],
            &["wfjail", "check"],
            &["wfjail", "runs", "x"],
        ];
        let mut taken = 0;
        for line in lines {
            if let Some(f) = fast(line) {
                assert_eq!(Some(f), by_clap(line), "{line:?}");
                taken += 1;
            }
        }
        // The common shapes do take the fast path.
        assert!(taken >= 15, "{taken}");
        assert!(fast(lines[0]).is_some());
    }
}
