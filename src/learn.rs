//! `wfjail learn`: drafts the policy a command needs, from one run that could read anything.
//!
//! The learning run (`run::run` with `RunOptions::learn`) has the base policy's writes,
//! `on_violation = "warn"` (every call the base denies proceeds and is recorded, privileged
//! ones excepted), everything readable, and every open sent to the supervisor. From what it
//! recorded, [`draft`] writes a policy that `extends` the base and adds exactly what the run
//! used beyond it, each with a comment naming the call that needed it:
//!
//! * files read outside the base's grants: their directories, read-only (a directory opened
//!   itself is granted as is; devices one by one; the guest's own `/proc` is left out);
//! * writes outside the base's grants (which failed: learning never writes where the base
//!   does not let it): the directories they were in, read-write;
//! * each other category the base denied: the setting that allows it (`[network] mode`,
//!   `[process] threads`, `[time] sleep`, `[random] getrandom`...), or the syscall in
//!   `[syscalls] allow`; privileged calls, which no policy may allow, as a comment.
//!
//! A draft is a start, not a verdict: `wfjail learn` runs the command again under it and says
//! whether that run passes; a denied write makes the second run get further than the first.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::policy::syscalls::{self, Category};
use crate::report::{Learned, Violation};

/// One grant of the draft and the calls that needed it.
#[derive(Debug, Default)]
struct Needed {
    /// The first call, shown.
    first: String,
    more: usize,
}

impl Needed {
    fn add(&mut self, call: String) {
        if self.first.is_empty() {
            self.first = call;
        } else {
            self.more += 1;
        }
    }

    fn comment(&self) -> String {
        if self.more == 0 {
            self.first.clone()
        } else {
            format!("{} (+{} more)", self.first, self.more)
        }
    }
}

/// The path of a recorded filesystem violation (`PATH (read)`, `PATH (write)`), if it has one.
fn recorded_path(v: &Violation) -> Option<(PathBuf, bool)> {
    let (path, write) = if let Some(p) = v.args.strip_suffix(" (read)") {
        (p, false)
    } else if let Some(p) = v.args.strip_suffix(" (write)") {
        (p, true)
    } else {
        return None;
    };
    path.starts_with('/').then(|| (PathBuf::from(path), write))
}

fn covered(path: &Path, grants: &[PathBuf]) -> bool {
    grants.iter().any(|g| path.starts_with(g))
}

/// What `path`, read by the run, is on the host: `(path, is a directory)`, canonical. `None`
/// for what needs no grant (the guest's own `/proc`, a path that does not exist here).
fn read_target(path: &Path) -> Option<(PathBuf, bool)> {
    if path.starts_with("/proc") {
        return None;
    }
    let real = std::fs::canonicalize(path).ok()?;
    let dir = real.is_dir();
    Some((real, dir))
}

/// The read grants for what the run read: a directory it opened as such, a directory two or
/// more of whose files it read, and otherwise the one file (so that reading `/etc/hostname`
/// does not grant `/etc`).
fn read_grants(targets: Vec<(PathBuf, bool, String)>) -> BTreeMap<PathBuf, Needed> {
    let mut dirs: BTreeMap<PathBuf, Needed> = BTreeMap::new();
    let mut files_in: BTreeMap<PathBuf, Vec<(PathBuf, String)>> = BTreeMap::new();
    for (path, is_dir, call) in targets {
        if is_dir {
            dirs.entry(path).or_default().add(call);
        } else if let Some(parent) = path.parent().filter(|_| !path.starts_with("/dev")) {
            files_in
                .entry(parent.to_path_buf())
                .or_default()
                .push((path, call));
        } else {
            dirs.entry(path).or_default().add(call);
        }
    }
    for (dir, mut files) in files_in {
        files.dedup_by(|a, b| a.0 == b.0);
        let distinct: std::collections::BTreeSet<&PathBuf> = files.iter().map(|f| &f.0).collect();
        if distinct.len() >= 2 {
            let entry = dirs.entry(dir).or_default();
            for (_, call) in files {
                entry.add(call);
            }
        } else {
            for (file, call) in files {
                dirs.entry(file).or_default().add(call);
            }
        }
    }
    dirs
}

/// The directory a denied write was in (the nearest one that exists).
fn write_grant(path: &Path) -> Option<PathBuf> {
    let mut dir = path.parent()?;
    loop {
        if let Ok(real) = std::fs::canonicalize(dir)
            && real.is_dir()
        {
            return Some(real);
        }
        dir = dir.parent()?;
    }
}

