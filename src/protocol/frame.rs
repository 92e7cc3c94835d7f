//! Frames: `length:u32le kind:u8 payload[length-1]`, with a cap on the payload checked before
//! anything is allocated for it. Test vectors: docs/protocol-vectors.json.

/// The default cap on a frame's payload (16 MiB).
pub const MAX_FRAME: usize = 16 << 20;

/// Frame kinds of the guest protocol (docs/protocol.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Hello = 1,
    Request = 2,
    Result = 3,
    Error = 4,
    Log = 5,
    Query = 6,
    Violations = 7,
    /// Guest → supervisor during a call: a question for the worker (opaque bytes).
    Upcall = 8,
    /// Supervisor → guest: the answer to the oldest unanswered UPCALL (status byte, bytes).
    Reply = 9,
}

impl Kind {
    pub fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Hello,
            2 => Kind::Request,
            3 => Kind::Result,
            4 => Kind::Error,
            5 => Kind::Log,
            6 => Kind::Query,
            7 => Kind::Violations,
            8 => Kind::Upcall,
            9 => Kind::Reply,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Hello => "HELLO",
            Kind::Request => "REQUEST",
            Kind::Result => "RESULT",
            Kind::Error => "ERROR",
            Kind::Log => "LOG",
            Kind::Query => "QUERY",
            Kind::Violations => "VIOLATIONS",
            Kind::Upcall => "UPCALL",
            Kind::Reply => "REPLY",
        }
    }
}

/// Why a byte stream is not a valid sequence of frames.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The stream ended inside a frame.
    #[error("truncated frame: the stream ended after {have} of {need} bytes")]
    Truncated { have: usize, need: usize },
    /// A payload longer than the cap was announced.
    #[error("frame of {length} bytes exceeds the {cap}-byte cap")]
    Oversized { length: u64, cap: usize },
    /// A length of 0 (it must count the kind byte).
    #[error("frame with length 0 (the length counts the kind byte)")]
    Empty,
    /// A kind byte outside the protocol.
    #[error("frame of unknown kind {0:#04x}")]
    UnknownKind(u8),
}

impl FrameError {
    /// The short code used by the test vectors.
    pub fn code(&self) -> &'static str {
        match self {
            FrameError::Truncated { .. } => "truncated",
            FrameError::Oversized { .. } => "oversized",
            FrameError::Empty => "empty",
            FrameError::UnknownKind(_) => "unknown-kind",
        }
    }
}

/// Encodes one guest-protocol frame.
pub fn encode(kind: Kind, payload: &[u8]) -> Vec<u8> {
    encode_raw(kind as u8, payload)
}

/// Encodes one frame with any kind byte.
pub fn encode_raw(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + payload.len());
    out.extend_from_slice(&(payload.len() as u32 + 1).to_le_bytes());
    out.push(kind);
    out.extend_from_slice(payload);
    out
}

/// An incremental decoder: feed it bytes as they arrive, take frames out.
///
/// It never holds more than one frame header plus `cap` payload bytes plus what the last
/// `feed` brought, and it checks an announced length against the cap before reserving room.
/// Taking a frame out moves an offset (`pos`); the consumed prefix is dropped once per
/// `feed`, so decoding a stream costs time linear in its length however small its frames.
#[derive(Debug)]
pub struct Decoder {
    cap: usize,
    buf: Vec<u8>,
    /// Where the next frame starts in `buf` (everything before it has been taken).
    pos: usize,
    failed: Option<FrameError>,
    /// Which kind bytes this wire format has.
    known: fn(u8) -> bool,
}

impl Decoder {
    /// A decoder for the guest protocol.
    pub fn new(cap: usize) -> Self {
        Decoder::for_kinds(cap, |k| Kind::from_u8(k).is_some())
    }

    /// A decoder for a wire format whose kinds `known` accepts.
    pub fn for_kinds(cap: usize, known: fn(u8) -> bool) -> Self {
        Decoder {
            cap,
            buf: Vec::new(),
            pos: 0,
            failed: None,
            known,
        }
    }

    /// Like [`Decoder::next_frame`], for the guest protocol's kinds.
    pub fn next_frame(&mut self) -> Result<Option<(Kind, Vec<u8>)>, FrameError> {
        Ok(self
            .next_raw()?
            .and_then(|(k, p)| Kind::from_u8(k).map(|k| (k, p))))
    }

