//! `wfjail run --check-determinism N`: the same execution N times, each run but the first
//! under one perturbation of what a deterministic program must not depend on, and which
//! results differ.
//!
//! Perturbations, taken in turn: Python's hash seed (`PYTHONHASHSEED`), the address-space
//! layout (randomised even where the policy pins it), and, where the policy makes them the
//! caller's, the randomness seed (`getrandom = "seeded"`) and the workflow time
//! (`clock = "virtual"`). A result that changes under the hash seed or the layout is
//! nondeterminism that replay would hit (set iteration order, `id()`-keyed ordering); one that
//! changes under the seed or the time depends on randomness or the clock, which wfjail makes
//! repeat only as long as the seed and the time are the replay's too (they are, under
//! `JailedWorkflowRunner`). Each run is a full `run::run`; no run sees another's state.

use serde::Serialize;

use crate::policy::rules;
use crate::policy::{Policy, Toggle};
use crate::report::{Report, Status};
use crate::run::{RunOptions, run};

/// One perturbation of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Perturbation {
    /// The run as given.
    None,
    HashSeed {
        value: u32,
    },
    AddressLayout,
    Seed {
        value: u64,
    },
    Clock {
        offset_s: i64,
    },
}

impl Perturbation {
    pub fn describe(&self) -> String {
        match self {
            Perturbation::None => "as given".into(),
            Perturbation::HashSeed { value } => format!("PYTHONHASHSEED={value}"),
            Perturbation::AddressLayout => "address layout randomised".into(),
            Perturbation::Seed { value } => format!("--seed {value}"),
            Perturbation::Clock { offset_s } => format!("workflow time {offset_s:+} s"),
        }
    }
}

/// The perturbations of `runs` runs under `policy` (the first is none).
pub fn plan(policy: &Policy, runs: usize, opts: &RunOptions) -> Vec<Perturbation> {
    let mut kinds: Vec<fn(usize, &RunOptions) -> Perturbation> = vec![
        |i, _| Perturbation::HashSeed {
            value: 1000 + i as u32,
        },
        |_, _| Perturbation::AddressLayout,
    ];
    if rules::getrandom::answered(policy) {
        kinds.push(|i, o| Perturbation::Seed {
            value: o.seed.unwrap_or(0).wrapping_add(1 + i as u64),
        });
    }
    if rules::clock::answered(policy) {
        kinds.push(|i, _| Perturbation::Clock {
            offset_s: 3600 * (1 + i as i64),
        });
    }
    (0..runs)
        .map(|i| {
            if i == 0 {
                Perturbation::None
            } else {
                kinds[(i - 1) % kinds.len()](i, opts)
            }
        })
        .collect()
}

/// One run of the check.
#[derive(Debug, Serialize)]
pub struct CheckRun {
    pub perturbation: Perturbation,
    pub status: Status,
    /// The result (framed: RESULT's payload; raw: the guest's stdout) equals the first run's.
    pub same_result: bool,
    pub result_bytes: usize,
    /// The first line of the result that differs from the first run's, when it differs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_difference: Option<String>,
    /// This run's report.
    pub report: Report,
}

/// What `--check-determinism` found.
#[derive(Debug, Serialize)]
pub struct CheckReport {
    /// Every run ended `ok` and gave the first run's result.
    pub deterministic: bool,
    /// What changed a result, by perturbation (empty when nothing did).
    pub differs_under: Vec<String>,
    pub runs: Vec<CheckRun>,
}

/// The exit status when the results differ (every run ended `ok`).
pub const EXIT_NONDETERMINISTIC: i32 = 7;

impl CheckReport {
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// 0 when deterministic; the first failing run's exit status when a run did not end `ok`;
    /// [`EXIT_NONDETERMINISTIC`] when the results differ.
    pub fn exit_status(&self) -> i32 {
        if let Some(r) = self.runs.iter().find(|r| r.status != Status::Ok) {
            return r.report.exit_status;
        }
        if self.deterministic {
            0
        } else {
            EXIT_NONDETERMINISTIC
        }
    }
}