/// Keeps only the outermost of `grants` (one inside another adds nothing); the calls of an
/// inner one are counted at the outer one.
fn outermost(grants: BTreeMap<PathBuf, Needed>) -> BTreeMap<PathBuf, Needed> {
    let keys: Vec<PathBuf> = grants.keys().cloned().collect();
    let mut kept: BTreeMap<PathBuf, Needed> = BTreeMap::new();
    let mut inner: Vec<(PathBuf, usize)> = Vec::new();
    for (p, needed) in grants {
        match keys.iter().find(|k| **k != p && p.starts_with(k)) {
            Some(outer) => inner.push((outer.clone(), 1 + needed.more)),
            None => {
                kept.insert(p, needed);
            }
        }
    }
    for (outer, calls) in inner {
        // The outermost ancestor is kept (an ancestor of an ancestor is one too).
        if let Some((_, n)) = kept.iter_mut().find(|(k, _)| outer.starts_with(k)) {
            n.more += calls;
        }
    }
    kept
}

fn toml_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("{s:?}"))
}

/// The policy text that extends `base` (as `extends` names it) by what `learned` shows the
/// command used. `command` is shown in the header.
pub fn draft(base: &str, learned: &Learned, command: &[String]) -> String {
    let base_grants: Vec<PathBuf> = learned.read.iter().chain(&learned.write).cloned().collect();
    let mut read_targets: Vec<(PathBuf, bool, String)> = Vec::new();
    let mut writes: BTreeMap<PathBuf, Needed> = BTreeMap::new();
    let mut settings: BTreeMap<&'static str, (String, Needed)> = BTreeMap::new();
    let mut allow: BTreeMap<String, Needed> = BTreeMap::new();
    let mut never: BTreeMap<String, Needed> = BTreeMap::new();
    // A draft that allows threads leaves timed futex waits unjudged (threads wait for each
    // other that way: CPython's GIL), so those the learning run saw need no sleep grant.
    let threads = learned
        .violations
        .iter()
        .any(|v| v.category == Category::Thread);
    let mut started: u64 = 0;
    for v in &learned.violations {
        if threads && v.category == Category::Sleep && v.syscall.starts_with("futex") {
            continue;
        }
        let call = format!("{}({})", v.syscall, one_line(&v.args, 120));
        if let Some((path, write)) = recorded_path(v) {
            if write {
                if covered(&path, &learned.write) {
                    continue;
                }
                if let Some(g) = write_grant(&path) {
                    writes.entry(g).or_default().add(call);
                }
            } else if !covered(&path, &base_grants)
                && let Some((real, is_dir)) = read_target(&path)
                && !covered(&real, &base_grants)
            {
                read_targets.push((real, is_dir, call));
            }
            continue;
        }
        let setting = match v.category {
            Category::Network => Some(("network", "[network]\nmode = \"allow\"")),
            Category::Thread => Some(("threads", "[process]\nthreads = \"allow\"")),
            Category::Subprocess => Some(("subprocess", "[process]\nsubprocess = \"allow\"")),
            Category::Exec => Some(("exec", "[process]\nexec = \"allow\"")),
            Category::Sleep => Some(("sleep", "[time]\nsleep = \"allow\"")),
            Category::Clock => Some(("clock", "[time]\nclock = \"real\"")),
            Category::Random => Some(("random", "[random]\ngetrandom = \"allow\"")),
            _ => None,
        };
        if let Some((key, text)) = setting {
            settings
                .entry(key)
                .or_insert_with(|| (text.to_string(), Needed::default()))
                .1
                .add(call.clone());
            if matches!(v.category, Category::Thread | Category::Subprocess) {
                started += u64::from(v.count);
            }
        } else if v.action == crate::report::Action::Warned
            && v.category != Category::Privilege
            && syscalls::number(&v.syscall).is_some()
            && !syscalls::always_denied(&v.syscall)
            && !syscalls::BASE_ALLOWLIST.iter().any(|a| a.name == v.syscall)
        {
            allow.entry(v.syscall.clone()).or_default().add(call);
        } else {
            never.entry(v.syscall.clone()).or_default().add(call);
        }
    }
    // Threads and processes count against limits.processes (RLIMIT_NPROC, or a pids
    // cgroup): a base that allows one task (strict, default) would refuse what the draft
    // allows. Room for twice what the run started, at least 16.
    if started > 0
        && let Some(max) = learned.processes
    {
        let need = (2 * (started + 1)).max(16);
        if need > max {
            settings.insert(
                "processes",
                (
                    format!("[limits]\nprocesses = {need}"),
                    Needed {
                        first: format!(
                            "the run started {started} thread(s) or process(es); the base allows {max} task(s) in all"
                        ),
                        more: 0,
                    },
                ),
            );
        }
    }
    let reads = outermost(read_grants(read_targets));
    let writes = outermost(writes);

    let mut out = String::new();
    out.push_str(&format!(
        "# Drafted by `wfjail learn` from one run of: {}\n# Each grant says which call needed it. Review before use: a grant can be wider than the\n# run needed (a file's whole directory), and a run that wrote nowhere new learned no writes.\n",
        one_line(&command.join(" "), 200)
    ));
    out.push_str(&format!("extends = {}\n", toml_str(base)));
    if !reads.is_empty() || !writes.is_empty() {
        out.push_str("\n[filesystem]\n");
        for (name, list) in [("read", &reads), ("write", &writes)] {
            if list.is_empty() {
                continue;
            }
            out.push_str(&format!("{name} = [\n"));
            for (path, needed) in list {
                out.push_str(&format!(
                    "    {},  # {}\n",
                    toml_str(&path.display().to_string()),
                    one_line(&needed.comment(), 200)
                ));
            }
            out.push_str("]\n");
        }
    }
    // Settings, grouped by their table ([process] once).
    let mut tables: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (text, needed) in settings.values() {
        let (table, line) = text.split_once('\n').unwrap_or((text, ""));
        tables
            .entry(table)
            .or_default()
            .push(format!("{line}  # {}", one_line(&needed.comment(), 200)));
    }
    if !allow.is_empty() {
        let names: Vec<String> = allow
            .iter()
            .map(|(n, needed)| {
                format!(
                    "    {},  # {}",
                    toml_str(n),
                    one_line(&needed.comment(), 200)
                )
            })
            .collect();
        tables
            .entry("[syscalls]")
            .or_default()
            .push(format!("allow = [\n{}\n]", names.join("\n")));
    }
    for (table, lines) in &tables {
        out.push_str(&format!("\n{table}\n"));
        for l in lines {
            out.push_str(l);
            out.push('\n');
        }
    }
    if !never.is_empty() {
        out.push_str("\n# Denied whatever a policy says (they could weaken the sandbox):\n");
        for (name, needed) in &never {
            out.push_str(&format!(
                "#   {name}: {}\n",
                one_line(&needed.comment(), 200)
            ));
        }
    }
    out
}

