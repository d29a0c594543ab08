//! Element-wise binary math in its three MXNet forms: `broadcast_<op>` (NumPy broadcasting),
//! `elemwise_<op>` / `_<op>` (equal shapes) and `_<op>_scalar` / `_r<op>_scalar` (a scalar operand),
//! and `add_n`, the sum of any number of equal-shape arrays.

use crate::op::KernelArgs;
use std::marker::PhantomData;
use std::sync::Arc;

use half::{bf16, f16};
use num_traits::Float;

use super::broadcast::{broadcast_shape, map_args, truth, zip_args};
use super::grad::{Grad, InputGrads};
use super::params::{NoParams, UncheckedParams};
use super::{exactly, BlockKernel, Elementwise, ExecContext, OpDef, Operator, PARALLEL_GRAIN};
use crate::base::{unify_partial, Bool8, DType, Elem, PartialShape, Shape};
use crate::error::Result;
use crate::graph::Entry;

/// The math of one binary operator: once for floats, once exactly for integers.
pub trait BinaryMath: Send + Sync + 'static {
    fn float<F: Float>(a: F, b: F) -> F;
    fn int(a: i64, b: i64) -> i64;
    /// Both as one CUDA C++ expression over `$0` and `$1` (see [`Elementwise`]).
    const CUDA: &'static str;
    /// Gradients for `a` and `b` at the broadcast output shape (the caller sums them back down
    /// to each operand's shape), from output `y` and its gradient `g`.
    fn grad(d: &mut Grad, a: &Entry, b: &Entry, y: &Entry, g: &Entry) -> Result<(Option<Entry>, Option<Entry>)>;
    /// Gradient for `x` in `x op s` (or `s op x` when `reverse`).
    fn scalar_grad(d: &mut Grad, x: &Entry, y: &Entry, g: &Entry, s: f64, reverse: bool) -> Result<Option<Entry>>;
}

fn apply_zip<M: BinaryMath>(args: &KernelArgs) -> Result<()> {
    match args.input_dtype(0)? {
        DType::F32 => zip_args(args, M::float::<f32>),
        DType::F64 => zip_args(args, M::float::<f64>),
        DType::F16 => zip_args(args, |x: f16, y: f16| f16::from_f32(M::float(x.to_f32(), y.to_f32()))),
        DType::BF16 => zip_args(args, |x: bf16, y: bf16| bf16::from_f32(M::float(x.to_f32(), y.to_f32()))),
        DType::U8 => zip_args(args, int_path::<M, u8>),
        DType::I8 => zip_args(args, int_path::<M, i8>),
        DType::I32 => zip_args(args, int_path::<M, i32>),
        DType::I64 => zip_args(args, int_path::<M, i64>),
        DType::Bool => zip_args(args, int_path::<M, Bool8>),
    }
}

#[inline(always)]
fn int_path<M: BinaryMath, T: Elem>(a: T, b: T) -> T {
    T::from_i64(M::int(a.to_i64(), b.to_i64()))
}

/// `x op s` (or `s op x` when reversed). The scalar is cast to the array's dtype first, as MXNet does.
fn apply_scalar<M: BinaryMath>(args: &KernelArgs, s: f64, reverse: bool) -> Result<()> {
    macro_rules! run {
        ($t:ty, $conv:expr, $back:expr, $f:expr) => {{
            let sv = $conv(<$t as Elem>::from_f64(s));
            if reverse {
                map_args(args, PARALLEL_GRAIN, |v: $t| $back($f(sv, $conv(v))))
            } else {
                map_args(args, PARALLEL_GRAIN, |v: $t| $back($f($conv(v), sv)))
            }
        }};
    }
    match args.input_dtype(0)? {
        DType::F32 => run!(f32, |v: f32| v, |v: f32| v, M::float::<f32>),
        DType::F64 => run!(f64, |v: f64| v, |v: f64| v, M::float::<f64>),
        DType::F16 => run!(f16, |v: f16| v.to_f32(), f16::from_f32, M::float::<f32>),
        DType::BF16 => run!(bf16, |v: bf16| v.to_f32(), bf16::from_f32, M::float::<f32>),
        DType::U8 => run!(u8, Elem::to_i64, <u8 as Elem>::from_i64, M::int),
        DType::I8 => run!(i8, Elem::to_i64, <i8 as Elem>::from_i64, M::int),
        DType::I32 => run!(i32, Elem::to_i64, <i32 as Elem>::from_i64, M::int),
        DType::I64 => run!(i64, Elem::to_i64, <i64 as Elem>::from_i64, M::int),
        DType::Bool => run!(Bool8, Elem::to_i64, <Bool8 as Elem>::from_i64, M::int),
    }
}

