//! `limits.output`: one count of what a guest sent — its stdout and stderr, every frame
//! (empty ones included, `protocol::guest::output_charge`) and what echoing its LOG records
//! adds — against one bound. `wfjail run` and a `serve` session each keep one; what they do
//! beyond the bound (drop the rest and kill, fail the session) is theirs.

/// The output a guest sent so far, against `limits.output`.
#[derive(Debug, Clone, Copy)]
pub struct OutputMeter {
    limit: u64,
    used: u64,
}

impl OutputMeter {
    pub fn new(limit: u64) -> Self {
        OutputMeter { limit, used: 0 }
    }

    /// The bound, in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// How many more bytes fit in the bound.
    pub fn room(&self) -> usize {
        self.limit.saturating_sub(self.used) as usize
    }

    /// Charges `n` bytes; returns whether the total is now beyond the bound.
    pub fn charge(&mut self, n: u64) -> bool {
        self.used = self.used.saturating_add(n);
        self.over()
    }

    /// Whether the total is beyond the bound.
    pub fn over(&self) -> bool {
        self.used > self.limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_up_to_the_limit_fits_and_one_byte_more_is_over() {
        let mut m = OutputMeter::new(10);
        assert_eq!(m.room(), 10);
        assert!(!m.charge(4));
        assert!(!m.charge(6), "exactly the limit fits");
        assert_eq!(m.room(), 0);
        assert!(m.charge(1) && m.over());
        assert!(m.charge(0), "stays over");
        assert!(m.charge(u64::MAX), "saturates, does not wrap");
        assert_eq!(m.room(), 0);
    }
}
