//! Seeded randomness for `[random] getrandom = "seeded"`: the bytes every `getrandom` of an
//! execution receives, drawn in order from one stream keyed by the execution's seed, so that
//! two executions with the same seed making the same calls see the same bytes.
//!
//! The generator is SplitMix64 (Steele, Lea, Flood 2014), chosen because it is short, fixed
//! and easy to reproduce elsewhere, not because it is strong: **these bytes are predictable
//! by anyone who knows the seed and must never reach cryptography** (docs/security.md).
//! The stream is part of the contract: changing it changes what replays see.

/// The most bytes one `getrandom` answer carries; a larger request gets this many (the call
/// may return fewer bytes than asked, and every caller loops).
pub const MAX_ANSWER: usize = 64 * 1024;

/// One execution's stream.
#[derive(Debug, Clone)]
pub struct Entropy {
    state: u64,
    /// Bytes of the last word not handed out yet.
    spare: [u8; 8],
    spare_len: usize,
}

impl Entropy {
    pub fn new(seed: u64) -> Self {
        Entropy {
            state: seed,
            spare: [0; 8],
            spare_len: 0,
        }
    }

    fn next_word(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// The next `len` bytes of the stream (at most [`MAX_ANSWER`]).
    pub fn take(&mut self, len: usize) -> Vec<u8> {
        let len = len.min(MAX_ANSWER);
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            if self.spare_len == 0 {
                self.spare = self.next_word().to_le_bytes();
                self.spare_len = 8;
            }
            let from = 8 - self.spare_len;
            let n = self.spare_len.min(len - out.len());
            out.extend_from_slice(&self.spare[from..from + n]);
            self.spare_len -= n;
        }
        out
    }
}

/// The 16 bytes a guest's auxiliary vector points at (`AT_RANDOM`) under a seeded or denied
/// `getrandom`, keyed by `seed` (0 under deny): a stream of its own, so that the bytes
/// `getrandom` answers are the same as before this was written (`answers/vdso.rs`).
pub fn at_random(seed: u64) -> [u8; 16] {
    // "AT_RANDO" as a key: another seed's stream never starts with these 16 bytes.
    let mut e = Entropy::new(seed ^ 0x4154_5f52_414e_444f);
    e.take(16).try_into().expect("16 bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_is_splitmix64_of_the_seed() {
        // Reference values of SplitMix64 with seed 0 (the first two outputs).
        let mut e = Entropy::new(0);
        assert_eq!(e.take(8), 0xe220_a839_7b1d_cdaf_u64.to_le_bytes());
        assert_eq!(e.take(8), 0x6e78_9e6a_a1b9_65f4_u64.to_le_bytes());
    }

    #[test]
    fn how_the_stream_is_cut_does_not_change_it() {
        let whole = Entropy::new(42).take(100);
        let mut e = Entropy::new(42);
        let mut pieces = Vec::new();
        for n in [1, 7, 8, 3, 16, 65] {
            pieces.extend(e.take(n));
        }
        assert_eq!(pieces, whole);
        assert_ne!(Entropy::new(43).take(100), whole);
    }

    #[test]
    fn at_random_is_its_own_stream_of_the_seed() {
        assert_eq!(at_random(7), at_random(7));
        assert_ne!(at_random(7), at_random(8));
        assert_ne!(at_random(7)[..], Entropy::new(7).take(16)[..]);
    }

    #[test]
    fn an_answer_is_bounded() {
        assert_eq!(Entropy::new(1).take(10 << 20).len(), MAX_ANSWER);
    }
}
