//! The only source of randomness for noise: a ChaCha20 CSPRNG keyed by the operating system.
//!
//! Everything the samplers need is built here from uniform bits: single fair bits (buffered 64 at a time) and
//! exactly uniform integers below a bound (rejection sampling, no modulo bias). No floating-point number is ever
//! produced.

use crate::error::{DpError, Result};
use rand::{CryptoRng, RngCore, SeedableRng, TryRngCore};
use rand_chacha::ChaCha20Rng;

/// The noise generator: ChaCha20 (a cryptographically secure PRNG) keyed with 256 bits from the operating
/// system's randomness source ([`NoiseRng::from_os`]).
///
/// # Privacy
/// The privacy theorems behind the samplers (CKS20 Thm 4 for the discrete Gaussian, the geometric mechanism for
/// the discrete Laplace) assume *ideal* uniform random bits. ChaCha20 keyed from the OS is computationally
/// indistinguishable from them, so the guarantees hold against any computationally bounded observer. Every bit
/// of ChaCha20 output is used at most once (fair bits come from a 64-bit buffer that is never re-read, and
/// leftover buffered bits are only ever discarded), so the derived bits are independent.
///
/// A reproducible generator exists for statistical tests only ([`NoiseRng::insecure_seeded_for_tests`]).
///
/// The type deliberately implements neither `Clone` nor `Default` (a copy would replay the same noise), and its
/// `Debug` output shows no state.
pub struct NoiseRng {
    inner: ChaCha20Rng,
    /// Buffered uniform bits, consumed from the least significant end.
    bits: u64,
    /// Number of valid bits left in `bits`.
    nbits: u32,
}

impl std::fmt::Debug for NoiseRng {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NoiseRng { .. }")
    }
}

impl NoiseRng {
    /// Keys a ChaCha20 generator with 32 bytes from the operating system's randomness source.
    ///
    /// # Errors
    /// [`DpError::Randomness`] if the OS cannot provide randomness; then no noise can be drawn and nothing may be
    /// released.
    pub fn from_os() -> Result<Self> {
        let mut seed = [0u8; 32];
        rand::rngs::OsRng.try_fill_bytes(&mut seed).map_err(|e| DpError::Randomness(e.to_string()))?;
        let rng = Self::with(ChaCha20Rng::from_seed(seed));
        seed.fill(0);
        Ok(rng)
    }

    /// **INSECURE — FOR TESTS ONLY. NEVER USE FOR A RELEASE.**
    ///
    /// A generator fully determined by `seed`, so that statistical tests are reproducible. Noise drawn from it is
    /// **not private**: anyone who knows or guesses the 64-bit seed can regenerate the noise and subtract it.
    ///
    /// It is reachable only from Rust code that names it explicitly: no configuration key, no CLI flag and no SQL
    /// statement selects it, and the engine (`DpSession`, marginal releases) always uses [`NoiseRng::from_os`].
    /// Do not add a code path that calls it outside tests and benchmarks.
    pub fn insecure_seeded_for_tests(seed: u64) -> Self {
        Self::with(ChaCha20Rng::seed_from_u64(seed))
    }

    fn with(inner: ChaCha20Rng) -> Self {
        NoiseRng { inner, bits: 0, nbits: 0 }
    }

    /// One fair bit (uniform on {false, true}). Bits are drawn from ChaCha20 64 at a time and each is used once.
    #[inline]
    pub fn fair_bit(&mut self) -> bool {
        if self.nbits == 0 {
            self.bits = self.inner.next_u64();
            self.nbits = 64;
        }
        let b = self.bits & 1 == 1;
        self.bits >>= 1;
        self.nbits -= 1;
        b
    }

    /// `k` uniform bits, `1 ≤ k ≤ 32`, from the bit buffer. When fewer than `k` bits are left, the leftover bits
    /// are discarded (their number does not depend on their values) and the buffer is refilled.
    #[inline]
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

