//! wfjail's command line: parse, load the policy, dispatch, map the outcome to an exit status.

use std::io::{Read, Write};
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;

use wfjail::cli::{CheckArgs, Cli, Command, PolicyCommand, RunArgs, ServeArgs};
use wfjail::policy;
use wfjail::report::Status;
use wfjail::run::{RunOptions, run};

/// musl's allocator is slower than glibc's on wfjail's short start-up (docs/benchmarks.md).
#[cfg(target_env = "musl")]
#[global_allocator]
static GLOBAL: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

fn main() -> ExitCode {
    let start = std::time::Instant::now();
    // A one-shot run's usual command line is read without building clap's command tree
    // (anything else, errors and --help included, goes to clap).
    if let Some(args) = wfjail::cli::fast_run_args(std::env::args_os()) {
        let code = cmd_run(args);
        return exit(start, code);
    }
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            // --help and --version are not errors.
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    if matches!(
        cli.command,
        Command::Check(_) | Command::Policy(_) | Command::Completions { .. } | Command::Manpage
    ) {
        // Commands that only print: a closed stdout (`| head`) ends them quietly, as it ends
        // other Unix tools. The supervising commands keep SIGPIPE ignored (a guest closing a
        // pipe must not kill wfjail).
        let _ = wfjail::sys::reset_signals();
    }
    let code = match cli.command {
        Command::Run(args) => cmd_run(args),
        Command::Check(args) => cmd_check(args),
        Command::Policy(p) => cmd_policy(p),
        Command::Serve(args) => cmd_serve(args),
        Command::Learn(args) => cmd_learn(args),
        Command::Completions { shell } => {
            let mut cmd = <wfjail::cli::Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "wfjail", &mut std::io::stdout());
            Ok(0)
        }
        Command::Manpage => {
            let cmd = <wfjail::cli::Cli as clap::CommandFactory>::command();
            clap_mangen::Man::new(cmd)
                .render(&mut std::io::stdout())
                .context("writing the man page")
                .map(|()| 0)
        }
    };
    exit(start, code)
}

