//! The list of violations of one execution (answering them is `notify.rs`).

use std::collections::{HashMap, HashSet};

use crate::report::{Action, Violation};

/// Distinct (syscall, arguments, action) entries kept in a report with their arguments;
/// repeats are counted.
const MAX_DISTINCT_VIOLATIONS: usize = 256;
/// Distinct (syscall, action) kinds kept once the list above is full. The syscall names are
/// those of the finite syscall tables (both ABIs) and the actions three, so in practice every
/// kind fits; past this bound the rest are counted in one catch-all entry.
const MAX_KINDS: usize = 2048;

/// The violations of one execution, deduplicated, with a cursor for the guest's QUERY.
///
/// Bounded whatever the guest does: the first [`MAX_DISTINCT_VIOLATIONS`] distinct calls are
/// kept with their arguments; after that, a call of a (syscall, action) kind already listed is
/// counted in one entry per kind ("... and N more calls with other arguments"), and a kind not
/// seen yet still gets its own entry (up to [`MAX_KINDS`]), so a new kind is never lost.
#[derive(Debug, Default)]
pub struct Violations {
    pub list: Vec<Violation>,
    index: HashMap<(String, String, &'static str), usize>,
    /// (syscall, action) kinds present in `list`.
    kinds: HashSet<(String, &'static str)>,
    /// The entry counting further arguments of a kind, once the list is full.
    folded: HashMap<(String, &'static str), usize>,
    /// The entry counting kinds beyond [`MAX_KINDS`].
    overflow: Option<usize>,
    /// Indices touched since the last QUERY (in order, without repeats).
    since_query: Vec<usize>,
    /// Print a one-line summary of each new violation on stderr, with this prefix.
    echo: Option<String>,
}

/// The arguments text of an entry that counts `n` calls with arguments not listed.
fn folded_args(n: u32) -> String {
    format!(
        "... and {n} more call{} with other arguments (not listed: over {MAX_DISTINCT_VIOLATIONS} distinct violations)",
        if n == 1 { "" } else { "s" }
    )
}

impl Violations {
    /// `echo`: print each new violation's summary line on stderr, after this prefix.
    pub fn new(echo: Option<String>) -> Self {
        Violations {
            echo,
            ..Default::default()
        }
    }

    /// Records `v` (or counts it again), printing a summary line the first time.
    pub fn record(&mut self, v: Violation) {
        let key = (v.syscall.clone(), v.args.clone(), v.action.as_str());
        let kind = (v.syscall.clone(), v.action.as_str());
        let i = if let Some(&i) = self.index.get(&key) {
            self.list[i].count = self.list[i].count.saturating_add(1);
            i
        } else if self.list.len() < MAX_DISTINCT_VIOLATIONS || !self.kinds.contains(&kind) {
            if self.kinds.len() >= MAX_KINDS && !self.kinds.contains(&kind) {
                self.count_overflow(v)
            } else {
                self.push(v, Some(key), kind)
            }
        } else if let Some(&i) = self.folded.get(&kind) {
            let e = &mut self.list[i];
            e.count = e.count.saturating_add(1);
            e.args = folded_args(e.count);
            i
        } else {
            let v = Violation {
                args: folded_args(1),
                ..v
            };
            let i = self.push(v, None, kind.clone());
            self.folded.insert(kind, i);
            i
        };
        if !self.since_query.contains(&i) {
            self.since_query.push(i);
        }
    }

    /// Appends a new entry (printing its summary line) and returns its index.
    fn push(
        &mut self,
        v: Violation,
        key: Option<(String, String, &'static str)>,
        kind: (String, &'static str),
    ) -> usize {
        if let Some(prefix) = &self.echo {
            // "wfjail: session 3: violation: ..." rather than a second "wfjail: ".
            let line = v.summary();
            eprintln!(
                "{prefix}{}",
                if prefix.is_empty() {
                    &line
                } else {
                    line.trim_start_matches("wfjail: ")
                }
            );
        }
        let i = self.list.len();
        if let Some(key) = key {
            self.index.insert(key, i);
        }
        self.kinds.insert(kind);
        self.list.push(v);
        i
    }

    /// Counts `v` in the catch-all entry for kinds beyond [`MAX_KINDS`].
    fn count_overflow(&mut self, v: Violation) -> usize {
        if let Some(i) = self.overflow {
            let e = &mut self.list[i];
            e.count = e.count.saturating_add(1);
            return i;
        }
        let i = self.list.len();
        self.list.push(Violation {
            syscall: "(other)".into(),
            args: format!(
                "calls of more than {MAX_KINDS} kinds; the first of these was {}",
                v.syscall
            ),
            count: 1,
            ..v
        });
        self.overflow = Some(i);
        i
    }

    /// The violations recorded or repeated since the previous call (the answer to QUERY).
    pub fn take_since_query(&mut self) -> Vec<Violation> {
        std::mem::take(&mut self.since_query)
            .into_iter()
            .map(|i| self.list[i].clone())
            .collect()
    }

    /// Whether any call was actually stopped (not merely warned about).
    pub fn any_enforced(&self) -> bool {
        self.list.iter().any(|v| v.action != Action::Warned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::syscalls::Category;

    fn v(syscall: &str, args: String) -> Violation {
        Violation {
            category: Category::Filesystem,
            syscall: syscall.into(),
            args,
            action: Action::Denied,
            rule: "r".into(),
            hint: "h".into(),
            count: 1,
        }
    }

    #[test]
    fn a_new_kind_is_kept_after_the_list_is_full() {
        let mut vs = Violations::new(None);
        for i in 0..1000 {
            vs.record(v("openat", format!("/nope/{i}")));
        }
        vs.record(v("socket", "AF_INET".into()));
        vs.record(v("socket", "AF_INET".into()));
        assert!(vs.list.len() <= MAX_DISTINCT_VIOLATIONS + 2);
        let s = vs.list.iter().find(|e| e.syscall == "socket").unwrap();
        assert_eq!((s.args.as_str(), s.count), ("AF_INET", 2));
        let folded = vs
            .list
            .iter()
            .find(|e| e.args.starts_with("... and"))
            .unwrap();
        assert_eq!(folded.syscall, "openat");
        assert_eq!(folded.count, 1000 - MAX_DISTINCT_VIOLATIONS as u32);
        // Every call is accounted for.
        let total: u32 = vs.list.iter().map(|e| e.count).sum();
        assert_eq!(total, 1002);
    }

    #[test]
    fn kinds_are_bounded_too() {
        let mut vs = Violations::new(None);
        for i in 0..(MAX_DISTINCT_VIOLATIONS + MAX_KINDS + 10) {
            vs.record(v(&format!("sys{i}"), String::new()));
        }
        assert!(vs.list.len() <= MAX_KINDS + 1);
        assert_eq!(vs.list.last().unwrap().syscall, "(other)");
    }
}
