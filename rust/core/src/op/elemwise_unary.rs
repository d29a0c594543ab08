//! Element-wise unary math: one table row per operator.

use std::marker::PhantomData;

use half::{bf16, f16};
use num_traits::Float;

use super::broadcast::{map1, truth};
use super::params::NoParams;
use super::{ExecContext, OpDef, Operator, Tensor};
use crate::base::{Bool8, DType, Elem, Shape};
use crate::error::Result;

/// The math of one unary operator, written once for every float width. Integer inputs compute
/// through f64 (exact for |x| < 2^53) and cast back, as MXNet's kernels do.
pub trait UnaryMath: Send + Sync + 'static {
    fn float<F: Float>(x: F) -> F;
}

struct Unary<M>(PhantomData<M>);

impl<M: UnaryMath> Operator for Unary<M> {
    fn num_inputs(&self) -> usize {
        1
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        Ok(vec![inputs[0].clone()])
    }
    fn inplace_pairs(&self) -> &'static [(usize, usize)] {
        &[(0, 0)]
    }
    fn forward(&self, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        apply_unary::<M>(&inputs[0], &outputs[0]);
        Ok(())
    }
}

fn apply_unary<M: UnaryMath>(x: &Tensor, y: &Tensor) {
    match x.dtype {
        DType::F32 => map1(x, y, M::float::<f32>),
        DType::F64 => map1(x, y, M::float::<f64>),
        DType::F16 => map1(x, y, |v: f16| f16::from_f32(M::float(v.to_f32()))),
        DType::BF16 => map1(x, y, |v: bf16| bf16::from_f32(M::float(v.to_f32()))),
        DType::U8 => map1(x, y, int_path::<M, u8>),
        DType::I8 => map1(x, y, int_path::<M, i8>),
        DType::I32 => map1(x, y, int_path::<M, i32>),
        DType::I64 => map1(x, y, int_path::<M, i64>),
        DType::Bool => map1(x, y, int_path::<M, Bool8>),
    }
}

#[inline(always)]
fn int_path<M: UnaryMath, T: Elem>(v: T) -> T {
    T::from_f64(M::float(v.to_f64()))
}

#[inline(always)]
fn lit<F: Float>(v: f64) -> F {
    F::from(v).unwrap()
}

/// Special functions have no generic form in num-traits: compute them in f64 with libm.
#[inline(always)]
fn via_f64<F: Float>(x: F, f: fn(f64) -> f64) -> F {
    F::from(f(x.to_f64().unwrap_or(f64::NAN))).unwrap_or_else(F::nan)
}

/// Inverse error function: Giles' single-precision approximation refined by two Newton steps on
/// libm's erf, which brings it to double precision.
fn erfinv(y: f64) -> f64 {
    if y <= -1.0 {
        return if y == -1.0 { f64::NEG_INFINITY } else { f64::NAN };
    }
    if y >= 1.0 {
        return if y == 1.0 { f64::INFINITY } else { f64::NAN };
    }
    let w = -((1.0 - y) * (1.0 + y)).ln();
    let mut x = if w < 5.0 {
        let w = w - 2.5;
        let mut p = 2.810_226_36e-08;
        for c in [3.432_739_39e-07, -3.523_387_7e-06, -4.391_506_54e-06, 0.000_218_580_87, -0.001_253_725_03,
                  -0.004_177_681_64, 0.246_640_727, 1.501_409_41] {
            p = c + p * w;
        }
        p * y
    } else {
        let w = w.sqrt() - 3.0;
        let mut p = -0.000_200_214_257;
        for c in [0.000_100_950_558, 0.001_349_343_22, -0.003_673_428_44, 0.005_739_507_73, -0.007_622_461_3,
                  0.009_438_870_47, 1.001_674_06, 2.832_976_82] {
            p = c + p * w;
        }
        p * y
    };
    for _ in 0..2 {
        let err = libm::erf(x) - y;
        x -= err / (2.0 / std::f64::consts::PI.sqrt() * (-x * x).exp());
    }
    x
}

macro_rules! unary_ops {
    ($( $ty:ident $name:literal [$($alias:literal),*] $doc:literal => |$x:ident| $body:expr; )*) => {
        $(
            struct $ty;
            impl UnaryMath for $ty {
                #[inline(always)]
                #[allow(clippy::redundant_closure_call)]
                fn float<F: Float>($x: F) -> F {
                    $body
                }
            }
        )*
        pub(super) fn register(add: &mut dyn FnMut(OpDef)) {
            $(
                add(OpDef::new($name, &[$($alias),*], $doc, |_: NoParams| Ok(Unary::<$ty>(PhantomData))));
            )*
        }
    };
}

