//! Wire formats. [`frame`] is the length-prefixed framing shared by the guest protocol
//! ([`guest`], docs/protocol.md) and the worker wire of `wfjail serve`.

pub mod frame;
pub mod guest;
pub mod worker;

pub use frame::{Decoder, FrameError, Kind, MAX_FRAME, encode};
