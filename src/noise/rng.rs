//! The only source of randomness for noise: a ChaCha20 CSPRNG seeded by the operating system.

use crate::error::{DpError, Result};
use rand::{RngCore, SeedableRng, TryRngCore};
use rand_chacha::ChaCha20Rng;

/// The noise generator: ChaCha20 (a cryptographically secure PRNG) keyed with 256 bits from the operating
/// system's randomness source ([`NoiseRng::from_os`]).
///
/// A reproducible generator exists for statistical tests only ([`NoiseRng::insecure_seeded_for_tests`]); no
/// configuration key and no SQL statement can select it.
pub struct NoiseRng {
    inner: ChaCha20Rng,
    bits: u64,
    nbits: u32,
}

impl NoiseRng {
    /// Seeds a ChaCha20 generator with 32 bytes from the operating system. Fails (and nothing is released) if the
    /// OS cannot provide randomness.
    pub fn from_os() -> Result<Self> {
        let mut seed = [0u8; 32];
        rand::rngs::OsRng.try_fill_bytes(&mut seed).map_err(|e| DpError::Randomness(e.to_string()))?;
        Ok(Self::with(ChaCha20Rng::from_seed(seed)))
    }

    /// **Insecure, for tests only**: a generator fully determined by `seed`, so statistical tests are
    /// reproducible. Releases made with it are not private (anyone who knows the seed can subtract the noise).
    /// It is reachable only from Rust code; configuration and SQL cannot select it.
    pub fn insecure_seeded_for_tests(seed: u64) -> Self {
        Self::with(ChaCha20Rng::seed_from_u64(seed))
    }

    fn with(inner: ChaCha20Rng) -> Self {
        NoiseRng { inner, bits: 0, nbits: 0 }
    }

    /// 64 uniform bits.
    pub fn next_u64(&mut self) -> u64 {
        self.inner.next_u64()
    }

    /// One fair bit (bits are drawn 64 at a time).
    pub fn fair_bit(&mut self) -> bool {
        self.take_bits(1) == 1
    }

    /// `k ≤ 32` uniform bits from the bit buffer (refilled 64 bits at a time; leftover bits are discarded, which
    /// keeps every returned bit uniform and independent).
    fn take_bits(&mut self, k: u32) -> u64 {
        if self.nbits < k {
            self.bits = self.inner.next_u64();
            self.nbits = 64;
        }
        let v = self.bits & ((1u64 << k) - 1);
        self.bits >>= k;
        self.nbits -= k;
        v
    }

    /// Exactly uniform on `[0, n)`, `n ≥ 1` (`n = 0` is treated as 1 and returns 0). No modulo bias: Lemire's
    /// multiply-and-reject for `n < 2^64`, masked rejection above.
    pub fn uniform_below(&mut self, n: u128) -> u128 {
        if n <= 1 {
            return 0;
        }
        // Small powers of two (the common case inside the Bernoulli trials): exactly k bits, no rejection.
        if n.is_power_of_two() && n <= 1 << 32 {
            return self.take_bits(n.trailing_zeros()) as u128;
        }
        if let Ok(n64) = u64::try_from(n) {
            return self.below_u64(n64) as u128;
        }
        let bits = 128 - (n - 1).leading_zeros();
        let mask = if bits == 128 { u128::MAX } else { (1u128 << bits) - 1 };
        loop {
            let x = (((self.inner.next_u64() as u128) << 64) | self.inner.next_u64() as u128) & mask;
            if x < n {
                return x;
            }
        }
    }

    fn below_u64(&mut self, n: u64) -> u64 {
        // Lemire 2019: the high word of x·n is uniform once the low word is outside the biased zone.
        let mut m = (self.inner.next_u64() as u128) * (n as u128);
        if (m as u64) < n {
            let threshold = n.wrapping_neg() % n;
            while (m as u64) < threshold {
                m = (self.inner.next_u64() as u128) * (n as u128);
            }
        }
        (m >> 64) as u64
    }

    /// Uniform big integer on `[0, n)`, `n ≥ 1` (masked rejection on random bytes).
    pub fn uniform_below_big(&mut self, n: &num_bigint::BigUint) -> num_bigint::BigUint {
        use num_bigint::BigUint;
        if n <= &BigUint::from(1u8) {
            return BigUint::ZERO;
        }
        let bits = (n - 1u8).bits();
        let bytes = bits.div_ceil(8) as usize;
        let excess = bytes as u64 * 8 - bits;
        let mut buf = vec![0u8; bytes];
        loop {
            self.inner.fill_bytes(&mut buf);
            buf[0] &= 0xffu8 >> excess;
            let x = BigUint::from_bytes_be(&buf);
            if &x < n {
                return x;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_below_is_in_range_and_roughly_uniform() {
        let mut r = NoiseRng::insecure_seeded_for_tests(1);
        for n in [1u128, 2, 3, 7, 1000, u64::MAX as u128 + 5, u128::MAX] {
            for _ in 0..200 {
                assert!(r.uniform_below(n) < n.max(1));
            }
        }
        // Chi-square on n = 6 over 60 000 draws; critical value at p = 1e-7 for 5 dof is 40.0.
        let mut counts = [0f64; 6];
        for _ in 0..60_000 {
            counts[r.uniform_below(6) as usize] += 1.0;
        }
        let chi: f64 = counts.iter().map(|c| (c - 10_000.0).powi(2) / 10_000.0).sum();
        assert!(chi < 40.0, "chi-square {chi}");
        // The bit-buffer path for powers of two: n = 8, 7 dof, critical value at p = 1e-7 is 44.1.
        let mut counts = [0f64; 8];
        for _ in 0..80_000 {
            counts[r.uniform_below(8) as usize] += 1.0;
        }
        let chi: f64 = counts.iter().map(|c| (c - 10_000.0).powi(2) / 10_000.0).sum();
        assert!(chi < 44.1, "chi-square {chi}");
    }

    #[test]
    fn big_uniform_in_range() {
        let mut r = NoiseRng::insecure_seeded_for_tests(2);
        let n = num_bigint::BigUint::from(u128::MAX) * 3u8 + 1u8;
        for _ in 0..100 {
            assert!(r.uniform_below_big(&n) < n);
        }
        let small = num_bigint::BigUint::from(5u8);
        let mut seen = [false; 5];
        for _ in 0..200 {
            let x: u32 = r.uniform_below_big(&small).try_into().unwrap();
            seen[x as usize] = true;
        }
        assert!(seen.iter().all(|s| *s));
    }

    #[test]
    fn os_seeding_works_and_differs() {
        let mut a = NoiseRng::from_os().unwrap();
        let mut b = NoiseRng::from_os().unwrap();
        assert_ne!((a.next_u64(), a.next_u64()), (b.next_u64(), b.next_u64()));
    }

    #[test]
    fn fair_bits_are_balanced() {
        let mut r = NoiseRng::insecure_seeded_for_tests(3);
        let ones = (0..100_000).filter(|_| r.fair_bit()).count() as f64;
        // 5.4 standard deviations (σ = 158): fails with probability < 1e-7.
        assert!((ones - 50_000.0).abs() < 5.4 * 158.2, "{ones}");
    }
}