/// The exit status of a command's outcome (its error printed), after the timings.
fn exit(start: std::time::Instant, code: anyhow::Result<u8>) -> ExitCode {
    wfjail::timing::print(start);
    match code {
        Ok(c) => ExitCode::from(c),
        Err(e) => {
            eprintln!("wfjail: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn load_policy(spec: &str) -> Result<policy::Policy, u8> {
    policy::load(spec).map_err(|e| {
        eprintln!("wfjail: {e}");
        2
    })
}

fn cmd_run(args: RunArgs) -> anyhow::Result<u8> {
    wfjail::timing::mark("parse arguments");
    // A report that cannot be written is found out before anything runs: a caller that asked
    // for one must not get a run without it.
    if let Some(path) = args.report.as_deref().filter(|p| *p != "-")
        && let Err(e) = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)
    {
        eprintln!(
            "wfjail: --report {path}: {e}; choose a path in a writable directory, or --report - for stdout"
        );
        return Ok(2);
    }
    let policy = match policy::load(&args.policy) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("wfjail: {e}");
            // A caller reading JSON gets JSON, even for a policy that does not load.
            let report = wfjail::report::Report::launch_error(
                &args.policy,
                &args.command,
                format!("the policy does not load: {e}"),
                2,
            );
            write_report(args.report.as_deref(), &report, true)?;
            return Ok(2);
        }
    };
    wfjail::timing::mark("load policy");
    if let Some(seed) = args.seed
        && !policy::rules::getrandom::answered(&policy)
    {
        eprintln!(
            "wfjail: --seed {seed}: policy {} has [random] getrandom = \"{}\", where a seed has no effect; \
             use a policy with getrandom = \"seeded\" (extend {} and set it)",
            policy.name,
            policy.random.getrandom.as_str(),
            policy.name
        );
        return Ok(2);
    }
    let clock = match &args.clock {
        None => None,
        Some(_) if !policy::rules::clock::answered(&policy) => {
            eprintln!(
                "wfjail: --clock: policy {} has [time] clock = \"{}\", where a workflow time has no effect; \
                 use a policy with clock = \"virtual\" (extend {} and set it)",
                policy.name,
                policy.time.clock.as_str(),
                policy.name
            );
            return Ok(2);
        }
        Some(text) => match wfjail::workflow_time::parse(text) {
            Ok(ns) => Some(ns),
            Err(e) => {
                eprintln!("wfjail: --clock: {e}");
                return Ok(2);
            }
        },
    };
    let grants = args.grants.grants();
    let opts = RunOptions {
        argv: args.command.clone(),
        grants,
        timeout: args.timeout.map(|d| d.0),
        input: args.input.clone(),
        raw: args.raw,
        echo: !args.quiet,
        seed: args.seed,
        clock,
        learn: false,
    };
    if let Some(n) = args.check_determinism {
        return check_determinism(&policy, opts, n as usize, args.report.as_deref());
    }
    let mut stdout = LastByte {
        inner: std::io::stdout().lock(),
        last: None,
    };
    let report = run(&policy, &opts, &mut stdout);
    stdout.flush().ok();
    let result_ended_line = stdout.last.is_none_or(|b| b == b'\n');
    drop(stdout);
    // The report starts on a line of its own, after the result.
    write_report(args.report.as_deref(), &report, result_ended_line)?;
    if let (false, Some(g)) = (args.quiet, &report.guest_error) {
        // The guest's text, behind the guest prefix like its other output. A traceback that
        // ends in the violation already printed as it happened does not print it again.
        let traceback = if report.guest_error_is_a_violation() {
            g.traceback
                .trim_end()
                .rsplit_once('\n')
                .map_or("", |(head, _)| head)
                .to_string()
                + "\n"
        } else {
            g.traceback.clone()
        };
        let mut echo = wfjail::echo::LineEcho::new(wfjail::echo::GUEST_PREFIX);
        let mut text = echo.feed(traceback.as_bytes());
        text.extend(echo.finish());
        let _ = std::io::stderr().write_all(&text);
    }
    if !args.quiet && (report.status != Status::Ok || !report.layers.degraded.is_empty()) {
        eprintln!("{}", report.summary());
    }
    Ok(u8::try_from(report.exit_status).unwrap_or(125))
}

/// Writes `report` where `--report` asks (`-`: stdout, on a line of its own when
/// `line_start` is false).
fn write_report(
    to: Option<&str>,
    report: &wfjail::report::Report,
    line_start: bool,
) -> anyhow::Result<()> {
    match to {
        Some("-") => {
            let sep = if line_start { "" } else { "\n" };
            println!("{sep}{}", report.to_json());
        }
        Some(path) => {
            std::fs::write(path, report.to_json() + "\n")
                .with_context(|| format!("writing the report to {path}"))?;
        }
        None => {}
    }
    Ok(())
}

/// `run --check-determinism N`: the runs, a line each on stderr, the JSON on `--report`.
fn check_determinism(
    policy: &policy::Policy,
    mut opts: RunOptions,
    runs: usize,
    report: Option<&str>,
) -> anyhow::Result<u8> {
    // Every run reads the same request: stdin is read once into a file of our own.
    let _stdin_copy = keep_stdin(&mut opts, "check-determinism")?;
    let checked = wfjail::determinism::check(policy, &opts, runs);
    eprintln!(
        "wfjail: determinism check: {runs} runs of {} under policy {}",
        opts.argv.join(" "),
        policy.name
    );
    for (i, r) in checked.runs.iter().enumerate() {
        let verdict = if r.status != Status::Ok {
            format!("{} (exit {})", r.status.as_str(), r.report.exit_status)
        } else if r.same_result {
            "same result".to_string()
        } else {
            format!(
                "DIFFERENT result: {}",
                r.first_difference.as_deref().unwrap_or("")
            )
        };
        eprintln!("  run {i} ({}): {verdict}", r.perturbation.describe());
    }
    if checked.deterministic {
        eprintln!("wfjail: deterministic: every run gave the same result");
    } else if !checked.differs_under.is_empty() {
        eprintln!(
            "wfjail: nondeterministic: the result changed under {}",
            checked.differs_under.join(", ")
        );
    }
    match report {
        Some("-") => println!("{}", checked.to_json()),
        Some(path) => std::fs::write(path, checked.to_json() + "\n")
            .with_context(|| format!("writing the report to {path}"))?,
        None => {}
    }
    Ok(u8::try_from(checked.exit_status()).unwrap_or(125))
}

