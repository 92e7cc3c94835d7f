//! Refuses to build wfjail for Linux (musl, the pinned target, or gnu) without `crt-static`.
//!
//! wfjail links the C library statically (`.cargo/config.toml`): no dynamic loader in any
//! `wfjail run` (docs/architecture.md, "Reproducible builds"). But a `RUSTFLAGS` variable
//! replaces the config's `rustflags` instead of adding to them, so `RUSTFLAGS=-g cargo build`
//! would quietly make a dynamically linked binary for gnu (musl is static unless told otherwise,
//! as `-C target-feature=-crt-static` does). Build scripts see the target's features in
//! `CARGO_CFG_TARGET_FEATURE`; without `crt-static` there, the build stops and says why.
//! Fuzz builds (`--cfg fuzzing`, scripts/fuzz and cargo-fuzz) are exempt: they link the
//! library into libFuzzer binaries, never make the `wfjail` binary, and need no static libc.

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let linux = var("CARGO_CFG_TARGET_OS") == "linux"
        && matches!(var("CARGO_CFG_TARGET_ENV").as_str(), "gnu" | "musl");
    let fuzzing = std::env::var_os("CARGO_CFG_FUZZING").is_some();
    let crt_static = var("CARGO_CFG_TARGET_FEATURE")
        .split(',')
        .any(|f| f == "crt-static");
    if linux && !fuzzing && !crt_static {
        println!(
            "cargo::error=wfjail must be linked statically, but this build lacks the crt-static \
             target feature: RUSTFLAGS replaces the rustflags of .cargo/config.toml. Add \
             `-C target-feature=+crt-static` to RUSTFLAGS (e.g. RUSTFLAGS=\"$RUSTFLAGS -C \
             target-feature=+crt-static\"), or unset RUSTFLAGS."
        );
    }
}
