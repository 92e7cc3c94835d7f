//! The frame decoder (`wfjail::protocol::Decoder`) on any wire, fed in pieces.
//!
//! Input: byte 0 picks the wire (guest kinds, worker kinds, every kind) and the cap (small, so
//! the oversized path is reachable), byte 1 the chunk size; the rest is the stream.
//! Checked: no panic; feeding in pieces gives the same frames and the same error as feeding at
//! once; every frame re-encodes to exactly the bytes it came from; no payload exceeds the cap;
//! the decoder never holds more than a header, a capped payload and the last piece.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wfjail::protocol::frame::{Decoder, FrameError, encode_raw};
use wfjail::protocol::worker;

fn decoder(wire: u8, cap: usize) -> Decoder {
    match wire % 3 {
        0 => Decoder::new(cap),
        1 => worker::decoder(cap),
        _ => Decoder::for_kinds(cap, |_| true),
    }
}

type Frames = Vec<(u8, Vec<u8>)>;

/// Frames and the first error, feeding `stream` `chunk` bytes at a time, then end-of-file.
fn decode(wire: u8, cap: usize, stream: &[u8], chunk: usize) -> (Frames, Option<FrameError>) {
    let mut d = decoder(wire, cap);
    let mut frames = Vec::new();
    for piece in stream.chunks(chunk) {
        d.feed(piece);
        loop {
            match d.next_raw() {
                Ok(Some(f)) => {
                    assert!(f.1.len() <= cap, "payload over the cap");
                    frames.push(f);
                }
                Ok(None) => break,
                Err(e) => {
                    // Sticky: asking again gives the same error.
                    assert_eq!(d.next_raw().unwrap_err(), e);
                    return (frames, Some(e));
                }
            }
        }
        // The documented bound: one frame header, `cap` payload bytes, the last piece.
        assert!(
            d.buffered() <= 5 + cap + piece.len(),
            "holds {} bytes with a {cap}-byte cap",
            d.buffered()
        );
    }
    match d.finish() {
        Ok(()) => (frames, None),
        Err(e) => (frames, Some(e)),
    }
}

fuzz_target!(|data: &[u8]| {
    let [sel, chunk, stream @ ..] = data else {
        return;
    };
    let wire = sel & 3;
    let cap = (sel >> 2) as usize * 4;
    let chunk = (*chunk as usize).max(1);
    let (whole, whole_err) = decode(wire, cap, stream, stream.len().max(1));
    let (pieces, pieces_err) = decode(wire, cap, stream, chunk);
    assert_eq!(whole, pieces, "frames depend on how the stream was cut");
    // A truncation is reported with what was buffered at the end, which does not depend on
    // the cut; the other errors are the same error.
    assert_eq!(
        whole_err, pieces_err,
        "errors depend on how the stream was cut"
    );
    let encoded: Vec<u8> = whole.iter().flat_map(|(k, p)| encode_raw(*k, p)).collect();
    assert_eq!(
        &stream[..encoded.len()],
        &encoded[..],
        "frames re-encode to their bytes"
    );
    if whole_err.is_none() {
        assert_eq!(encoded.len(), stream.len(), "a clean stream is all frames");
    }
});
