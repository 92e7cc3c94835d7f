//! wfjail's integration tests: one test binary (one link step, where each file was a binary
//! of its own), its modules grouped by the component under test rather than by the issue
//! that brought them. Each test drives the real `wfjail` binary (or, for the few that need
//! no process, the library) on this kernel; `common` holds what they share.
//!
//! The grouping, by what a reader changes when a test fails:
//! - `run`: one guest under `wfjail run`, confined (namespaces, Landlock, seccomp) and
//!   supervised (violations, the escape catalogue, a hostile guest, the notification budget).
//! - `fs`: the files a guest was given: ioctls, locks, memory files, writes the supervisor
//!   judges, `limits.disk`.
//! - `faults`: a guest, a worker or wfjail itself ending at every phase, under `run` and
//!   `serve`: nothing survives, nothing leaks, the outcome is reported.
//! - `determinism`: the virtual clock, seeded randomness and the pinned environment.
//! - `serve`: sessions (zygote and exec mode), their limits, hostile sessions and workers.
//! - `learn`: `wfjail learn` against a hostile program.
//! - `policy`: policy files, their errors and the editor schema.
//! - `cli`: what a user sees first (messages, reports, transcripts) and the exit-code contract.
//! - `platform`: the host wfjail runs on: the pinned Landlock ABI, unprivileged users and
//!   container runtimes' seccomp profiles.
//! - `protocol`: the guest protocol's byte vectors and conversations with a real guest.
//! - `fuzz_regressions`: what the fuzz targets found, one test per finding.
//!
//! Filter by module path: `cargo test --test suite -- serve::hostile::` (or a test's name).
//! All tests share one process: a test changes no process-wide state (environment, working
//! directory, signal dispositions, limits), names its scratch files after the process and a
//! shared counter (`common::Scratch`), and finds its processes by a marker of its own.
//! Data files stay beside the suite: `tests/escapes/`, `tests/determinism/`, `tests/cmd/`,
//! `tests/oci/`.

mod common;

mod cli {
    mod contract_doc;
    mod first_hour;
    mod transcripts;
}
mod determinism {
    mod environment;
    mod routes;
    mod seeded;
}
mod faults;
mod fs;
mod fuzz_regressions;
mod layering;
mod learn;
mod platform {
    mod address_layout;
    mod containers;
    mod landlock_abi;
    mod root_id_maps;
}
mod policy {
    mod cli;
    mod schema;
}
mod protocol;
mod run {
    mod escapes;
    mod hostile;
    mod isolation;
    mod notification_budget;
    mod page_merging;
    mod violations;
}
mod serve {
    mod hostile;
    mod hugepages;
    mod lanes;
    mod limits;
    mod merging;
    mod metrics;
    mod pid_in_guest;
    mod preload;
    mod races;
    mod sessions;
    mod unanswered;
    mod zygote_entropy;
}
