//! Policy parsing from a string (`policy::from_source`: the parser, `extends` of built-ins,
//! the merge and validation of `policy::load`, with no file I/O).
//!
//! Checked: no panic on any text; a policy that loads can be shown (`policy show`) and
//! answers which layers it requires.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wfjail::policy::{self, Layer};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match policy::from_source("fuzz.toml", text) {
        Ok(p) => {
            assert!(!p.to_toml().is_empty());
            let _ = p.requires(Layer::Seccomp);
            let _ = p.requires(Layer::Landlock);
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});