unary_ops! {
    Abs "abs" [] "Returns element-wise absolute value of the input." => |x| x.abs();
    Sign "sign" [] "Returns element-wise sign of the input (-1, 0 or 1)." =>
        |x| if x > F::zero() { F::one() } else if x < F::zero() { -F::one() } else { F::zero() };
    Round "round" [] "Returns element-wise rounded value to the nearest integer, halves away from zero." => |x| x.round();
    Rint "rint" [] "Returns element-wise rounded value to the nearest integer, halves to even." =>
        |x| { let r = x.round(); if (x - x.trunc()).abs() == lit(0.5) { lit::<F>(2.0) * (x / lit(2.0)).round() } else { r } };
    Ceil "ceil" [] "Returns element-wise ceiling of the input." => |x| x.ceil();
    Floor "floor" [] "Returns element-wise floor of the input." => |x| x.floor();
    Trunc "trunc" [] "Returns element-wise truncated value of the input." => |x| x.trunc();
    Fix "fix" [] "Returns element-wise rounded value to the nearest integer towards zero." => |x| x.trunc();
    Square "square" [] "Returns element-wise squared value of the input." => |x| x * x;
    Sqrt "sqrt" [] "Returns element-wise square root of the input." => |x| x.sqrt();
    Rsqrt "rsqrt" [] "Returns element-wise inverse square root of the input." => |x| F::one() / x.sqrt();
    Cbrt "cbrt" [] "Returns element-wise cube root of the input." => |x| x.cbrt();
    Rcbrt "rcbrt" [] "Returns element-wise inverse cube root of the input." => |x| F::one() / x.cbrt();
    Exp "exp" [] "Returns element-wise exponential value of the input." => |x| x.exp();
    Expm1 "expm1" [] "Returns exp(x) - 1 computed element-wise." => |x| x.exp_m1();
    Log "log" [] "Returns element-wise natural logarithmic value of the input." => |x| x.ln();
    Log10 "log10" [] "Returns element-wise base-10 logarithmic value of the input." => |x| x.log10();
    Log2 "log2" [] "Returns element-wise base-2 logarithmic value of the input." => |x| x.log2();
    Log1p "log1p" [] "Returns element-wise log(1 + x)." => |x| x.ln_1p();
    Sin "sin" [] "Computes the element-wise sine of the input array." => |x| x.sin();
    Cos "cos" [] "Computes the element-wise cosine of the input array." => |x| x.cos();
    Tan "tan" [] "Computes the element-wise tangent of the input array." => |x| x.tan();
    Arcsin "arcsin" [] "Returns element-wise inverse sine of the input array." => |x| x.asin();
    Arccos "arccos" [] "Returns element-wise inverse cosine of the input array." => |x| x.acos();
    Arctan "arctan" [] "Returns element-wise inverse tangent of the input array." => |x| x.atan();
    Sinh "sinh" [] "Returns the hyperbolic sine of the input array, computed element-wise." => |x| x.sinh();
    Cosh "cosh" [] "Returns the hyperbolic cosine of the input array, computed element-wise." => |x| x.cosh();
    Tanh "tanh" [] "Returns the hyperbolic tangent of the input array, computed element-wise." => |x| x.tanh();
    Arcsinh "arcsinh" [] "Returns the element-wise inverse hyperbolic sine of the input array." => |x| x.asinh();
    Arccosh "arccosh" [] "Returns the element-wise inverse hyperbolic cosine of the input array." => |x| x.acosh();
    Arctanh "arctanh" [] "Returns the element-wise inverse hyperbolic tangent of the input array." => |x| x.atanh();
    Degrees "degrees" [] "Converts each element of the input array from radians to degrees." => |x| x.to_degrees();
    Radians "radians" [] "Converts each element of the input array from degrees to radians." => |x| x.to_radians();
    Sigmoid "sigmoid" [] "Computes sigmoid of x element-wise: 1 / (1 + exp(-x))." => |x| F::one() / (F::one() + (-x).exp());
    Relu "relu" [] "Computes rectified linear activation: max(x, 0)." => |x| if x > F::zero() { x } else { F::zero() };
    Softsign "softsign" [] "Computes softsign of x element-wise: x / (1 + abs(x))." => |x| x / (F::one() + x.abs());
    Reciprocal "reciprocal" [] "Returns the reciprocal of the argument, element-wise." => |x| F::one() / x;
    Negative "negative" [] "Numerical negative of the argument, element-wise." => |x| -x;
    LogicalNot "logical_not" [] "Returns the result of logical NOT (!) function: 1 where x is 0, else 0." =>
        |x| if x == F::zero() { F::one() } else { F::zero() };
    Erf "erf" [] "Returns element-wise Gauss error function of the input." => |x| via_f64(x, libm::erf);
    Erfinv "erfinv" [] "Returns element-wise inverse Gauss error function of the input." => |x| via_f64(x, erfinv);
    Gamma "gamma" [] "Returns the gamma function (extension of the factorial) of the input, element-wise." => |x| via_f64(x, libm::tgamma);
    Gammaln "gammaln" [] "Returns element-wise log of the absolute value of the gamma function of the input." => |x| via_f64(x, libm::lgamma);
    IsNan "isnan" [] "Returns 1 where the input is NaN, else 0 (in the input dtype)." => |x| truth(x.is_nan());
    IsInf "isinf" [] "Returns 1 where the input is infinite, else 0 (in the input dtype)." => |x| truth(x.is_infinite());
    IsFinite "isfinite" [] "Returns 1 where the input is finite, else 0 (in the input dtype)." => |x| truth(x.is_finite());
    Identity "_copy" ["identity"] "Returns a copy of the input." => |x| x;
    BlockGrad "BlockGrad" ["stop_gradient"] "Returns a copy of the input; no gradient flows back through it." => |x| x;
}