struct Binary<M> {
    name: &'static str,
    broadcast: bool,
    _m: PhantomData<M>,
}

impl<M: BinaryMath> Operator for Binary<M> {
    fn input_names(&self) -> Vec<String> {
        vec!["lhs".into(), "rhs".into()]
    }
    /// Element-wise only where both operands have the output's shape (the fusion pass checks).
    fn elementwise(&self) -> Option<Elementwise> {
        Some(Elementwise {
            kernel: Arc::new(|out: &mut [f32], inputs: &[&[f32]]| {
                crate::backend::cpu::simd::vectorized(
                    #[inline(always)]
                    || {
                        if let [a, b] = inputs {
                            for ((o, &a), &b) in out.iter_mut().zip(*a).zip(*b) {
                                *o = M::float(a, b);
                            }
                        }
                    },
                )
            }),
            cuda_expr: M::CUDA.to_string(),
            scalar: None,
        })
    }
    fn num_inputs(&self) -> usize {
        2
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [a, b] = exactly(self.name, "input", inputs)?;
        if self.broadcast {
            return Ok(vec![broadcast_shape(self.name, a, b)?]);
        }
        if a != b {
            crate::bail!(Shape, "{}: operands must have the same shape, got {a} and {b} (use broadcast_* to broadcast)", self.name);
        }
        Ok(vec![a.clone()])
    }
    /// The equal-shape form makes both operands and the output agree; the broadcasting form
    /// needs both operands' shapes in full.
    fn infer_partial_shapes(&self, inputs: &mut [Option<PartialShape>], outputs: &mut [Option<PartialShape>]) -> Result<()> {
        if !self.broadcast {
            unify_partial(inputs, outputs)?;
        }
        Ok(())
    }
    fn inplace_pairs(&self) -> &[(usize, usize)] {
        &[(0, 0), (1, 0)]
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        apply_zip::<M>(args)
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (a, b, y, g) = (d.input(0), d.input(1), d.output(0), d.out_grad(0));
        let (ga, gb) = M::grad(d, &a, &b, &y, &g)?;
        if !self.broadcast {
            return Ok(vec![ga, gb]);
        }
        // An operand already of the output's shape was not broadcast: nothing to sum.
        let (a_full, b_full) = (d.known_same_shape(&a, &y), d.known_same_shape(&b, &y));
        let ga = ga.map(|e| if a_full { Ok(e) } else { d.sum_to_like(&e, &a) }).transpose()?;
        let gb = gb.map(|e| if b_full { Ok(e) } else { d.sum_to_like(&e, &b) }).transpose()?;
        Ok(vec![ga, gb])
    }
}

crate::op_params! {
    /// `is_int` only records how Python spelled the scalar; the value itself decides.
    #[allow(dead_code)]
    pub struct ScalarParams {
        /// Scalar input value.
        scalar: f64 = 1.0,
        /// Whether the scalar was given as an integer (accepted for compatibility).
        is_int: bool = true,
    }
}

struct Scalar<M> {
    scalar: f64,
    reverse: bool,
    _m: PhantomData<M>,
}

