//! Element-wise unary math: one table row per operator.

use crate::op::KernelArgs;
use std::marker::PhantomData;
use std::sync::Arc;

use half::{bf16, f16};
use num_traits::Float;

use super::broadcast::{map_args, map_slices, truth};
use super::grad::{Grad, InputGrads};
use super::params::NoParams;
use super::{exactly, Elementwise, ExecContext, OpDef, Operator, PARALLEL_GRAIN};
use crate::base::{Bool8, DType, Elem, Shape};
use crate::error::Result;
use crate::graph::Entry;

/// The math of one unary operator, written once for every float width. Integer inputs compute
/// through f64 (exact for |x| < 2^53) and cast back, as MXNet's kernels do.
pub trait UnaryMath: Send + Sync + 'static {
    fn float<F: Float>(x: F) -> F;
    /// The input gradient from input `x`, output `y` and output gradient `dy`.
    fn grad(d: &mut Grad, x: &Entry, y: &Entry, dy: &Entry) -> Result<Option<Entry>>;
    /// The float32 kernel: `float` unless a vectorizable approximation exists (exp, tanh,
    /// sigmoid: libm's scalar calls cost several times the memory traffic).
    #[inline(always)]
    fn float_f32(x: f32) -> f32 {
        Self::float(x)
    }
    /// Elements below which the kernel stays on one thread.
    const GRAIN: usize = super::PARALLEL_GRAIN;
}

/// The grain of the transcendental functions (exp, tanh, sigmoid): at 2 threads a 32K-element
/// tanh takes 7.9 us unsplit, and 64K elements take 9.2 us split against 15.1 us on one thread
/// (exp: 6.2 against 9.0), so halving the common grain pays from about 16K elements on; a
/// memory-bound add of 64K gains nothing from splitting (3.8 against 3.7 us).
const TRANSCENDENTAL_GRAIN: usize = 1 << 14;

struct Unary<M> {
    cuda_expr: &'static str,
    _m: PhantomData<M>,
}

impl<M: UnaryMath> Operator for Unary<M> {
    fn num_inputs(&self) -> usize {
        1
    }
    fn elementwise(&self) -> Option<Elementwise> {
        Some(Elementwise {
            kernel: Arc::new(|out: &mut [f32], inputs: &[&[f32]]| {
                if let [x] = inputs {
                    map_slices(x, out, &M::float_f32)
                }
            }),
            cuda_expr: self.cuda_expr.to_string(),
            scalar: None,
        })
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [x] = exactly("unary operator", "input", inputs)?;
        Ok(vec![x.clone()])
    }
    fn inplace_pairs(&self) -> &[(usize, usize)] {
        &[(0, 0)]
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        apply_unary::<M>(args)
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (x, y, dy) = (d.input(0), d.output(0), d.out_grad(0));
        Ok(vec![M::grad(d, &x, &y, &dy)?])
    }
}

fn apply_unary<M: UnaryMath>(args: &KernelArgs) -> Result<()> {
    match args.input_dtype(0)? {
        DType::F32 => map_args(args, M::GRAIN, M::float_f32),
        DType::F64 => map_args(args, M::GRAIN, M::float::<f64>),
        DType::F16 => map_args(args, M::GRAIN, |v: f16| f16::from_f32(M::float(v.to_f32()))),
        DType::BF16 => map_args(args, M::GRAIN, |v: bf16| bf16::from_f32(M::float(v.to_f32()))),
        DType::U8 => map_args(args, PARALLEL_GRAIN, int_path::<M, u8>),
        DType::I8 => map_args(args, PARALLEL_GRAIN, int_path::<M, i8>),
        DType::I32 => map_args(args, PARALLEL_GRAIN, int_path::<M, i32>),
        DType::I64 => map_args(args, PARALLEL_GRAIN, int_path::<M, i64>),
        DType::Bool => map_args(args, PARALLEL_GRAIN, int_path::<M, Bool8>),
    }
}

#[inline(always)]
fn int_path<M: UnaryMath, T: Elem>(v: T) -> T {
    T::from_f64(M::float(v.to_f64()))
}