    /// Exactly uniform on `[0, n)` for `n ≥ 1` (`n = 0` is treated as `n = 1` and returns 0).
    ///
    /// Exact by rejection sampling, with no modulo bias:
    /// * `n` a power of two `≤ 2^32`: exactly `log₂ n` buffered bits, no rejection;
    /// * `n < 2^32`: Lemire's multiply-and-reject on 32 buffered bits;
    /// * `n < 2^64`: Lemire's multiply-and-reject on 64-bit words;
    /// * larger `n`: masked rejection on 128-bit words (acceptance probability > 1/2).
    ///
    /// Lemire (2019), "Fast random integer generation in an interval": for a uniform `w`-bit `x`, the high word
    /// of `x·n` is exactly uniform on `[0, n)` once the draws whose low word is below `2^w mod n` are rejected
    /// (every output value then has exactly `⌊2^w / n⌋` accepted preimages).
    #[inline]
    pub fn uniform_below(&mut self, n: u128) -> u128 {
        if n <= 1 {
            return 0;
        }
        if n <= 1 << 32 {
            if n.is_power_of_two() {
                return self.take_bits(n.trailing_zeros()) as u128;
            }
            return self.below_u32(n as u32) as u128; // n < 2^32 here
        }
        if let Ok(n64) = u64::try_from(n) {
            return self.below_u64(n64) as u128;
        }
        let bits = 128 - (n - 1).leading_zeros();
        let mask = if bits == 128 { u128::MAX } else { (1u128 << bits) - 1 };
        loop {
            let x = ((self.inner.next_u64() as u128) << 64 | self.inner.next_u64() as u128) & mask;
            if x < n {
                return x;
            }
        }
    }

    /// Lemire on 32 buffered bits, `2 ≤ n < 2^32`.
    #[inline]
    fn below_u32(&mut self, n: u32) -> u32 {
        let mut m = self.take_bits(32) * n as u64;
        if (m as u32) < n {
            let threshold = n.wrapping_neg() % n; // 2^32 mod n
            while (m as u32) < threshold {
                m = self.take_bits(32) * n as u64;
            }
        }
        (m >> 32) as u32
    }

    /// Lemire on 64-bit words, `2 ≤ n < 2^64`.
    #[inline]
    fn below_u64(&mut self, n: u64) -> u64 {
        let mut m = self.inner.next_u64() as u128 * n as u128;
        if (m as u64) < n {
            let threshold = n.wrapping_neg() % n; // 2^64 mod n
            while (m as u64) < threshold {
                m = self.inner.next_u64() as u128 * n as u128;
            }
        }
        (m >> 64) as u64
    }
}

/// Raw ChaCha20 output (delegated; the fair-bit buffer is not involved).
impl RngCore for NoiseRng {
    #[inline]
    fn next_u32(&mut self) -> u32 {
        self.inner.next_u32()
    }

    #[inline]
    fn next_u64(&mut self) -> u64 {
        self.inner.next_u64()
    }

    #[inline]
    fn fill_bytes(&mut self, dst: &mut [u8]) {
        self.inner.fill_bytes(dst)
    }
}

/// ChaCha20 is a cryptographically secure generator (also for the seeded test generator, whose *seed* is the
/// weak point, not the cipher).
impl CryptoRng for NoiseRng {}

#[cfg(test)]
mod tests {
    use super::*;
    use statrs::distribution::{ChiSquared, ContinuousCDF};

    /// Chi-square statistic of `counts` against the uniform distribution, checked against the critical value
    /// at p = 1e-9 (a correct generator fails with probability 1e-9; the seeds are fixed, so it is reproducible).
    fn assert_uniform(counts: &[f64], what: &str) {
        let n: f64 = counts.iter().sum();
        let e = n / counts.len() as f64;
        let chi: f64 = counts.iter().map(|c| (c - e).powi(2) / e).sum();
        let crit = ChiSquared::new((counts.len() - 1) as f64).unwrap().inverse_cdf(1.0 - 1e-9);
        assert!(chi < crit, "{what}: chi-square {chi:.1} ≥ {crit:.1}");
    }

