//! Random number generation as an engine resource.
//!
//! Every random operator draws a 64-bit seed from the global stream when it is *pushed*, so the
//! sequence of seeds follows program order, not thread timing. Its kernel then derives element
//! `i`'s bits from `(seed, i)` with a counter-based hash, so the values do not depend on how the
//! work is split across threads either: `mx.random.seed(s)` makes runs reproducible.

use std::sync::atomic::{AtomicU64, Ordering};

static STREAM: AtomicU64 = AtomicU64::new(0x5EED_0F_0A_7E_u64);
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// Reset the stream (MXNet's `mx.random.seed`).
pub fn seed(s: u64) {
    // Relaxed: the stream is a counter; ordering against other memory is not needed, and a seed
    // call racing with pushes from another thread has no defined order in MXNet either.
    STREAM.store(mix(s ^ 0x0A5E_ED00_0000_0001), Ordering::Relaxed);
}

/// The seed for the next random operator.
pub fn next_op_seed() -> u64 {
    mix(STREAM.fetch_add(GOLDEN, Ordering::Relaxed))
}

/// SplitMix64's finalizer: a bijective mix with full avalanche.
#[inline(always)]
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// 64 random bits for element `index` of the op seeded with `seed`.
#[inline(always)]
pub fn bits(seed: u64, index: u64) -> u64 {
    mix(seed ^ mix(index.wrapping_mul(GOLDEN).wrapping_add(seed)))
}

/// Uniform in [0, 1) with 53 random bits.
#[inline(always)]
pub fn uniform(seed: u64, index: u64) -> f64 {
    (bits(seed, index) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Standard normal for element `index` (Box-Muller over the pair index / 2).
#[inline(always)]
pub fn normal(seed: u64, index: u64) -> f64 {
    let pair = index / 2;
    let u1 = 1.0 - uniform(seed, 2 * pair); // in (0, 1]: log is finite
    let u2 = uniform(seed, 2 * pair + 1);
    let r = (-2.0 * u1.ln()).sqrt();
    let theta = 2.0 * std::f64::consts::PI * u2;
    if index % 2 == 0 {
        r * theta.cos()
    } else {
        r * theta.sin()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_moments_and_determinism() {
        let n = 100_000u64;
        let mean = (0..n).map(|i| uniform(42, i)).sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.01, "{mean}");
        assert_eq!(uniform(7, 3), uniform(7, 3));
        assert_ne!(uniform(7, 3), uniform(8, 3));
        let z: Vec<f64> = (0..n).map(|i| normal(1, i)).collect();
        let m = z.iter().sum::<f64>() / n as f64;
        let v = z.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n as f64;
        assert!(m.abs() < 0.02 && (v - 1.0).abs() < 0.03, "{m} {v}");
    }
}