    /// Appends bytes read from the stream.
    pub fn feed(&mut self, data: &[u8]) {
        if self.failed.is_none() {
            if self.pos > 0 {
                // Drop what was taken, once per feed (not once per frame).
                self.buf.drain(..self.pos);
                self.pos = 0;
            }
            self.buf.extend_from_slice(data);
        }
    }

    /// The next complete frame (kind byte, payload), `Ok(None)` if more bytes are needed, or
    /// the error that makes the rest of the stream unreadable (sticky).
    pub fn next_raw(&mut self) -> Result<Option<(u8, Vec<u8>)>, FrameError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let r = self.parse();
        if let Err(e) = &r {
            self.failed = Some(e.clone());
            self.buf = Vec::new();
            self.pos = 0;
        }
        r
    }

    fn parse(&mut self) -> Result<Option<(u8, Vec<u8>)>, FrameError> {
        let rest = &self.buf[self.pos..];
        let Some(header) = rest.get(..4) else {
            return Ok(None);
        };
        let length = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as u64;
        if length == 0 {
            return Err(FrameError::Empty);
        }
        if length - 1 > self.cap as u64 {
            return Err(FrameError::Oversized {
                length: length - 1,
                cap: self.cap,
            });
        }
        let Some(&kind) = rest.get(4) else {
            return Ok(None);
        };
        if !(self.known)(kind) {
            return Err(FrameError::UnknownKind(kind));
        }
        let total = 4 + length as usize;
        if rest.len() < total {
            // Reserve at most what this (capped) frame still needs.
            let need = total - rest.len();
            self.buf.reserve(need);
            return Ok(None);
        }
        let payload = rest[5..total].to_vec();
        self.pos += total;
        Ok(Some((kind, payload)))
    }

    /// Call at end-of-file: an error if the stream stopped inside a frame.
    pub fn finish(&mut self) -> Result<(), FrameError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let rest = &self.buf[self.pos..];
        if rest.is_empty() {
            return Ok(());
        }
        let need = match rest.get(..4) {
            Some(h) => 4 + u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize,
            None => 4,
        };
        let e = FrameError::Truncated {
            have: rest.len(),
            need,
        };
        self.failed = Some(e.clone());
        Err(e)
    }

    /// Bytes held (for tests of the allocation bound).
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.pos
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_in_pieces() {
        let mut stream = encode(Kind::Hello, b"wfjail\x01\x00");
        stream.extend(encode(Kind::Result, b"payload"));
        let mut d = Decoder::new(MAX_FRAME);
        let mut frames = Vec::new();
        for b in &stream {
            d.feed(std::slice::from_ref(b));
            while let Some(f) = d.next_frame().unwrap() {
                frames.push(f);
            }
        }
        d.finish().unwrap();
        assert_eq!(
            frames,
            vec![
                (Kind::Hello, b"wfjail\x01\x00".to_vec()),
                (Kind::Result, b"payload".to_vec())
            ]
        );
    }

    #[test]
    fn many_small_frames_in_one_feed_then_a_split_one() {
        let mut stream: Vec<u8> = (0..10_000)
            .flat_map(|_| encode(Kind::Log, b"\x14"))
            .collect();
        let tail = encode(Kind::Result, b"done");
        stream.extend_from_slice(&tail[..3]);
        let mut d = Decoder::new(MAX_FRAME);
        d.feed(&stream);
        let mut n = 0;
        while let Some((k, p)) = d.next_frame().unwrap() {
            assert_eq!((k, p.as_slice()), (Kind::Log, &b"\x14"[..]));
            n += 1;
        }
        assert_eq!((n, d.buffered()), (10_000, 3));
        d.feed(&tail[3..]);
        assert_eq!(
            d.next_frame().unwrap(),
            Some((Kind::Result, b"done".to_vec()))
        );
        assert_eq!(d.buffered(), 0);
        d.finish().unwrap();
    }

    #[test]
    fn oversized_is_rejected_before_allocating() {
        let mut d = Decoder::new(10);
        d.feed(&[0xff, 0xff, 0xff, 0xff]);
        assert_eq!(d.next_frame().unwrap_err().code(), "oversized");
        assert_eq!(d.buffered(), 0);
    }
}