impl<M: BinaryMath> Operator for Scalar<M> {
    fn num_inputs(&self) -> usize {
        1
    }
    fn elementwise(&self) -> Option<Elementwise> {
        let s = self.scalar as f32;
        let kernel: BlockKernel = if self.reverse {
            Arc::new(move |out: &mut [f32], inputs: &[&[f32]]| {
                crate::backend::cpu::simd::vectorized(
                    #[inline(always)]
                    || {
                        if let [xs] = inputs {
                            for (o, &x) in out.iter_mut().zip(*xs) {
                                *o = M::float(s, x);
                            }
                        }
                    },
                )
            })
        } else {
            Arc::new(move |out: &mut [f32], inputs: &[&[f32]]| {
                crate::backend::cpu::simd::vectorized(
                    #[inline(always)]
                    || {
                        if let [xs] = inputs {
                            for (o, &x) in out.iter_mut().zip(*xs) {
                                *o = M::float(x, s);
                            }
                        }
                    },
                )
            })
        };
        let operands = if self.reverse { ["$s", "$0"] } else { ["$0", "$s"] };
        Some(Elementwise { kernel, cuda_expr: super::substitute_cuda(M::CUDA, &operands, "$s"), scalar: Some(self.scalar) })
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [x] = exactly("scalar operator", "input", inputs)?;
        Ok(vec![x.clone()])
    }
    fn inplace_pairs(&self) -> &[(usize, usize)] {
        &[(0, 0)]
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        apply_scalar::<M>(args, self.scalar, self.reverse)
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (x, y, g) = (d.input(0), d.output(0), d.out_grad(0));
        Ok(vec![M::scalar_grad(d, &x, &y, &g, self.scalar, self.reverse)?])
    }
}

/// Floor modulo with the sign of the divisor, and 0 for a zero divisor (MXNet's `mod`).
#[inline(always)]
fn floor_mod<F: Float>(a: F, b: F) -> F {
    if b == F::zero() {
        return F::zero();
    }
    let r = a % b;
    if r != F::zero() && ((r < F::zero()) != (b < F::zero())) {
        r + b
    } else {
        r
    }
}

fn int_floor_mod(a: i64, b: i64) -> i64 {
    if b == 0 {
        return 0;
    }
    let r = a.wrapping_rem(b);
    if r != 0 && ((r < 0) != (b < 0)) {
        r + b
    } else {
        r
    }
}

fn int_pow(a: i64, b: i64) -> i64 {
    if b < 0 {
        return (a as f64).powf(b as f64) as i64;
    }
    a.wrapping_pow(b.min(u32::MAX as i64) as u32)
}