    #[test]
    fn uniform_below_stays_in_range() {
        let mut r = NoiseRng::insecure_seeded_for_tests(1);
        for n in [0u128, 1, 2, 3, 7, 1 << 32, (1 << 32) - 1, (1 << 32) + 1, u64::MAX as u128, 1 << 64, u128::MAX] {
            for _ in 0..500 {
                assert!(r.uniform_below(n) < n.max(1), "n = {n}");
            }
        }
        assert_eq!(r.uniform_below(0), 0);
        assert_eq!(r.uniform_below(1), 0);
    }

    #[test]
    fn uniform_below_chi_square_on_every_path() {
        let mut r = NoiseRng::insecure_seeded_for_tests(2);
        // Power of two (bit buffer), small odd n (32-bit Lemire), with 10 000 expected per cell.
        for n in [2u128, 8, 3, 6, 7, 10] {
            let mut counts = vec![0f64; n as usize];
            for _ in 0..10_000 * n {
                counts[r.uniform_below(n) as usize] += 1.0;
            }
            assert_uniform(&counts, &format!("n = {n}"));
        }
        // A bound close to 2^32 where rejection is frequent (2^32 mod n is large): the class x mod 5 and the
        // high half must be uniform.
        let n = (1u128 << 32) - 5;
        let mut counts = [0f64; 10];
        for _ in 0..100_000 {
            let x = r.uniform_below(n);
            counts[(x % 5) as usize + 5 * usize::from(x >= n / 2)] += 1.0;
        }
        assert_uniform(&counts, "n = 2^32 - 5");
        // 64-bit Lemire: n = 3·2^62 (2^64 mod n = 2^62, a quarter of all draws rejected); the top bits are uniform
        // on {0, 1, 2}.
        let n = 3u128 << 62;
        let mut counts = [0f64; 3];
        for _ in 0..60_000 {
            counts[(r.uniform_below(n) >> 62) as usize] += 1.0;
        }
        assert_uniform(&counts, "n = 3·2^62");
        // Masked 128-bit rejection: n = 3·2^100.
        let n = 3u128 << 100;
        let mut counts = [0f64; 3];
        for _ in 0..60_000 {
            counts[(r.uniform_below(n) >> 100) as usize] += 1.0;
        }
        assert_uniform(&counts, "n = 3·2^100");
        // Low bits on the 128-bit path are uniform too.
        let n = (1u128 << 64) + 3;
        let mut counts = [0f64; 16];
        for _ in 0..80_000 {
            counts[(r.uniform_below(n) & 15) as usize] += 1.0;
        }
        assert_uniform(&counts, "n = 2^64 + 3, low bits");
    }

    #[test]
    fn fair_bits_are_balanced_and_pairs_independent() {
        let mut r = NoiseRng::insecure_seeded_for_tests(3);
        // Consecutive pairs of bits are uniform on the four outcomes (balance and no lag-1 dependence).
        let mut counts = [0f64; 4];
        for _ in 0..100_000 {
            let a = usize::from(r.fair_bit());
            let b = usize::from(r.fair_bit());
            counts[2 * a + b] += 1.0;
        }
        assert_uniform(&counts, "bit pairs");
    }

    #[test]
    fn os_seeding_works_and_differs() {
        let mut a = NoiseRng::from_os().unwrap();
        let mut b = NoiseRng::from_os().unwrap();
        assert_ne!((a.next_u64(), a.next_u64()), (b.next_u64(), b.next_u64()));
        assert_eq!(format!("{a:?}"), "NoiseRng { .. }");
    }

    #[test]
    fn seeded_generator_is_reproducible() {
        let mut a = NoiseRng::insecure_seeded_for_tests(9);
        let mut b = NoiseRng::insecure_seeded_for_tests(9);
        let xa: Vec<u128> = (0..50).map(|_| a.uniform_below(1000)).collect();
        let xb: Vec<u128> = (0..50).map(|_| b.uniform_below(1000)).collect();
        assert_eq!(xa, xb);
    }
}