/// `wfjail learn`: a learning run under the base, the draft, and a run under the draft.
///
/// Neither run may give the command more than the base and the command line do: both run in
/// a mount namespace of wfjail's own where every write grant is a throw-away copy
/// (`learn::Throwaway`), without the network, and without file metadata changes (which
/// Landlock does not check); the verifying run is never a `warn` run.
fn cmd_learn(args: wfjail::cli::LearnArgs) -> anyhow::Result<u8> {
    let base = match load_policy(&args.policy) {
        Ok(p) => p,
        Err(code) => return Ok(code),
    };
    // `extends` in the draft: a built-in by name, a file by its absolute path (the draft
    // may be written anywhere).
    let extends = if args.policy.contains('/') || args.policy.ends_with(".toml") {
        std::fs::canonicalize(&args.policy)
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| args.policy.clone())
    } else {
        args.policy.clone()
    };
    let mut opts = RunOptions {
        argv: args.command.clone(),
        grants: args.grants.grants(),
        timeout: args.timeout.map(|d| d.0),
        input: args.input.clone(),
        raw: args.raw,
        echo: true,
        seed: None,
        clock: None,
        learn: true,
    };
    // Both runs read the same request.
    let _stdin_copy = keep_stdin(&mut opts, "learn")?;
    if let Err(e) = wfjail::learn::private_mounts() {
        eprintln!("wfjail: {e}");
        return Ok(125);
    }
    // Everything the base denies proceeds and is recorded, but nothing reaches outside: no
    // network, no metadata changes, no process or IPC object that outlives the run, at most
    // learn::MAX_TASKS tasks.
    let learning = wfjail::learn::learning_policy(&base);
    eprintln!(
        "wfjail: learning what {} needs beyond policy {} (its writes go to a throw-away copy, the network is refused)",
        args.command.join(" "),
        base.name
    );
    let mut sink = std::io::sink();
    let report = {
        let _copies = match throwaway(&learning, &opts) {
            Ok(t) => t,
            Err(code) => return Ok(code),
        };
        run(&learning, &opts, &mut sink)
    };
    let Some(learned) = &report.learned else {
        eprintln!("{}", report.summary());
        return Ok(u8::try_from(report.exit_status).unwrap_or(125));
    };
    if !report.layers.seccomp.contains("notify") {
        eprintln!(
            "wfjail: learn needs seccomp user notification to see what the command does; this host has none ({})",
            report.layers.seccomp
        );
        return Ok(125);
    }
    // The learning run lifted the process limit; the draft is measured against the base's.
    let learned = wfjail::report::Learned {
        processes: base.limits.processes,
        ..learned.clone()
    };
    let text = wfjail::learn::draft(&extends, &learned, &args.command);
    let refused_writes = learned
        .violations
        .iter()
        .filter(|v| v.args.ends_with(" (write)"))
        .count();
    eprintln!(
        "wfjail: the learning run ended {} ({} calls recorded{})",
        report.status.as_str(),
        learned.violations.len(),
        if refused_writes > 0 {
            format!(
                "; {refused_writes} write(s) outside policy {} were refused, as learning never writes there: the draft grants their directories where it may (its comments say what it does not grant)",
                base.name
            )
        } else {
            String::new()
        }
    );
    let draft_path = match &args.output {
        Some(path) => {
            std::fs::write(path, &text)
                .with_context(|| format!("writing the draft to {}", path.display()))?;
            eprintln!("wfjail: draft written to {}", path.display());
            path.clone()
        }
        None => {
            print!("{text}");
            std::env::temp_dir().join(format!("wfjail-learn-{}.toml", std::process::id()))
        }
    };
    if args.no_verify {
        return Ok(0);
    }
    // The draft is read as written; the base it extends, when a file, from that file.
    let sources = DraftSources {
        path: &draft_path,
        text: &text,
    };
    let mut drafted = match policy::load_from(&draft_path.display().to_string(), &sources) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("wfjail: the draft does not load (a bug in learn): {e}");
            return Ok(125);
        }
    };
    // The draft is not reviewed yet: its run gets neither the network nor the metadata calls
    // (chmod, utimensat, setxattr...) it learned, and is judged, not merely watched.
    let withheld = wfjail::learn::withhold_unreviewed(&mut drafted, &base);
    opts.learn = false;
    opts.echo = false;
    let check = {
        let _copies = match throwaway(&drafted, &opts) {
            Ok(t) => t,
            Err(code) => return Ok(code),
        };
        run(&drafted, &opts, &mut sink)
    };
    if check.status == Status::Ok {
        eprintln!(
            "wfjail: the command passes under the draft (its writes went to a throw-away copy, now gone)"
        );
    } else {
        eprintln!(
            "wfjail: under the draft: {}; learn again with -p {} (a denied write gets further each time)",
            check.summary().trim_start_matches("wfjail: "),
            draft_path.display()
        );
        for v in &check.violations {
            eprintln!("{}", v.summary());
        }
        if !withheld.is_empty() {
            eprintln!(
                "wfjail: not verified: learn never gives an unreviewed draft {}; review the draft and try it with `wfjail run -p {}`",
                withheld.join(", "),
                draft_path.display()
            );
        }
    }
    Ok(u8::try_from(check.exit_status).unwrap_or(125))
}

