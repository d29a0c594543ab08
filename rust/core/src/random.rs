//! Random number generation as an engine resource.
//!
//! Every random operator draws a 64-bit seed from the global stream when it is *pushed*, so the
//! sequence of seeds follows program order, not thread timing. Its kernel then derives element
//! `i`'s bits from `(seed, i)` with a counter-based hash, so the values do not depend on how the
//! work is split across threads either: `mx.random.seed(s)` makes runs reproducible.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::engine::Var;

static STREAM: AtomicU64 = AtomicU64::new(0x005E_ED0F_0A7E_u64);
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// Reset the stream (MXNet's `mx.random.seed`).
pub fn seed(s: u64) {
    // Relaxed: the stream is a counter; ordering against other memory is not needed, and a seed
    // call racing with pushes from another thread has no defined order in MXNet either.
    STREAM.store(mix(s ^ 0x0A5E_ED00_0000_0001), Ordering::Relaxed);
}

/// The engine var of the random generator, which every random operator writes (MXNet's random
/// resource). The seeds never depend on it; it orders random operators among themselves and
/// carries a failure of one to the random operators pushed after it until the error is reported,
/// as MXNet does.
pub fn engine_var() -> &'static Arc<Var> {
    static GENERATOR_VAR: OnceLock<Arc<Var>> = OnceLock::new();
    GENERATOR_VAR.get_or_init(Var::new)
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
    if index.is_multiple_of(2) {
        r * theta.cos()
    } else {
        r * theta.sin()
    }
}

/// The `draw`-th uniform of element `index`'s private stream (for rejection samplers, which need
/// a variable number of draws per element).
#[inline(always)]
fn stream_uniform(seed: u64, index: u64, draw: u64) -> f64 {
    uniform(mix(seed ^ index.wrapping_mul(0xD1B5_4A32_D192_ED03)), draw)
}

#[inline(always)]
fn stream_normal(seed: u64, index: u64, draw: u64) -> f64 {
    let u1 = 1.0 - stream_uniform(seed, index, 2 * draw);
    let u2 = stream_uniform(seed, index, 2 * draw + 1);
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// Gamma(shape `alpha`, scale 1) by Marsaglia and Tsang's method (boosted for alpha < 1).
pub fn gamma(seed: u64, index: u64, alpha: f64) -> f64 {
    if alpha <= 0.0 {
        return f64::NAN;
    }
    let (a, boost) = if alpha < 1.0 { (alpha + 1.0, true) } else { (alpha, false) };
    let d = a - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    let mut draw = 0u64;
    loop {
        let x = stream_normal(seed, index, draw);
        let u = stream_uniform(seed, index, (1 << 40) + draw);
        draw += 1;
        let v = (1.0 + c * x).powi(3);
        if v > 0.0 && u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
            let g = d * v;
            return if boost { g * stream_uniform(seed, index, 1 << 41).powf(1.0 / alpha) } else { g };
        }
    }
}

/// Poisson(`lam`): multiplication of uniforms for small means, Hörmann's PTRS rejection otherwise.
pub fn poisson(seed: u64, index: u64, lam: f64) -> f64 {
    if lam <= 0.0 {
        return 0.0;
    }
    let mut draw = 0u64;
    if lam < 12.0 {
        let limit = (-lam).exp();
        let mut prod = stream_uniform(seed, index, draw);
        let mut k = 0.0;
        while prod > limit {
            draw += 1;
            prod *= stream_uniform(seed, index, draw);
            k += 1.0;
        }
        return k;
    }
    let slam = lam.sqrt();
    let loglam = lam.ln();
    let b = 0.931 + 2.53 * slam;
    let a = -0.059 + 0.02483 * b;
    let inv_alpha = 1.1239 + 1.1328 / (b - 3.4);
    let vr = 0.9277 - 3.6224 / (b - 2.0);
    loop {
        let u = stream_uniform(seed, index, 2 * draw) - 0.5;
        let v = stream_uniform(seed, index, 2 * draw + 1);
        draw += 1;
        let us = 0.5 - u.abs();
        let k = ((2.0 * a / us + b) * u + lam + 0.43).floor();
        if us >= 0.07 && v <= vr {
            return k;
        }
        if k < 0.0 || (us < 0.013 && v > us) {
            continue;
        }
        if (v * inv_alpha / (a / (us * us) + b)).ln() <= -lam + k * loglam - libm::lgamma(k + 1.0) {
            return k;
        }
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

    fn moments(f: impl Fn(u64) -> f64) -> (f64, f64) {
        let n = 200_000u64;
        let x: Vec<f64> = (0..n).map(f).collect();
        let m = x.iter().sum::<f64>() / n as f64;
        (m, x.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / n as f64)
    }

    #[test]
    fn gamma_and_poisson_moments() {
        for alpha in [0.5, 1.0, 3.0, 20.0] {
            let (m, v) = moments(|i| gamma(9, i, alpha));
            assert!((m - alpha).abs() < 0.03 * alpha.max(1.0) && (v - alpha).abs() < 0.06 * alpha.max(1.0), "{alpha}: {m} {v}");
        }
        for lam in [0.5, 4.0, 30.0, 400.0] {
            let (m, v) = moments(|i| poisson(5, i, lam));
            assert!((m - lam).abs() < 0.02 * lam.max(1.0) && (v - lam).abs() < 0.05 * lam.max(1.0), "{lam}: {m} {v}");
        }
    }
}
