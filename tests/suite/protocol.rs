//! The guest protocol: the byte-exact vectors of docs/protocol-vectors.json (the Python tests
//! decode the same file), a fuzz-style run of mutated frames, and end-to-end conversations
//! with a confined guest, including malformed ones.

use crate::common::{PY, wfjail};
use wfjail::protocol::guest::Conversation;
use wfjail::protocol::{Decoder, Kind, encode};

fn vectors() -> serde_json::Value {
    let path = format!("{}/docs/protocol-vectors.json", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// A vector's `frames`: (kind, payload) pairs.
fn expected_frames(vector: &serde_json::Value) -> Vec<(u8, Vec<u8>)> {
    vector["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["kind"].as_u64().unwrap() as u8,
                hex(f["payload_hex"].as_str().unwrap()),
            )
        })
        .collect()
}

/// Decodes `bytes` fed in pieces of `step`: the frames, then the error code or None.
fn decode(bytes: &[u8], cap: usize, step: usize) -> (Vec<(u8, Vec<u8>)>, Option<String>) {
    let mut d = Decoder::new(cap);
    let mut frames = Vec::new();
    for chunk in bytes.chunks(step.max(1)) {
        d.feed(chunk);
        loop {
            match d.next_frame() {
                Ok(Some((k, p))) => frames.push((k as u8, p)),
                Ok(None) => break,
                Err(e) => return (frames, Some(e.code().to_string())),
            }
            assert!(
                d.buffered() <= cap + 5 + step,
                "decoder holds {} bytes",
                d.buffered()
            );
        }
    }
    match d.finish() {
        Ok(()) => (frames, None),
        Err(e) => (frames, Some(e.code().to_string())),
    }
}

#[test]
fn every_vector_decodes_as_specified() {
    let v = vectors();
    let list = v["vectors"].as_array().unwrap();
    assert!(list.len() >= 15);
    for vec in list {
        let name = vec["name"].as_str().unwrap();
        let bytes = hex(vec["hex"].as_str().unwrap());
        let cap = vec["cap"].as_u64().unwrap() as usize;
        let want_frames: Vec<(u8, Vec<u8>)> = expected_frames(vec);
        let want_error = vec["error"].as_str().map(str::to_string);
        for step in [1, 3, bytes.len().max(1)] {
            let (frames, error) = decode(&bytes, cap, step);
            assert_eq!(frames, want_frames, "{name} (step {step})");
            assert_eq!(error, want_error, "{name} (step {step})");
        }
        if want_error.is_none() {
            let again: Vec<u8> = want_frames
                .iter()
                .flat_map(|(k, p)| encode(Kind::from_u8(*k).unwrap(), p))
                .collect();
            assert_eq!(again, bytes, "{name} re-encodes byte for byte");
        }
    }
}

#[test]
fn every_worker_vector_decodes_as_specified() {
    let v = vectors();
    let list = v["worker_vectors"].as_array().unwrap();
    assert!(list.len() >= 10);
    for vec in list {
        let name = vec["name"].as_str().unwrap();
        let bytes = hex(vec["hex"].as_str().unwrap());
        let mut d = wfjail::protocol::worker::decoder(vec["cap"].as_u64().unwrap() as usize);
        d.feed(&bytes);
        let mut frames = Vec::new();
        let error = loop {
            match d.next_raw() {
                Ok(Some(f)) => frames.push(f),
                Ok(None) => break d.finish().err().map(|e| e.code().to_string()),
                Err(e) => break Some(e.code().to_string()),
            }
        };
        let want: Vec<(u8, Vec<u8>)> = expected_frames(vec);
        assert_eq!(frames, want, "{name}");
        assert_eq!(error, vec["error"].as_str().map(str::to_string), "{name}");
        for (k, p) in &frames {
            if *k == wfjail::protocol::worker::OPEN {
                let o: wfjail::protocol::worker::OpenRequest = serde_json::from_slice(p).unwrap();
                assert!(o.handler.is_some() || o.argv.is_some(), "{name}");
            }
        }
    }
}

/// A small deterministic generator (xorshift), so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