fn one_line(s: &str, max: usize) -> String {
    let flat: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() > max {
        flat.chars().take(max).collect::<String>() + "..."
    } else {
        flat
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Action;

    fn v(category: Category, syscall: &str, args: &str) -> Violation {
        Violation {
            category,
            syscall: syscall.into(),
            args: args.into(),
            action: Action::Warned,
            rule: String::new(),
            hint: String::new(),
            count: 1,
        }
    }

    #[test]
    fn a_draft_with_threads_grants_no_sleep_for_timed_futex_waits() {
        let futex = v(Category::Sleep, "futex", "0xa5b8f0, 0x89, 0x0");
        let thread = v(Category::Thread, "clone", "CLONE_VM|CLONE_THREAD");
        let with = Learned {
            read: vec![],
            write: vec![],
            violations: vec![thread, futex.clone()],
            processes: Some(1),
        };
        let text = draft("strict", &with, &["python3".into()]);
        assert!(text.contains("threads = \"allow\""), "{text}");
        // strict allows one task: the thread needs room under limits.processes.
        assert!(text.contains("processes = 16"), "{text}");
        crate::policy::from_source("d.toml", &text).unwrap();
        assert!(!text.contains("sleep"), "{text}");
        // Without threads, a timed futex wait is Lock.acquire(timeout=...): a sleep.
        let without = Learned {
            read: vec![],
            write: vec![],
            violations: vec![futex],
            processes: None,
        };
        assert!(draft("strict", &without, &["python3".into()]).contains("sleep = \"allow\""));
    }

    #[test]
    fn a_draft_grants_what_the_run_used_beyond_the_base_and_says_why() {
        let learned = Learned {
            read: vec![PathBuf::from("/usr")],
            write: vec![PathBuf::from("/dev/null")],
            violations: vec![
                v(Category::Filesystem, "openat", "/usr/lib/os.py (read)"),
                v(Category::Filesystem, "openat", "/etc/hostname (read)"),
                v(Category::Filesystem, "openat", "/etc/hosts (read)"),
                v(Category::Filesystem, "openat", "/proc/self/status (read)"),
                v(Category::Filesystem, "openat", "/tmp/x/y.txt (write)"),
                v(Category::Sleep, "nanosleep", "0.2 s"),
                v(Category::Other, "setpriority", "0, 0, 10"),
            ],
            processes: None,
        };
        let text = draft("default", &learned, &["/usr/bin/python3".into()]);
        let p = crate::policy::from_source("learned.toml", &text).unwrap();
        assert!(
            text.contains("\"/etc\",  # openat(/etc/hostname (read)) (+1 more)"),
            "two files: the directory: {text}"
        );
        assert!(!text.contains("/usr/lib"), "inside the base: {text}");
        assert!(!text.contains("/proc"), "{text}");
        assert!(
            text.contains("\"/tmp\",  # openat(/tmp/x/y.txt (write))"),
            "{text}"
        );
        assert_eq!(p.time.sleep, crate::policy::Toggle::Allow);
        assert!(p.syscalls.allow.iter().any(|a| a.value.0 == "setpriority"));
    }
}