/// Runs the check: `runs` executions of `opts` under `policy`. `opts.input` must be a file
/// (each run reads it again).
pub fn check(policy: &Policy, opts: &RunOptions, runs: usize) -> CheckReport {
    let mut opts = opts.clone();
    opts.echo = false;
    if rules::clock::answered(policy) && opts.clock.is_none() {
        // Every run reads the same workflow time unless that is the perturbation.
        opts.clock = Some(crate::workflow_time::host_now());
    }
    let mut out: Vec<CheckRun> = Vec::new();
    let mut first: Option<Vec<u8>> = None;
    for p in plan(policy, runs, &opts) {
        let mut pol = policy.clone();
        let mut o = opts.clone();
        match &p {
            Perturbation::None => {}
            Perturbation::HashSeed { value } => {
                pol.env
                    .set
                    .insert("PYTHONHASHSEED".into(), value.to_string());
            }
            Perturbation::AddressLayout => pol.process.address_randomization = Toggle::Allow,
            Perturbation::Seed { value } => o.seed = Some(*value),
            Perturbation::Clock { offset_s } => {
                o.clock = o
                    .clock
                    .map(|c| c.saturating_add(offset_s.saturating_mul(1_000_000_000)));
            }
        }
        let mut result = Vec::new();
        let report = run(&pol, &o, &mut result);
        let base = first.get_or_insert_with(|| result.clone());
        let same = *base == result;
        out.push(CheckRun {
            first_difference: (!same).then(|| first_difference(base, &result)),
            perturbation: p,
            status: report.status,
            same_result: same,
            result_bytes: result.len(),
            report,
        });
    }
    let differs_under: Vec<String> = out
        .iter()
        .filter(|r| !r.same_result)
        .map(|r| r.perturbation.describe())
        .collect();
    CheckReport {
        deterministic: differs_under.is_empty() && out.iter().all(|r| r.status == Status::Ok),
        differs_under,
        runs: out,
    }
}

/// The first line of `b` that differs from `a`'s (shown escaped, at most 200 characters).
fn first_difference(a: &[u8], b: &[u8]) -> String {
    let (la, lb): (Vec<&[u8]>, Vec<&[u8]>) = (
        a.split(|&c| c == b'\n').collect(),
        b.split(|&c| c == b'\n').collect(),
    );
    let n = la.len().max(lb.len());
    for i in 0..n {
        let (x, y) = (la.get(i), lb.get(i));
        if x != y {
            let shown = |l: Option<&&[u8]>| {
                l.map_or("(none)".to_string(), |l| {
                    String::from_utf8_lossy(l).chars().take(200).collect()
                })
            };
            return format!("line {}: {:?} became {:?}", i + 1, shown(x), shown(y));
        }
    }
    "the same lines, other bytes".into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perturbations_cycle_through_what_the_policy_leaves_to_the_caller() {
        let strict = crate::policy::load("strict").unwrap();
        let kinds: Vec<String> = plan(&strict, 4, &RunOptions::default())
            .iter()
            .map(Perturbation::describe)
            .collect();
        assert_eq!(
            kinds,
            [
                "as given",
                "PYTHONHASHSEED=1001",
                "address layout randomised",
                "PYTHONHASHSEED=1003"
            ]
        );
        let temporal = crate::policy::load("temporal-python").unwrap();
        let kinds: Vec<String> = plan(&temporal, 5, &RunOptions::default())
            .iter()
            .map(Perturbation::describe)
            .collect();
        assert_eq!(kinds[3], "--seed 4");
        assert_eq!(kinds[4], "workflow time +18000 s");
    }

    #[test]
    fn the_first_difference_is_shown_by_line() {
        assert_eq!(
            first_difference(b"a\nb\nc", b"a\nx\nc"),
            "line 2: \"b\" became \"x\""
        );
        assert_eq!(
            first_difference(b"a", b"a\nb"),
            "line 2: \"(none)\" became \"b\""
        );
    }
}
