//! The determinism answers: what a supervised call returns instead of the host's value under
//! `[time] clock = "virtual"` and `[random] getrandom = "seeded"` (workflow time, the virtual
//! monotonic clock, seeded entropy, file times, the vDSO patch, the
//! pinned pid answered in a session's own C library), and what any notification
//! is answered with (`answer.rs`). They sit below the handler (`notify/`), which uses them.
//! Workflow time itself is a leaf (`src/workflow_time.rs`), so that the report can show one.

pub mod answer;
pub mod entropy;
pub mod filetimes;
pub mod guest_pid;
pub mod monotonic;
pub mod vdso;
