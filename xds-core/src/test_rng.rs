//! A deterministic xorshift for the property tests: reproducible sequences without a
//! dependency, one seed per case.

/// Xorshift64; the seed must not be zero.
pub struct Rng(pub u64);

impl Rng {
    #[allow(clippy::should_implement_trait)] // an endless generator, not an iterator
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}
