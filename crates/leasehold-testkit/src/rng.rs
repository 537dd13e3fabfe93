//! A small seeded generator for randomized tests and the simulation: every
//! run is a function of its seed, and a failing run names it.

/// xorshift64* — fast, seedable, and plenty for choosing faults.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded from `LEASEHOLD_SEED`, or from the clock; prints
    /// the seed and how to rerun with it.
    pub fn from_env() -> (u64, Self) {
        let seed = std::env::var("LEASEHOLD_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| crate::monotonic_ns().unsigned_abs());
        println!("seed = {seed} (rerun with LEASEHOLD_SEED={seed})");
        (seed, Rng::new(seed))
    }

    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        // Spread nearby seeds apart (splitmix64 step), never zero.
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Rng((z ^ (z >> 31)) | 1)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// Uniform in `[lo, hi)` milliseconds.
    pub fn millis(&mut self, lo: u64, hi: u64) -> std::time::Duration {
        std::time::Duration::from_millis(lo + self.below(hi.saturating_sub(lo).max(1)))
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    /// Uniform in `[lo, hi)`.
    pub fn float(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64)
    }
}