/// Declare binary operators: math, then the names of each registered form.
macro_rules! binary_ops {
    ($( $ty:ident { float: |$a:ident, $b:ident| $fbody:expr, int: |$ia:ident, $ib:ident| $ibody:expr, cuda: $cuda:literal }
        grad: |$gd:ident, $ga:ident, $gb:ident, $gy:ident, $gg:ident| $gbody:expr,
        scalar_grad: |$sd:ident, $sx:ident, $sy:ident, $sg:ident, $ss:ident, $srev:ident| $sbody:expr,
        broadcast: $bname:literal [$($balias:literal),*],
        elemwise: $ename:literal [$($ealias:literal),*],
        scalar: $sname:literal [$($salias:literal),*],
        rscalar: $rname:tt,
        doc: $doc:literal; )*) => {
        $(
            struct $ty;
            impl BinaryMath for $ty {
                #[inline(always)]
                fn float<F: Float>($a: F, $b: F) -> F { $fbody }
                #[inline(always)]
                fn int($ia: i64, $ib: i64) -> i64 { $ibody }
                const CUDA: &'static str = $cuda;
                #[allow(unused_variables)]
                fn grad($gd: &mut Grad, $ga: &Entry, $gb: &Entry, $gy: &Entry, $gg: &Entry) -> Result<(Option<Entry>, Option<Entry>)> {
                    $gbody
                }
                #[allow(unused_variables)]
                fn scalar_grad($sd: &mut Grad, $sx: &Entry, $sy: &Entry, $sg: &Entry, $ss: f64, $srev: bool) -> Result<Option<Entry>> {
                    $sbody
                }
            }
        )*
        fn register_table(add: &mut dyn FnMut(OpDef)) {
            $(
                add(OpDef::new($bname, &[$($balias),*], concat!($doc, " With NumPy-style broadcasting."),
                    |_: UncheckedParams| Ok(Binary::<$ty> { name: $bname, broadcast: true, _m: PhantomData })));
                add(OpDef::new($ename, &[$($ealias),*], concat!($doc, " Both inputs must have the same shape."),
                    |_: UncheckedParams| Ok(Binary::<$ty> { name: $ename, broadcast: false, _m: PhantomData })));
                add(OpDef::new($sname, &[$($salias),*], concat!($doc, " The right operand is a scalar."),
                    |p: ScalarParams| Ok(Scalar::<$ty> { scalar: p.scalar, reverse: false, _m: PhantomData })));
                binary_ops!(@reverse add, $ty, $rname, $doc);
            )*
        }
    };
    (@reverse $add:ident, $ty:ident, none, $doc:literal) => {};
    (@reverse $add:ident, $ty:ident, $rname:literal, $doc:literal) => {
        $add(OpDef::new($rname, legacy_reverse_aliases($rname), concat!($doc, " The left operand is a scalar."),
            |p: ScalarParams| Ok(Scalar::<$ty> { scalar: p.scalar, reverse: true, _m: PhantomData })));
    };
}

/// The pre-1.0 names of the reversed scalar operators, which old Symbol JSON files use.
fn legacy_reverse_aliases(name: &str) -> &'static [&'static str] {
    match name {
        "_rminus_scalar" => &["_RMinusScalar"],
        "_rdiv_scalar" => &["_RDivScalar"],
        "_rmod_scalar" => &["_RModScalar"],
        "_rpower_scalar" => &["_RPowerScalar"],
        _ => &[],
    }
}

