//! The determinism answers: what a supervised call returns instead of the host's value under
//! `[time] clock = "virtual"` and `[random] getrandom = "seeded"` (workflow time, the virtual
//! monotonic clock, seeded entropy, file times, the vDSO patch), and what any notification
//! is answered with (`answer.rs`). They sit below the handler (`notify/`), which uses them.

pub mod answer;
pub mod entropy;
pub mod filetimes;
pub mod monotonic;
pub mod vdso;
/// The workflow time is a leaf of its own (`src/workflow_time.rs`), so that the report can
/// show one without importing the answers.
pub use crate::workflow_time;
