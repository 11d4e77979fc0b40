//! SplitMix64: a tiny seeded generator shared by the tests and the benchmark, so every run
//! with the same seed draws the same workload without a dependency.
#![allow(dead_code)]

/// The generator's state.
pub struct Rng(pub u64);

impl Rng {
    /// An independent stream for `(seed, a, b)`.
    pub fn stream(seed: u64, a: u64, b: u64) -> Rng {
        let mut r = Rng(seed ^ a.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ b.wrapping_mul(0xC2B2_AE3D_27D4_EB4F));
        r.next();
        r
    }

    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0; the modulo bias is irrelevant here).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }

    /// A random 32-byte fingerprint.
    pub fn fingerprint(&mut self) -> [u8; 32] {
        let mut f = [0u8; 32];
        f.copy_from_slice(&self.bytes(32));
        f
    }
}