binary_ops! {
    Add { float: |a, b| a + b, int: |a, b| a.wrapping_add(b), cuda: "$0 + $1" }
        grad: |d, a, b, y, g| Ok((Some(g.clone()), Some(g.clone()))),
        scalar_grad: |d, x, y, g, s, rev| Ok(Some(g.clone())),
        broadcast: "broadcast_add" ["broadcast_plus"], elemwise: "elemwise_add" ["_plus", "_Plus", "_add", "_grad_add"],
        scalar: "_plus_scalar" ["_PlusScalar"], rscalar: none, doc: "Adds arguments element-wise.";
    Sub { float: |a, b| a - b, int: |a, b| a.wrapping_sub(b), cuda: "$0 - $1" }
        grad: |d, a, b, y, g| { let n = d.negative(g)?; Ok((Some(g.clone()), Some(n))) },
        scalar_grad: |d, x, y, g, s, rev| if rev { d.negative(g).map(Some) } else { Ok(Some(g.clone())) },
        broadcast: "broadcast_sub" ["broadcast_minus"], elemwise: "elemwise_sub" ["_minus", "_Minus", "_sub"],
        scalar: "_minus_scalar" ["_MinusScalar"], rscalar: "_rminus_scalar", doc: "Subtracts arguments element-wise.";
    Mul { float: |a, b| a * b, int: |a, b| a.wrapping_mul(b), cuda: "$0 * $1" }
        grad: |d, a, b, y, g| { let ga = d.binary("broadcast_mul", g, b)?; let gb = d.binary("broadcast_mul", g, a)?; Ok((Some(ga), Some(gb))) },
        scalar_grad: |d, x, y, g, s, rev| d.scalar("_mul_scalar", g, s).map(Some),
        broadcast: "broadcast_mul" [], elemwise: "elemwise_mul" ["_mul", "_Mul"],
        scalar: "_mul_scalar" ["_MulScalar"], rscalar: none, doc: "Multiplies arguments element-wise.";
    Div { float: |a, b| a / b, int: |a, b| if b == 0 { 0 } else { a.wrapping_div(b) }, cuda: "ox_div($0, $1)" }
        grad: |d, a, b, y, g| { let ga = d.binary("broadcast_div", g, b)?; let t = d.binary("broadcast_div", y, b)?; let t = d.binary("broadcast_mul", g, &t)?; let gb = d.negative(&t)?; Ok((Some(ga), Some(gb))) },
        scalar_grad: |d, x, y, g, s, rev| if rev { let t = d.div(y, x)?; let t = d.negative(&t)?; d.mul(g, &t).map(Some) } else { d.scalar("_div_scalar", g, s).map(Some) },
        broadcast: "broadcast_div" [], elemwise: "elemwise_div" ["_div", "_Div"],
        scalar: "_div_scalar" ["_DivScalar"], rscalar: "_rdiv_scalar", doc: "Divides arguments element-wise.";
    Mod { float: |a, b| floor_mod(a, b), int: |a, b| int_floor_mod(a, b), cuda: "ox_mod($0, $1)" }
        grad: |d, a, b, y, g| { let q = d.binary("broadcast_div", a, b)?; let q = d.unary("floor", &q)?; let t = d.binary("broadcast_mul", g, &q)?; let gb = d.negative(&t)?; Ok((Some(g.clone()), Some(gb))) },
        scalar_grad: |d, x, y, g, s, rev| if rev { let q = d.scalar("_rdiv_scalar", x, s)?; let q = d.unary("floor", &q)?; let t = d.mul(g, &q)?; d.negative(&t).map(Some) } else { Ok(Some(g.clone())) },
        broadcast: "broadcast_mod" [], elemwise: "_mod" ["_Mod"],
        scalar: "_mod_scalar" ["_ModScalar"], rscalar: "_rmod_scalar", doc: "Element-wise modulo, with the sign of the divisor.";
    Power { float: |a, b| a.powf(b), int: |a, b| int_pow(a, b), cuda: "ox_power($0, $1)" }
        grad: |d, a, b, y, g| { let bm1 = d.scalar("_minus_scalar", b, 1.0)?; let t = d.binary("broadcast_power", a, &bm1)?; let t = d.binary("broadcast_mul", &t, b)?; let ga = d.binary("broadcast_mul", g, &t)?; let la = d.unary("log", a)?; let t = d.binary("broadcast_mul", y, &la)?; let gb = d.binary("broadcast_mul", g, &t)?; Ok((Some(ga), Some(gb))) },
        scalar_grad: |d, x, y, g, s, rev| if rev { let t = d.scalar("_mul_scalar", y, s.ln())?; d.mul(g, &t).map(Some) } else { let t = d.scalar("_power_scalar", x, s - 1.0)?; let t = d.scalar("_mul_scalar", &t, s)?; d.mul(g, &t).map(Some) },
        broadcast: "broadcast_power" [], elemwise: "_power" ["_Power"],
        scalar: "_power_scalar" ["_PowerScalar"], rscalar: "_rpower_scalar", doc: "First array elements raised to powers from the second, element-wise.";
    Maximum { float: |a, b| if a.is_nan() || a > b { a } else { b }, int: |a, b| a.max(b), cuda: "ox_maximum($0, $1)" }
        grad: |d, a, b, y, g| { let m = d.binary("broadcast_greater_equal", a, b)?; let ga = d.binary("broadcast_mul", g, &m)?; let m = d.binary("broadcast_lesser", a, b)?; let gb = d.binary("broadcast_mul", g, &m)?; Ok((Some(ga), Some(gb))) },
        scalar_grad: |d, x, y, g, s, rev| { let m = d.scalar("_greater_equal_scalar", x, s)?; d.mul(g, &m).map(Some) },
        broadcast: "broadcast_maximum" [], elemwise: "_maximum" ["_Maximum"],
        scalar: "_maximum_scalar" ["_MaximumScalar"], rscalar: none, doc: "Element-wise maximum of the arguments.";
    Minimum { float: |a, b| if a.is_nan() || a < b { a } else { b }, int: |a, b| a.min(b), cuda: "ox_minimum($0, $1)" }
        grad: |d, a, b, y, g| { let m = d.binary("broadcast_lesser_equal", a, b)?; let ga = d.binary("broadcast_mul", g, &m)?; let m = d.binary("broadcast_greater", a, b)?; let gb = d.binary("broadcast_mul", g, &m)?; Ok((Some(ga), Some(gb))) },
        scalar_grad: |d, x, y, g, s, rev| { let m = d.scalar("_lesser_equal_scalar", x, s)?; d.mul(g, &m).map(Some) },
        broadcast: "broadcast_minimum" [], elemwise: "_minimum" ["_Minimum"],
        scalar: "_minimum_scalar" ["_MinimumScalar"], rscalar: none, doc: "Element-wise minimum of the arguments.";
    Hypot { float: |a, b| a.hypot(b), int: |a, b| (a as f64).hypot(b as f64) as i64, cuda: "ox_hypot($0, $1)" }
        grad: |d, a, b, y, g| { let t = d.binary("broadcast_div", a, y)?; let ga = d.binary("broadcast_mul", g, &t)?; let t = d.binary("broadcast_div", b, y)?; let gb = d.binary("broadcast_mul", g, &t)?; Ok((Some(ga), Some(gb))) },
        scalar_grad: |d, x, y, g, s, rev| { let t = d.div(x, y)?; d.mul(g, &t).map(Some) },
        broadcast: "broadcast_hypot" [], elemwise: "_hypot" ["_Hypot"],
        scalar: "_hypot_scalar" ["_HypotScalar"], rscalar: none, doc: "Element-wise sqrt(lhs^2 + rhs^2).";
    Equal { float: |a, b| truth(a == b), int: |a, b| (a == b) as i64, cuda: "$0 == $1" }
        grad: |d, a, b, y, g| Ok((None, None)),
        scalar_grad: |d, x, y, g, s, rev| Ok(None),
        broadcast: "broadcast_equal" [], elemwise: "_equal" ["_Equal"],
        scalar: "_equal_scalar" ["_EqualScalar"], rscalar: none, doc: "Returns 1 where lhs == rhs, else 0 (in the input dtype).";
    NotEqual { float: |a, b| truth(a != b), int: |a, b| (a != b) as i64, cuda: "$0 != $1" }
        grad: |d, a, b, y, g| Ok((None, None)),
        scalar_grad: |d, x, y, g, s, rev| Ok(None),
        broadcast: "broadcast_not_equal" [], elemwise: "_not_equal" ["_Not_Equal"],
        scalar: "_not_equal_scalar" ["_NotEqualScalar"], rscalar: none, doc: "Returns 1 where lhs != rhs, else 0 (in the input dtype).";
    Greater { float: |a, b| truth(a > b), int: |a, b| (a > b) as i64, cuda: "$0 > $1" }
        grad: |d, a, b, y, g| Ok((None, None)),
        scalar_grad: |d, x, y, g, s, rev| Ok(None),
        broadcast: "broadcast_greater" [], elemwise: "_greater" ["_Greater"],
        scalar: "_greater_scalar" ["_GreaterScalar"], rscalar: none, doc: "Returns 1 where lhs > rhs, else 0 (in the input dtype).";
    GreaterEqual { float: |a, b| truth(a >= b), int: |a, b| (a >= b) as i64, cuda: "$0 >= $1" }
        grad: |d, a, b, y, g| Ok((None, None)),
        scalar_grad: |d, x, y, g, s, rev| Ok(None),
        broadcast: "broadcast_greater_equal" [], elemwise: "_greater_equal" ["_Greater_Equal"],
        scalar: "_greater_equal_scalar" ["_GreaterEqualScalar"], rscalar: none, doc: "Returns 1 where lhs >= rhs, else 0 (in the input dtype).";
    Lesser { float: |a, b| truth(a < b), int: |a, b| (a < b) as i64, cuda: "$0 < $1" }
        grad: |d, a, b, y, g| Ok((None, None)),
        scalar_grad: |d, x, y, g, s, rev| Ok(None),
        broadcast: "broadcast_lesser" [], elemwise: "_lesser" ["_Lesser"],
        scalar: "_lesser_scalar" ["_LesserScalar"], rscalar: none, doc: "Returns 1 where lhs < rhs, else 0 (in the input dtype).";
    LesserEqual { float: |a, b| truth(a <= b), int: |a, b| (a <= b) as i64, cuda: "$0 <= $1" }
        grad: |d, a, b, y, g| Ok((None, None)),
        scalar_grad: |d, x, y, g, s, rev| Ok(None),
        broadcast: "broadcast_lesser_equal" [], elemwise: "_lesser_equal" ["_Lesser_Equal"],
        scalar: "_lesser_equal_scalar" ["_LesserEqualScalar"], rscalar: none, doc: "Returns 1 where lhs <= rhs, else 0 (in the input dtype).";
    LogicalAnd { float: |a, b| truth(a != F::zero() && b != F::zero()), int: |a, b| (a != 0 && b != 0) as i64, cuda: "$0 != 0 && $1 != 0" }
        grad: |d, a, b, y, g| Ok((None, None)),
        scalar_grad: |d, x, y, g, s, rev| Ok(None),
        broadcast: "broadcast_logical_and" [], elemwise: "_logical_and" ["_Logical_And"],
        scalar: "_logical_and_scalar" ["_LogicalAndScalar"], rscalar: none, doc: "Returns 1 where both operands are non-zero, else 0.";
    LogicalOr { float: |a, b| truth(a != F::zero() || b != F::zero()), int: |a, b| (a != 0 || b != 0) as i64, cuda: "$0 != 0 || $1 != 0" }
        grad: |d, a, b, y, g| Ok((None, None)),
        scalar_grad: |d, x, y, g, s, rev| Ok(None),
        broadcast: "broadcast_logical_or" [], elemwise: "_logical_or" ["_Logical_Or"],
        scalar: "_logical_or_scalar" ["_LogicalOrScalar"], rscalar: none, doc: "Returns 1 where either operand is non-zero, else 0.";
    LogicalXor { float: |a, b| truth((a != F::zero()) != (b != F::zero())), int: |a, b| ((a != 0) != (b != 0)) as i64, cuda: "($0 != 0) != ($1 != 0)" }
        grad: |d, a, b, y, g| Ok((None, None)),
        scalar_grad: |d, x, y, g, s, rev| Ok(None),
        broadcast: "broadcast_logical_xor" [], elemwise: "_logical_xor" ["_Logical_Xor"],
        scalar: "_logical_xor_scalar" ["_LogicalXorScalar"], rscalar: none, doc: "Returns 1 where exactly one operand is non-zero, else 0.";
}