#[inline(always)]
fn lit<F: Float>(v: f64) -> F {
    // A float type holds every f64 (rounded, or as an infinity), so `from` never gives None.
    F::from(v).unwrap_or_else(F::nan)
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
        for c in [
            3.432_739_39e-07,
            -3.523_387_7e-06,
            -4.391_506_54e-06,
            0.000_218_580_87,
            -0.001_253_725_03,
            -0.004_177_681_64,
            0.246_640_727,
            1.501_409_41,
        ] {
            p = c + p * w;
        }
        p * y
    } else {
        let w = w.sqrt() - 3.0;
        let mut p = -0.000_200_214_257;
        for c in
            [0.000_100_950_558, 0.001_349_343_22, -0.003_673_428_44, 0.005_739_507_73, -0.007_622_461_3, 0.009_438_870_47, 1.001_674_06, 2.832_976_82]
        {
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

/// Digamma: the recurrence psi(x) = psi(x + 1) - 1/x lifts x above 6, where the asymptotic
/// series is accurate to double precision; reflection handles negative arguments.
fn digamma(mut x: f64) -> f64 {
    if x.is_nan() || x == f64::NEG_INFINITY {
        return f64::NAN;
    }
    if x <= 0.0 && x == x.floor() {
        return f64::NAN;
    }
    if x < 0.0 {
        return digamma(1.0 - x) - std::f64::consts::PI / (std::f64::consts::PI * x).tan();
    }
    let mut result = 0.0;
    while x < 6.0 {
        result -= 1.0 / x;
        x += 1.0;
    }
    let inv2 = 1.0 / (x * x);
    result + x.ln() - 0.5 / x - inv2 * (1.0 / 12.0 - inv2 * (1.0 / 120.0 - inv2 * (1.0 / 252.0 - inv2 * (1.0 / 240.0 - inv2 / 132.0))))
}

macro_rules! unary_ops {
    ($( $ty:ident $name:literal [$($alias:literal),*] $doc:literal => |$x:ident| $body:expr, cuda $cuda:literal,
        grad |$d:ident, $gx:ident, $gy:ident, $dy:ident| $grad:expr $(, f32 $fast:path)? $(, grain $grain:expr)?; )*) => {
        $(
            struct $ty;
            impl UnaryMath for $ty {
                #[inline(always)]
                #[allow(clippy::redundant_closure_call)]
                fn float<F: Float>($x: F) -> F {
                    $body
                }
                #[allow(unused_variables)]
                fn grad($d: &mut Grad, $gx: &Entry, $gy: &Entry, $dy: &Entry) -> Result<Option<Entry>> {
                    $grad
                }
                $(
                    #[inline(always)]
                    fn float_f32(x: f32) -> f32 {
                        $fast(x)
                    }
                )?
                $(const GRAIN: usize = $grain;)?
            }
        )*
        pub(super) fn register(add: &mut dyn FnMut(OpDef)) {
            $(
                add(OpDef::new($name, &[$($alias),*], $doc, |_: NoParams| Ok(Unary::<$ty> { cuda_expr: $cuda, _m: PhantomData })));
            )*
        }
    };
}

unary_ops! {
    Abs "abs" [] "Returns element-wise absolute value of the input." => |x| x.abs(), cuda "fabs($0)",
        grad |d, x, y, g| { let s = d.unary("sign", x)?; d.mul(g, &s) }.map(Some);
    Sign "sign" [] "Returns element-wise sign of the input (-1, 0 or 1)." =>
        |x| if x > F::zero() { F::one() } else if x < F::zero() { -F::one() } else { F::zero() }, cuda "($0 > 0) - ($0 < 0)",
        grad |d, x, y, g| Ok(None);
    Round "round" [] "Returns element-wise rounded value to the nearest integer, halves away from zero." => |x| x.round(), cuda "round($0)",
        grad |d, x, y, g| Ok(None);
    Rint "rint" [] "Returns element-wise rounded value to the nearest integer, halves to even." =>
        |x| { let r = x.round(); if (x - x.trunc()).abs() == lit(0.5) { lit::<F>(2.0) * (x / lit(2.0)).round() } else { r } }, cuda "rint($0)",
        grad |d, x, y, g| Ok(None);
    Ceil "ceil" [] "Returns element-wise ceiling of the input." => |x| x.ceil(), cuda "ceil($0)",
        grad |d, x, y, g| Ok(None);
    Floor "floor" [] "Returns element-wise floor of the input." => |x| x.floor(), cuda "floor($0)",
        grad |d, x, y, g| Ok(None);
    Trunc "trunc" [] "Returns element-wise truncated value of the input." => |x| x.trunc(), cuda "trunc($0)",
        grad |d, x, y, g| Ok(None);
    Fix "fix" [] "Returns element-wise rounded value to the nearest integer towards zero." => |x| x.trunc(), cuda "trunc($0)",
        grad |d, x, y, g| Ok(None);
    Square "square" [] "Returns element-wise squared value of the input." => |x| x * x, cuda "$0 * $0",
        grad |d, x, y, g| { let t = d.scalar("_mul_scalar", x, 2.0)?; d.mul(g, &t) }.map(Some);
    Sqrt "sqrt" [] "Returns element-wise square root of the input." => |x| x.sqrt(), cuda "sqrt($0)",
        grad |d, x, y, g| { let t = d.scalar("_mul_scalar", y, 2.0)?; d.div(g, &t) }.map(Some);
    Rsqrt "rsqrt" [] "Returns element-wise inverse square root of the input." => |x| F::one() / x.sqrt(), cuda "rsqrt($0)",
        grad |d, x, y, g| { let t = d.div(y, x)?; let t = d.scalar("_mul_scalar", &t, -0.5)?; d.mul(g, &t) }.map(Some);
    Cbrt "cbrt" [] "Returns element-wise cube root of the input." => |x| x.cbrt(), cuda "cbrt($0)",
        grad |d, x, y, g| { let t = d.unary("square", y)?; let t = d.scalar("_mul_scalar", &t, 3.0)?; d.div(g, &t) }.map(Some);
    Rcbrt "rcbrt" [] "Returns element-wise inverse cube root of the input." => |x| F::one() / x.cbrt(), cuda "rcbrt($0)",
        grad |d, x, y, g| { let t = d.div(y, x)?; let t = d.scalar("_mul_scalar", &t, -1.0 / 3.0)?; d.mul(g, &t) }.map(Some);
    Exp "exp" [] "Returns element-wise exponential value of the input." => |x| x.exp(), cuda "exp($0)",
        grad |d, x, y, g| d.mul(g, y).map(Some), f32 crate::backend::cpu::fast_math::exp_f32, grain TRANSCENDENTAL_GRAIN;
    Expm1 "expm1" [] "Returns exp(x) - 1 computed element-wise." => |x| x.exp_m1(), cuda "expm1($0)",
        grad |d, x, y, g| { let t = d.scalar("_plus_scalar", y, 1.0)?; d.mul(g, &t) }.map(Some);
    Log "log" [] "Returns element-wise natural logarithmic value of the input." => |x| x.ln(), cuda "log($0)",
        grad |d, x, y, g| d.div(g, x).map(Some);
    Log10 "log10" [] "Returns element-wise base-10 logarithmic value of the input." => |x| x.log10(), cuda "log10($0)",
        grad |d, x, y, g| { let t = d.scalar("_mul_scalar", x, std::f64::consts::LN_10)?; d.div(g, &t) }.map(Some);
    Log2 "log2" [] "Returns element-wise base-2 logarithmic value of the input." => |x| x.log2(), cuda "log2($0)",
        grad |d, x, y, g| { let t = d.scalar("_mul_scalar", x, std::f64::consts::LN_2)?; d.div(g, &t) }.map(Some);
    Log1p "log1p" [] "Returns element-wise log(1 + x)." => |x| x.ln_1p(), cuda "log1p($0)",
        grad |d, x, y, g| { let t = d.scalar("_plus_scalar", x, 1.0)?; d.div(g, &t) }.map(Some);
    Sin "sin" [] "Computes the element-wise sine of the input array." => |x| x.sin(), cuda "sin($0)",
        grad |d, x, y, g| { let t = d.unary("cos", x)?; d.mul(g, &t) }.map(Some);
    Cos "cos" [] "Computes the element-wise cosine of the input array." => |x| x.cos(), cuda "cos($0)",
        grad |d, x, y, g| { let t = d.unary("sin", x)?; let t = d.negative(&t)?; d.mul(g, &t) }.map(Some);
    Tan "tan" [] "Computes the element-wise tangent of the input array." => |x| x.tan(), cuda "tan($0)",
        grad |d, x, y, g| { let t = d.unary("square", y)?; let t = d.scalar("_plus_scalar", &t, 1.0)?; d.mul(g, &t) }.map(Some);
    Arcsin "arcsin" [] "Returns element-wise inverse sine of the input array." => |x| x.asin(), cuda "asin($0)",
        grad |d, x, y, g| { let t = d.unary("square", x)?; let t = d.scalar("_rminus_scalar", &t, 1.0)?; let t = d.unary("rsqrt", &t)?; d.mul(g, &t) }.map(Some);
    Arccos "arccos" [] "Returns element-wise inverse cosine of the input array." => |x| x.acos(), cuda "acos($0)",
        grad |d, x, y, g| { let t = d.unary("square", x)?; let t = d.scalar("_rminus_scalar", &t, 1.0)?; let t = d.unary("rsqrt", &t)?; let t = d.negative(&t)?; d.mul(g, &t) }.map(Some);
    Arctan "arctan" [] "Returns element-wise inverse tangent of the input array." => |x| x.atan(), cuda "atan($0)",
        grad |d, x, y, g| { let t = d.unary("square", x)?; let t = d.scalar("_plus_scalar", &t, 1.0)?; d.div(g, &t) }.map(Some);
    Sinh "sinh" [] "Returns the hyperbolic sine of the input array, computed element-wise." => |x| x.sinh(), cuda "sinh($0)",
        grad |d, x, y, g| { let t = d.unary("cosh", x)?; d.mul(g, &t) }.map(Some);
    Cosh "cosh" [] "Returns the hyperbolic cosine of the input array, computed element-wise." => |x| x.cosh(), cuda "cosh($0)",
        grad |d, x, y, g| { let t = d.unary("sinh", x)?; d.mul(g, &t) }.map(Some);
    Tanh "tanh" [] "Returns the hyperbolic tangent of the input array, computed element-wise." => |x| x.tanh(), cuda "tanh($0)",
        grad |d, x, y, g| { let t = d.unary("square", y)?; let t = d.scalar("_rminus_scalar", &t, 1.0)?; d.mul(g, &t) }.map(Some), f32 crate::backend::cpu::fast_math::tanh_f32, grain TRANSCENDENTAL_GRAIN;
    Arcsinh "arcsinh" [] "Returns the element-wise inverse hyperbolic sine of the input array." => |x| x.asinh(), cuda "asinh($0)",
        grad |d, x, y, g| { let t = d.unary("square", x)?; let t = d.scalar("_plus_scalar", &t, 1.0)?; let t = d.unary("rsqrt", &t)?; d.mul(g, &t) }.map(Some);
    Arccosh "arccosh" [] "Returns the element-wise inverse hyperbolic cosine of the input array." => |x| x.acosh(), cuda "acosh($0)",
        grad |d, x, y, g| { let t = d.unary("square", x)?; let t = d.scalar("_minus_scalar", &t, 1.0)?; let t = d.unary("rsqrt", &t)?; d.mul(g, &t) }.map(Some);
    Arctanh "arctanh" [] "Returns the element-wise inverse hyperbolic tangent of the input array." => |x| x.atanh(), cuda "atanh($0)",
        grad |d, x, y, g| { let t = d.unary("square", x)?; let t = d.scalar("_rminus_scalar", &t, 1.0)?; d.div(g, &t) }.map(Some);
    Degrees "degrees" [] "Converts each element of the input array from radians to degrees." => |x| x.to_degrees(), cuda "$0 * 57.29577951308232",
        grad |d, x, y, g| d.scalar("_mul_scalar", g, 180.0 / std::f64::consts::PI).map(Some);
    Radians "radians" [] "Converts each element of the input array from degrees to radians." => |x| x.to_radians(), cuda "$0 * 0.017453292519943295",
        grad |d, x, y, g| d.scalar("_mul_scalar", g, std::f64::consts::PI / 180.0).map(Some);
    Sigmoid "sigmoid" [] "Computes sigmoid of x element-wise: 1 / (1 + exp(-x))." => |x| F::one() / (F::one() + (-x).exp()), cuda "1 / (1 + exp(-$0))",
        grad |d, x, y, g| { let t = d.scalar("_rminus_scalar", y, 1.0)?; let t = d.mul(y, &t)?; d.mul(g, &t) }.map(Some), f32 crate::backend::cpu::fast_math::sigmoid_f32, grain TRANSCENDENTAL_GRAIN;
    Relu "relu" [] "Computes rectified linear activation: max(x, 0); NaN stays NaN." => |x| if x > F::zero() || x.is_nan() { x } else { F::zero() }, cuda "($0 > 0 || $0 != $0) ? $0 : 0",
        grad |d, x, y, g| d.binary("_backward_relu", g, y).map(Some);
    Softsign "softsign" [] "Computes softsign of x element-wise: x / (1 + abs(x))." => |x| x / (F::one() + x.abs()), cuda "$0 / (1 + fabs($0))",
        grad |d, x, y, g| { let t = d.unary("abs", x)?; let t = d.scalar("_plus_scalar", &t, 1.0)?; let t = d.unary("square", &t)?; d.div(g, &t) }.map(Some);
    Reciprocal "reciprocal" [] "Returns the reciprocal of the argument, element-wise." => |x| F::one() / x, cuda "1 / $0",
        grad |d, x, y, g| { let t = d.unary("square", y)?; let t = d.negative(&t)?; d.mul(g, &t) }.map(Some);
    Negative "negative" [] "Numerical negative of the argument, element-wise." => |x| -x, cuda "-$0",
        grad |d, x, y, g| d.negative(g).map(Some);
    LogicalNot "logical_not" [] "Returns the result of logical NOT (!) function: 1 where x is 0, else 0." =>
        |x| if x == F::zero() { F::one() } else { F::zero() }, cuda "$0 == 0",
        grad |d, x, y, g| Ok(None);
    Erf "erf" [] "Returns element-wise Gauss error function of the input." => |x| via_f64(x, libm::erf), cuda "erf($0)",
        grad |d, x, y, g| { let t = d.unary("square", x)?; let t = d.scalar("_mul_scalar", &t, -1.0)?; let t = d.unary("exp", &t)?; let t = d.scalar("_mul_scalar", &t, std::f64::consts::FRAC_2_SQRT_PI)?; d.mul(g, &t) }.map(Some);
    Erfinv "erfinv" [] "Returns element-wise inverse Gauss error function of the input." => |x| via_f64(x, erfinv), cuda "erfinv($0)",
        grad |d, x, y, g| { let t = d.unary("square", y)?; let t = d.unary("exp", &t)?; let t = d.scalar("_mul_scalar", &t, std::f64::consts::PI.sqrt() / 2.0)?; d.mul(g, &t) }.map(Some);
    Gamma "gamma" [] "Returns the gamma function (extension of the factorial) of the input, element-wise." => |x| via_f64(x, libm::tgamma), cuda "tgamma($0)",
        grad |d, x, y, g| { let t = d.unary("_digamma", x)?; let t = d.mul(y, &t)?; d.mul(g, &t) }.map(Some);
    Gammaln "gammaln" [] "Returns element-wise log of the absolute value of the gamma function of the input." => |x| via_f64(x, libm::lgamma), cuda "lgamma($0)",
        grad |d, x, y, g| { let t = d.unary("_digamma", x)?; d.mul(g, &t) }.map(Some);
    IsNan "isnan" [] "Returns 1 where the input is NaN, else 0 (in the input dtype)." => |x| truth(x.is_nan()), cuda "isnan($0)",
        grad |d, x, y, g| Ok(None);
    IsInf "isinf" [] "Returns 1 where the input is infinite, else 0 (in the input dtype)." => |x| truth(x.is_infinite()), cuda "isinf($0)",
        grad |d, x, y, g| Ok(None);
    IsFinite "isfinite" [] "Returns 1 where the input is finite, else 0 (in the input dtype)." => |x| truth(x.is_finite()), cuda "isfinite($0)",
        grad |d, x, y, g| Ok(None);
    SoftRelu "_softrelu" [] "Computes log(1 + exp(x)) element-wise (Activation's softrelu)." =>
        |x| if x > lit(20.0) { x } else { x.exp().ln_1p() }, cuda "$0 > 20 ? $0 : log1p(exp($0))",
        grad |d, x, y, g| { let s = d.unary("sigmoid", x)?; d.mul(g, &s) }.map(Some);
    Digamma "_digamma" [] "Returns the digamma function (derivative of gammaln) of the input, element-wise." => |x| via_f64(x, digamma), cuda "ox_digamma($0)",
        grad |d, x, y, g| Err(crate::err!(Value, "the gradient of _digamma (second derivative of gamma/gammaln) is not implemented"));
    Identity "_copy" ["identity"] "Returns a copy of the input." => |x| x, cuda "$0",
        grad |d, x, y, g| Ok(Some(g.clone()));
    BlockGrad "BlockGrad" ["stop_gradient"] "Returns a copy of the input; no gradient flows back through it." => |x| x, cuda "$0",
        grad |d, x, y, g| Ok(None);
}