/// The policy files for loading a draft: the draft's text at its path (its file may not be
/// written: `--output` unset), other files (the base it extends) from the file system.
struct DraftSources<'a> {
    path: &'a std::path::Path,
    text: &'a str,
}

impl policy::Sources for DraftSources<'_> {
    fn read(&self, path: &std::path::Path) -> std::io::Result<policy::SourceText> {
        if path == self.path {
            Ok(policy::SourceText {
                text: self.text.to_string(),
                identity: path.to_path_buf(),
            })
        } else {
            policy::FileSystem.read(path)
        }
    }
}

/// Covers the write grants of a run of `policy` with throw-away copies (`learn::Throwaway`);
/// `Err` is the exit status when that cannot be done (a plan that does not build is not run
/// either: nothing would say which grants it wrote to).
fn throwaway(policy: &policy::Policy, opts: &RunOptions) -> Result<wfjail::learn::Throwaway, u8> {
    let req = wfjail::plan::PlanRequest {
        argv: opts.argv.clone(),
        grants: opts.grants.clone(),
        learn: opts.learn,
        ..Default::default()
    };
    let grants = match wfjail::plan::grants(policy, &req) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("wfjail: {e}");
            return Err(u8::try_from(e.exit_code()).unwrap_or(125));
        }
    };
    let size = policy
        .limits
        .disk
        .map_or(wfjail::learn::Throwaway::DEFAULT_SIZE, |d| d.0);
    match wfjail::learn::Throwaway::over(&grants.write, size) {
        Ok(t) => Ok(t),
        Err(e) => {
            eprintln!("wfjail: {e}");
            Err(125)
        }
    }
}

/// Removes a file of ours when dropped.
/// For commands that run a framed guest more than once: the request on stdin (unless
/// `--input` names a file), read once into a file of ours that each run reads, removed when
/// the returned guard drops.
fn keep_stdin(opts: &mut RunOptions, tag: &str) -> anyhow::Result<Option<RemoveOnDrop>> {
    if opts.input.is_some() {
        return Ok(None);
    }
    let mut bytes = Vec::new();
    std::io::stdin()
        .take(wfjail::protocol::MAX_FRAME as u64 + 1)
        .read_to_end(&mut bytes)
        .context("reading the request from stdin")?;
    let path = std::env::temp_dir().join(format!("wfjail-{tag}-{}.request", std::process::id()));
    // Its name can be guessed: made new (never through a link or over a file already there),
    // and for our eyes only (the request may hold what other users must not read).
    let mut file = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("keeping the request for every run in {}", path.display()))?
    };
    file.write_all(&bytes)
        .context("keeping the request for every run")?;
    opts.input = Some(path.clone());
    Ok(Some(RemoveOnDrop(path)))
}

struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn cmd_serve(args: ServeArgs) -> anyhow::Result<u8> {
    let policy = match load_policy(&args.policy) {
        Ok(p) => p,
        Err(code) => return Ok(code),
    };
    let grants = args.grants.grants();
    let zygote = args.zygote.then(|| {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        // The policy's preload list first, then the command line's.
        let mut preload = policy.zygote.preload.clone();
        preload.extend(
            args.preload
                .iter()
                .filter(|m| !policy.zygote.preload.contains(m))
                .cloned(),
        );
        let cfg = wfjail::serve::zygote::ZygoteConfig {
            python: args.python.clone(),
            preload,
            grants: grants.clone(),
            merge: args.merge_pages,
        };
        (cfg, args.zygotes.unwrap_or(cpus))
    });
    let opts = wfjail::serve::ServeOptions {
        socket: args.socket,
        max_executions: args.max_executions,
        zygote,
        grants,
        timeout: args.timeout.map(|d| d.0),
        worker: args.worker,
        exit_with_parent: args.exit_with_parent,
        echo: !args.quiet,
        metrics: args.metrics,
    };
    match wfjail::serve::serve(policy, opts) {
        Ok(code) => Ok(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("wfjail: {e}");
            Ok(u8::try_from(e.exit_code()).unwrap_or(125))
        }
    }
}

fn cmd_check(args: CheckArgs) -> anyhow::Result<u8> {
    let policy = match load_policy(&args.policy) {
        Ok(p) => p,
        Err(code) => return Ok(code),
    };
    let report = wfjail::check::check(&policy);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.table());
    }
    Ok(if report.ok { 0 } else { 125 })
}

fn cmd_policy(cmd: PolicyCommand) -> anyhow::Result<u8> {
    match cmd {
        PolicyCommand::List { json } => {
            let mut list = Vec::new();
            for (name, _) in policy::BUILTINS {
                let p = policy::load(name).with_context(|| format!("built-in policy {name}"))?;
                if json {
                    list.push(serde_json::json!({"name": name, "description": p.description}));
                } else {
                    println!("{name:<16} {}", p.description);
                }
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            }
            Ok(0)
        }
        PolicyCommand::Show { policy: spec, json } => {
            let p = match load_policy(&spec) {
                Ok(p) => p,
                Err(code) => return Ok(code),
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&p)?);
            } else {
                print!("{}", p.to_toml());
            }
            Ok(0)
        }
        PolicyCommand::Validate { files, json } => {
            let mut bad = 0;
            let mut docs = Vec::new();
            for f in &files {
                let result = policy::validate_file(f);
                if result.is_err() {
                    bad += 1;
                }
                if json {
                    let errors: Vec<serde_json::Value> = result
                        .as_ref()
                        .err()
                        .into_iter()
                        .flatten()
                        .map(|e| {
                            let at = e.location();
                            serde_json::json!({
                                "message": e.to_string(),
                                "file": at.map(|a| a.file.clone()),
                                "line": at.map(|a| a.line),
                                "column": at.map(|a| a.column),
                                "field": at.and_then(|a| a.field.clone()),
                            })
                        })
                        .collect();
                    docs.push(serde_json::json!({
                        "file": f.display().to_string(),
                        "ok": result.is_ok(),
                        "error": errors.first(),
                        "errors": errors,
                    }));
                } else {
                    match result {
                        Ok(_) => println!("{}: ok", f.display()),
                        Err(errors) => {
                            for e in &errors {
                                eprintln!("{e}");
                            }
                            if errors.len() > 1 {
                                eprintln!("{}: {} errors", f.display(), errors.len());
                            }
                        }
                    }
                }
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&docs)?);
            }
            Ok(if bad > 0 { 2 } else { 0 })
        }
    }
}

/// A writer that remembers the last byte written (to start the report on a new line).
struct LastByte<W: Write> {
    inner: W,
    last: Option<u8>,
}

impl<W: Write> Write for LastByte<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        if n > 0 {
            self.last = Some(buf[n - 1]);
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}
