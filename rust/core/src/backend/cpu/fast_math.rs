//! Branch-free float32 exp, tanh and sigmoid that compile to vector instructions inside
//! element-wise loops (libm's scalar calls cost several times the memory traffic of the loop).
//! Accurate to a few ulp; the operator tests compare them with NumPy.

/// Adding then subtracting 1.5 * 2^23 rounds a float32 of magnitude < 2^22 to the nearest
/// integer with plain additions (no rounding instruction needed on baseline x86-64). The extra 127
/// (float32's exponent bias) leaves `n + 127` in the sum's low mantissa bits, so shifting the bits
/// left by 23 builds 2^n directly, without a float-to-int conversion (Rust's saturating `as i32`
/// would keep the loop from vectorizing).
const ROUNDER: f32 = 12_582_912.0 + 127.0;

/// e^x for x in [-87, 88.5] (e^88.5 comes out as infinity), NaN passing through: x = n ln2 + r
/// with |r| <= ln2 / 2, e^r by its degree-6 Taylor polynomial (error below 2e-7 relative on that
/// interval), scaled by 2^n through the exponent bits. Written with `mul_add` for the FMA units
/// of kernels run through `simd::vectorized` (on an x86-64 CPU without FMA it is a slower libm
/// call, still exact). Callers that saturate anyway (sigmoid, tanh) use it without the selects
/// of [`exp_f32`], a third fewer instructions: the exponential bounds their loops' speed.
#[inline(always)]
fn exp_in_range(x: f32) -> f32 {
    // clamp keeps NaN, which then propagates through every step below.
    let clamped = x.clamp(-87.0, 88.5);
    let shifted = clamped.mul_add(std::f32::consts::LOG2_E, ROUNDER);
    let n = shifted - ROUNDER;
    // ln 2 split into a part exact in float32 and the remainder (Cody and Waite).
    let r = n.mul_add(-1.428_606_8e-6, n.mul_add(-0.693_145_75, clamped));
    let mut p: f32 = 1.0 / 720.0;
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = p.mul_add(r, c);
    }
    p * f32::from_bits(shifted.to_bits() << 23)
}

/// e^x over all of float32: saturating to 0 and infinity outside its range, NaN passing through.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    let value = exp_in_range(x);
    // Selects, not branches, so the loop stays vectorized.
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
    let small = x * (1.0 + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0 + x2 * (-17.0 / 315.0 + x2 * (62.0 / 2835.0 + x2 * (-1382.0 / 155_925.0))))));
    // Above 44 in magnitude the exponential is infinite and the quotient 0: tanh is 1.
    let large = 1.0 - 2.0 / (exp_in_range(2.0 * a) + 1.0);
    if a < 0.5 {
        small
    } else {
        large.copysign(x)
    }
}

/// 1 / (1 + e^-x); below -88.5 the exponential is infinite and the result 0.
#[inline(always)]
pub fn sigmoid_f32(x: f32) -> f32 {
    1.0 / (1.0 + exp_in_range(-x))
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
        assert!(tanh_f32(f32::NAN).is_nan() && sigmoid_f32(f32::NAN).is_nan());
        assert_eq!((tanh_f32(-1e30), sigmoid_f32(1e30), sigmoid_f32(f32::NEG_INFINITY)), (-1.0, 1.0, 0.0));
        // The same edge cases through the vectorized loop the kernels compile to.
        let xs = [f32::NAN, -1e30, 1e30, -100.0, 0.25, 3.0, f32::NAN, 50.0].repeat(8);
        let mut ys = vec![0f32; xs.len()];
        super::super::simd::vectorized(
            #[inline(always)]
            || ys.iter_mut().zip(&xs).for_each(|(y, &x)| *y = sigmoid_f32(x) + tanh_f32(x)),
        );
        for (x, y) in xs.iter().zip(&ys) {
            let expected = sigmoid_f32(*x) + tanh_f32(*x);
            assert!(y.to_bits() == expected.to_bits() || (y.is_nan() && expected.is_nan()), "{x}: {y} vs {expected}");
        }
    }
}
