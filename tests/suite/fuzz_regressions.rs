//! What the fuzz targets (fuzz/) found, one test per finding, with the input kept in
//! fuzz/regressions/TARGET/ (scripts/fuzz replays those too).

use wfjail::policy::{self, Dur};

/// fuzz/regressions/worker_wire/dur-sub-millisecond (found by `worker_wire` in 10 s) and
/// fuzz/regressions/policy_text/timeout-sub-millisecond: `Dur::parse` accepts a duration under
/// 1 ms although its own message says 1 ms is the least, and prints it as `0m`, which it
/// rejects. So a worker may open a session with a 0.5 ms call timeout, and `wfjail policy show`
/// of a policy with `timeout = "0.5ms"` prints a policy that does not load.
#[test]
fn a_duration_under_a_millisecond_is_refused_like_its_message_says() {
    for text in ["0.5ms", ".80ms", "0.0001s"] {
        if let Ok(d) = Dur::parse(text) {
            let shown = d.to_string();
            assert!(
                Dur::parse(&shown).is_ok(),
                "{text:?} is accepted as {:?} but prints as {shown:?}, which is refused",
                d.0
            );
        }
    }
    let input = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fuzz/regressions/policy_text/timeout-sub-millisecond"
    ));
    if let Ok(p) = policy::from_source("regression.toml", input) {
        let shown = p.to_toml();
        if let Err(e) = policy::from_source("shown.toml", &shown) {
            panic!("`policy show` prints a policy that does not load: {e}");
        }
    }
}

/// fuzz/regressions/worker_wire/init-float-roundtrip (found by `worker_wire` in the bounded
/// run of `scripts/test`): an OPEN's `init` with the number `2e-126` came back from
/// serde_json as `2.0000000000000002e-126`, so the session's arguments that wfjail relays to
/// the guest were not the worker's. serde_json's `float_roundtrip` parses numbers exactly.
#[test]
fn an_opens_init_is_relayed_exactly() {
    use wfjail::protocol::worker::OpenRequest;

    let input = include_bytes!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fuzz/regressions/worker_wire/init-float-roundtrip"
    ));
    let req: OpenRequest = serde_json::from_slice(input).unwrap();
    let again: OpenRequest = serde_json::from_str(&serde_json::to_string(&req).unwrap()).unwrap();
    assert_eq!(again, req);
    let v: serde_json::Value = serde_json::from_str(r#"{"init": 2e-126}"#).unwrap();
    assert_eq!(v["init"].to_string(), "2e-126");
}

/// fuzz/regressions/policy_chain/path-named-builtin (found by `policy_chain` in the bounded
/// run of `scripts/test`): a policy extending the relative path `builtin:sub/../c.toml` (a
/// directory whose name starts with `builtin:`) got errors located at
/// `builtin:sub/../c.toml:3:1`, which reads as a built-in policy. Such a path is now shown
/// as `./builtin:...`.
#[test]
fn a_file_path_that_looks_like_a_builtin_is_shown_as_a_path() {
    use wfjail::policy::{InMemory, load_from};

    let mut sources = InMemory::new();
    sources.insert("a.toml", "extends = \"builtin:sub/../c.toml\"\n");
    sources.insert("c.toml", "[limits]\ncpu = 1\nbroken\n");
    let e = load_from("a.toml", &sources).unwrap_err().to_string();
    assert!(e.starts_with("./builtin:sub/../c.toml:3:"), "{e}");
    // The fuzzer's input itself: its errors name a file of the chain.
    let input = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fuzz/regressions/policy_chain/path-named-builtin"
    ))
    .unwrap();
    let mut sources = InMemory::new();
    for (name, text) in ["a.toml", "sub/b.toml", "c.toml"]
        .iter()
        .zip(input.splitn(3, '\0'))
    {
        sources.insert(name, text);
    }
    if let Err(e) = load_from("a.toml", &sources) {
        assert!(!e.to_string().starts_with("builtin:sub"), "{e}");
    }
}

/// fuzz/regressions/zygote_control/settled-as-json-array (found by `zygote_control` in the
/// bounded run of `scripts/test`): the zygote's SETTLED (0x35, issue 29) was missing from the
/// fuzz target's list of the kinds a zygote sends, so an accepted SETTLED failed the target.
/// Its payload as a JSON array (`[1, 3]`, serde's sequence form of the struct) is accepted,
/// and the message parses back to itself from its own packet.
#[test]
fn a_settled_frame_parses_back_from_its_own_packet() {
    use wfjail::serve::control::{SETTLED, parse};

    let input = include_bytes!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fuzz/regressions/zygote_control/settled-as-json-array"
    ));
    let msg = parse(input).unwrap();
    assert_eq!(msg.kind(), SETTLED);
    assert_eq!(parse(&msg.to_packet()).unwrap(), msg);
}
