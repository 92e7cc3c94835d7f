//! Policy parsing from a string (`policy::from_source`: the parser, `extends` of built-ins,
//! the merge and validation of `policy::load`, with no file I/O).
//!
//! Checked: no panic on any text; a policy that loads can be shown (`policy show`), what is
//! shown loads again and shows the same (the `policy show` promise: a resolved policy file).
#![no_main]

use libfuzzer_sys::fuzz_target;
use wfjail::policy::{self, Layer};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match policy::from_source("fuzz.toml", text) {
        Ok(p) => {
            let shown = p.to_toml();
            let again = policy::from_source("fuzz.toml", &shown)
                .unwrap_or_else(|e| panic!("`policy show` output does not load: {e}\n{shown}"));
            assert_eq!(again.to_toml(), shown, "shown twice, shown differently");
            let _ = p.requires(Layer::Seccomp);
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});