#[test]
fn fuzz_ten_thousand_mutated_frames() {
    let v = vectors();
    let seeds: Vec<Vec<u8>> = v["vectors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| hex(x["hex"].as_str().unwrap()))
        .collect();
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut codes = std::collections::BTreeSet::new();
    for i in 0..12_000 {
        let mut bytes = seeds[rng.below(seeds.len())].clone();
        match i % 6 {
            0 => {
                // bit flips
                for _ in 0..=rng.below(4) {
                    if !bytes.is_empty() {
                        let at = rng.below(bytes.len());
                        bytes[at] ^= 1 << rng.below(8);
                    }
                }
            }
            1 => bytes.truncate(rng.below(bytes.len() + 1)),
            2 => {
                // a random length field
                if bytes.len() >= 4 {
                    let l = (rng.next() as u32).to_le_bytes();
                    bytes[..4].copy_from_slice(&l);
                }
            }
            3 => bytes = (0..rng.below(64)).map(|_| rng.next() as u8).collect(),
            4 => {
                // splice two vectors, with garbage in between
                bytes.extend((0..rng.below(8)).map(|_| rng.next() as u8));
                bytes.extend(seeds[rng.below(seeds.len())].iter());
            }
            _ => {
                // a kind byte from anywhere
                if bytes.len() > 4 {
                    bytes[4] = rng.next() as u8;
                }
            }
        }
        let cap = [16, 1024, 16 << 20][rng.below(3)];
        let step = 1 + rng.below(17);
        let (_, error) = decode(&bytes, cap, step);
        if let Some(e) = error {
            codes.insert(e);
        }
        // The supervisor's conversation on the same bytes: an error or events, never a panic.
        let _ = Conversation::new(cap).feed(&bytes);
    }
    for code in ["truncated", "oversized", "empty", "unknown-kind"] {
        assert!(
            codes.contains(code),
            "the fuzzer never reached {code}: {codes:?}"
        );
    }
}

// ---- end to end ------------------------------------------------------------------------------

fn examples() -> String {
    format!("{}/examples", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn bundled_example_guest_returns_its_result() {
    let input = format!("{}/request.json", examples());
    let script = format!("{}/workflow_guest.py", examples());
    let o = wfjail(&[
        "run",
        "-p",
        "temporal-python",
        "--ro",
        env!("CARGO_MANIFEST_DIR"),
        "--input",
        &input,
        "--",
        PY,
        &script,
    ]);
    o.check(o.code == 0 && o.status() == "ok", "example guest ok");
    let result: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    o.check(
        result["total"] == "20.03",
        "the result payload is wfjail's stdout",
    );
    o.check(
        o.stderr.contains("[guest] log (info)"),
        "LOG frames are shown",
    );
}

/// Runs a Python guest that writes raw bytes to fd 4 (after reading what fd 3 offers).
fn rogue(code: &str) -> crate::common::Outcome {
    let program = format!("import os, struct, sys\n{code}\n");
    wfjail(&["run", "--timeout", "10s", "--", PY, "-c", &program])
}

#[test]
fn malformed_frames_end_the_execution_as_guest_error() {
    let hello = "struct.pack('<I', 9) + b'\\x01wfjail\\x01\\x00'";
    let cases = [
        ("os.write(4, struct.pack('<I', 0))".to_string(), "length 0"),
        (
            format!("os.write(4, {hello} + struct.pack('<I', 0x7fffffff) + b'\\x03')"),
            "exceeds",
        ),
        (
            format!("os.write(4, {hello} + struct.pack('<I', 5) + b'\\x03ab')"),
            "truncated",
        ),
        (
            format!("os.write(4, {hello} + struct.pack('<I', 1) + b'\\x0a')"),
            "unknown kind",
        ),
        (
            "os.write(4, struct.pack('<I', 1) + b'\\x03')".to_string(),
            "first frame must be HELLO",
        ),
        (
            format!("os.write(4, {hello} + struct.pack('<I', 1) + b'\\x02')"),
            "only the supervisor",
        ),
        (
            format!(
                "os.write(4, {hello} + struct.pack('<I', 1) + b'\\x03' + struct.pack('<I', 1) + b'\\x03')"
            ),
            "after its answer",
        ),
        (
            format!("os.write(4, {hello} + struct.pack('<I', 3) + b'\\x04{{}}')"),
            "JSON object",
        ),
        (format!("os.write(4, {hello})"), "without a RESULT"),
    ];
    for (code, want) in cases {
        let o = rogue(&code);
        o.check(
            o.status() == "guest_error" && o.code == 1,
            &format!("{want}: guest_error, exit 1"),
        );
        o.check(
            o.report["error"].as_str().unwrap_or("").contains(want),
            &format!("error mentions {want:?}"),
        );
    }
}

#[test]
fn a_plain_program_in_framed_mode_is_told_about_raw() {
    let o = wfjail(&["run", "--", "/bin/true"]);
    o.check(
        o.code == 1 && o.status() == "guest_error",
        "no result: guest_error",
    );
    o.check(
        o.report["error"].as_str().unwrap().contains("--raw"),
        "suggests --raw",
    );
}

#[test]
fn supervisor_survives_a_flood() {
    // A guest that writes far more than the cap in one frame header claim, then garbage.
    let o = rogue(
        "os.write(4, struct.pack('<I', 9) + b'\\x01wfjail\\x01\\x00')\nwhile True:\n    os.write(4, b'\\xff' * 65536)",
    );
    o.check(
        o.status() == "guest_error" && o.report["error"].as_str().unwrap().contains("exceeds"),
        "oversized",
    );
}
