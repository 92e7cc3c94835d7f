//! Transcript tests of the CLI (trycmd): each `tests/cmd/*.trycmd` file is a Markdown page of
//! commands and the output a user sees, run against the built binary. `[..]` stands for a part
//! of a line that varies (durations, paths); `...` for lines that vary.
//!
//! To refresh a transcript after a deliberate change: `TRYCMD=overwrite cargo test --test
//! suite -- cli::transcripts`, then read the diff.

#[test]
fn cli_transcripts() {
    trycmd::TestCases::new()
        .register_bin("wfjail", trycmd::cargo::cargo_bin!("wfjail"))
        .case("tests/cmd/*.trycmd");
}
