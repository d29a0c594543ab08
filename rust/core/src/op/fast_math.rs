//! Branch-free float32 exp, tanh and sigmoid that compile to vector instructions inside
//! element-wise loops (libm's scalar calls cost several times the memory traffic of the loop).
//! Accurate to a few ulp; the operator tests compare them with NumPy.

/// Adding then subtracting 1.5 * 2^23 rounds a float32 of magnitude < 2^22 to the nearest
/// integer with plain additions (no rounding instruction needed on baseline x86-64); the sum's
/// low mantissa bits then hold that integer, read without a float-to-int conversion (Rust's
/// saturating `as i32` would keep the loop from vectorizing).
const ROUNDER: f32 = 12_582_912.0;

/// e^x: x = n ln2 + r with |r| <= ln2 / 2, e^r by its degree-6 Taylor polynomial (error below
/// 2e-7 relative on that interval), scaled by 2^n through the exponent bits. Written with
/// `mul_add` for the FMA units of kernels run through `simd::vectorized` (on an x86-64 CPU
/// without FMA it is a slower libm call, still exact).
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    let clamped = x.clamp(-87.0, 88.5);
    let shifted = clamped.mul_add(std::f32::consts::LOG2_E, ROUNDER);
    let n = shifted - ROUNDER;
    // ln 2 split into a part exact in float32 and the remainder (Cody and Waite).
    let r = n.mul_add(-1.428_606_8e-6, n.mul_add(-0.693_145_75, clamped));
    let mut p: f32 = 1.0 / 720.0;
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = p.mul_add(r, c);
    }
    let n_bits = shifted.to_bits().wrapping_sub(ROUNDER.to_bits());
    let value = p * f32::from_bits(n_bits.wrapping_add(127) << 23);
    // Outside float32's range the result saturates as exp does; NaN passes through. Selects,
    // not branches, so the loop stays vectorized.
    let value = if x > 88.72 { f32::INFINITY } else { value };
    let value = if x < -87.3 { 0.0 } else { value };
    if x.is_nan() {
        x
    } else {
        value
    }
}

/// tanh: an odd Taylor polynomial below 0.5 in magnitude (where 1 - 2/(e^2x + 1) would cancel),
/// that formula above.
#[inline(always)]
pub fn tanh_f32(x: f32) -> f32 {
    let a = x.abs();
    let x2 = x * x;
    let small = x * (1.0
        + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0 + x2 * (-17.0 / 315.0 + x2 * (62.0 / 2835.0 + x2 * (-1382.0 / 155_925.0))))));
    let large = 1.0 - 2.0 / (exp_f32(2.0 * a) + 1.0);
    if a < 0.5 {
        small
    } else {
        large.copysign(x)
    }
}

/// 1 / (1 + e^-x).
#[inline(always)]
pub fn sigmoid_f32(x: f32) -> f32 {
    1.0 / (1.0 + exp_f32(-x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_to_libm_over_the_range() {
        let mut worst = (0f64, 0f64, 0f64);
        for i in -21000..=21000 {
            let x = i as f32 * 0.004;
            let e = (exp_f32(x) as f64 - (x as f64).exp()).abs() / (x as f64).exp();
            let t = (tanh_f32(x) as f64 - (x as f64).tanh()).abs() / (x as f64).tanh().abs().max(1e-30);
            let s = (sigmoid_f32(x) as f64 - 1.0 / (1.0 + (-(x as f64)).exp())).abs();
            worst = (worst.0.max(e), worst.1.max(if x == 0.0 { 0.0 } else { t }), worst.2.max(s));
        }
        assert!(worst.0 < 1e-6 && worst.1 < 2e-6 && worst.2 < 1e-6, "{worst:?}");
        assert_eq!(exp_f32(-200.0), 0.0);
        assert_eq!(exp_f32(100.0), f32::INFINITY);
        assert!(exp_f32(f32::NAN).is_nan() && tanh_f32(0.0) == 0.0 && tanh_f32(50.0) == 1.0 && sigmoid_f32(-100.0) == 0.0);
    }
}
