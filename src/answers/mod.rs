//! The determinism answers: what a supervised call returns instead of the host's value under
//! `[time] clock = "virtual"` and `[random] getrandom = "seeded"` (workflow time, the virtual
//! monotonic clock, seeded entropy, file times, the vDSO patch).

pub mod entropy;
pub mod filetimes;
pub mod monotonic;
pub mod vdso;
pub mod workflow_time;