/// The gradient of relu from its output: `ograd` where `y > 0`, else 0, in one pass (MXNet's
/// `_backward_relu`) instead of a comparison and a product with an intermediate array between.
/// A NaN output gives a NaN gradient, as MXNet's (the NaN is not silently masked to 0).
struct ReluGrad;

impl BinaryMath for ReluGrad {
    #[inline(always)]
    fn float<F: Float>(g: F, y: F) -> F {
        if y > F::zero() {
            g
        } else if y.is_nan() {
            y
        } else {
            F::zero()
        }
    }
    #[inline(always)]
    fn int(g: i64, y: i64) -> i64 {
        if y > 0 {
            g
        } else {
            0
        }
    }
    const CUDA: &'static str = "($1 > 0 ? $0 : ($1 != $1 ? $1 : 0))";
    fn grad(d: &mut Grad, _g: &Entry, y: &Entry, _out: &Entry, gg: &Entry) -> Result<(Option<Entry>, Option<Entry>)> {
        Ok((Some(d.binary("_backward_relu", gg, y)?), None))
    }
    fn scalar_grad(_d: &mut Grad, _x: &Entry, _y: &Entry, _g: &Entry, _s: f64, _reverse: bool) -> Result<Option<Entry>> {
        Ok(None)
    }
}

