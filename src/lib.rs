//! wfjail: OS-enforced determinism protection for workflow code.
//!
//! Every execution runs in a fresh process confined by Landlock, a seccomp allowlist,
//! namespaces, rlimits and dropped capabilities; violations are reported with the syscall,
//! its arguments and a hint. See `docs/architecture.md` for the map of this crate.
//!
//! ```no_run
//! use wfjail::{policy, run::{RunOptions, run}};
//! let policy = policy::load("default").unwrap();
//! let opts = RunOptions::raw(vec!["/bin/true".into()]);
//! let report = run(&policy, &opts, &mut std::io::sink());
//! assert_eq!(report.status, wfjail::report::Status::Ok);
//! ```
#![deny(unsafe_code)]

pub mod answers;
pub mod check;
pub mod cli;
pub mod confine;
pub mod determinism;
pub mod echo;
pub mod guest_memory;
pub mod learn;
pub mod merging;
pub mod notify;
pub mod plan;
pub mod policy;
pub mod process;
pub mod procfs;
pub mod protocol;
pub mod report;
pub mod run;
pub mod serve;
pub mod supervise;
#[allow(unsafe_code)]
pub mod sys;
pub mod timing;
pub mod workflow_time;