crate::op_params! {
    pub struct AddNParams {
        /// Number of inputs to add.
        num_args: usize,
    }
}

/// add_n: the sum of its inputs, added pairwise into the output by `elemwise_add`'s kernel.
struct AddN {
    num_args: usize,
}

impl Operator for AddN {
    fn input_names(&self) -> Vec<String> {
        (0..self.num_args).map(|i| format!("arg{i}")).collect()
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let first = super::first_input("add_n", inputs)?;
        if let Some(bad) = inputs.iter().find(|s| *s != first) {
            crate::bail!(Shape, "add_n: all inputs must have the same shape, got {first} and {bad}");
        }
        Ok(vec![first.clone()])
    }
    fn inplace_pairs(&self) -> &[(usize, usize)] {
        &[(0, 0)]
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let inputs = args.inputs();
        let [out] = exactly("add_n", "output", args.outputs())?;
        let add = super::lookup("elemwise_add")?.instantiate("elemwise_add", &Default::default())?;
        match inputs {
            [] => crate::bail!(Value, "add_n needs at least one input"),
            [_] => super::shape_ops::copy_args(args)?,
            [first, second, rest @ ..] => {
                // Accumulate pairwise into the output: out = a + b, then out += c, ...
                let add = add.as_ref();
                let ctx = ExecContext::default();
                args.delegate(add, &[first.clone(), second.clone()], std::slice::from_ref(out), |pair| add.forward(&ctx, pair))?;
                for x in rest {
                    args.delegate(add, &[out.clone(), x.clone()], std::slice::from_ref(out), |pair| add.forward(&ctx, pair))?;
                }
            }
        }
        Ok(())
    }
    /// Pairwise element-wise additions into the output, as on the CPU.
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, ctx: &ExecContext, inputs: &[super::Tensor], outputs: &[super::Tensor]) -> Result<()> {
        let [out] = exactly("add_n", "output", outputs)?;
        let add = super::lookup("elemwise_add")?.instantiate("elemwise_add", &Default::default())?;
        match inputs {
            [] => crate::bail!(Value, "add_n needs at least one input"),
            [only] => crate::backend::cuda::kernels::copy_bytes(gpu, only, out),
            [first, second, rest @ ..] => {
                add.forward_gpu(gpu, ctx, &[first.clone(), second.clone()], std::slice::from_ref(out))?;
                for x in rest {
                    add.forward_gpu(gpu, ctx, &[out.clone(), x.clone()], std::slice::from_ref(out))?;
                }
                Ok(())
            }
        }
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let g = d.out_grad(0);
        Ok(vec![Some(g); self.num_args])
    }
}

pub(super) fn register(add: &mut dyn FnMut(OpDef)) {
    register_table(add);
    add(OpDef::new("add_n", &["ElementWiseSum", "_sparse_ElementWiseSum"], "Adds all input arguments element-wise.", |p: AddNParams| {
        Ok(AddN { num_args: p.num_args })
    })
    .variadic());
    add(OpDef::new("_backward_relu", &[], "Gradient of relu from its output gradient and output: ograd where y > 0, else 0.", |_: NoParams| {
        Ok(Binary::<ReluGrad> { name: "_backward_relu", broadcast: false, _m: PhantomData })
    }));
}
