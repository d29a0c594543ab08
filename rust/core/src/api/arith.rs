//! Arithmetic operators on arrays: `+ - * /` between arrays (with NumPy broadcasting, as
//! MXNet's `NDArray.__add__`), with `f64` scalars on either side, and unary `-`.
//!
//! Each operator's `Output` is `Result<NDArray>`: a shape mismatch is an error the caller
//! handles with `?`, never a panic, and never an array whose failure would only show later.
//! Chains read `((&a * &b)? + &c)?`; for brevity a `Result` on either side of an array is
//! accepted too, so `(&a * &b + &c)?` also works, the first error passing through. A scalar
//! needs an array on the other side (`((&a * &b)? + 1.0)?`): Rust only lets a crate implement
//! operators for types it defines, and neither `Result` nor `f64` is oxnet's.

use std::ops::{Add, Div, Mul, Neg, Sub};

use crate::error::Result;
use crate::ndarray::NDArray;
use crate::op::params::NoParams;
use crate::op::typed::ScalarParams;

use super::ops::call1;

#[track_caller]
fn scalar_op(op: &str, array: &NDArray, scalar: f64) -> Result<NDArray> {
    call1(op, &[array], &ScalarParams::new().scalar(scalar))
}

// Concrete impls rather than generic ones over `Borrow<NDArray>`: with exactly one impl that a
// float literal can match (`f64`), `&x * 2.0` resolves without a suffix and its result can be
// used at once (`(&x * 2.0)?`).
macro_rules! arithmetic {
    ($trait:ident, $method:ident, $broadcast:literal, $scalar:literal, $reversed_scalar:literal) => {
        arithmetic!(@arrays $trait, $method, $broadcast, &NDArray, |a| a; &NDArray, |b| b);
        arithmetic!(@arrays $trait, $method, $broadcast, &NDArray, |a| a; NDArray, |b| &b);
        arithmetic!(@arrays $trait, $method, $broadcast, NDArray, |a| &a; &NDArray, |b| b);
        arithmetic!(@arrays $trait, $method, $broadcast, NDArray, |a| &a; NDArray, |b| &b);
        arithmetic!(@arrays $trait, $method, $broadcast, &NDArray, |a| a; Result<NDArray>, |b| &b?);
        arithmetic!(@arrays $trait, $method, $broadcast, NDArray, |a| &a; Result<NDArray>, |b| &b?);
        arithmetic!(@arrays $trait, $method, $broadcast, Result<NDArray>, |a| &a?; &NDArray, |b| b);
        arithmetic!(@arrays $trait, $method, $broadcast, Result<NDArray>, |a| &a?; NDArray, |b| &b);
        impl $trait<f64> for &NDArray {
            type Output = Result<NDArray>;
            #[track_caller]
            fn $method(self, rhs: f64) -> Result<NDArray> {
                scalar_op($scalar, self, rhs)
            }
        }
        impl $trait<f64> for NDArray {
            type Output = Result<NDArray>;
            #[track_caller]
            fn $method(self, rhs: f64) -> Result<NDArray> {
                scalar_op($scalar, &self, rhs)
            }
        }
        impl $trait<&NDArray> for f64 {
            type Output = Result<NDArray>;
            #[track_caller]
            fn $method(self, rhs: &NDArray) -> Result<NDArray> {
                scalar_op($reversed_scalar, rhs, self)
            }
        }
        impl $trait<NDArray> for f64 {
            type Output = Result<NDArray>;
            #[track_caller]
            fn $method(self, rhs: NDArray) -> Result<NDArray> {
                scalar_op($reversed_scalar, &rhs, self)
            }
        }
    };
    (@arrays $trait:ident, $method:ident, $broadcast:literal, $lhs:ty, |$a:ident| $lhs_ref:expr; $rhs:ty, |$b:ident| $rhs_ref:expr) => {
        impl $trait<$rhs> for $lhs {
            type Output = Result<NDArray>;
            #[track_caller]
            fn $method(self, rhs: $rhs) -> Result<NDArray> {
                let ($a, $b) = (self, rhs);
                call1($broadcast, &[$lhs_ref, $rhs_ref], &NoParams)
            }
        }
    };
}

// Addition and multiplication commute: a scalar on the left uses the same operator.
arithmetic!(Add, add, "broadcast_add", "_plus_scalar", "_plus_scalar");
arithmetic!(Sub, sub, "broadcast_sub", "_minus_scalar", "_rminus_scalar");
arithmetic!(Mul, mul, "broadcast_mul", "_mul_scalar", "_mul_scalar");
arithmetic!(Div, div, "broadcast_div", "_div_scalar", "_rdiv_scalar");

impl Neg for &NDArray {
    type Output = Result<NDArray>;
    #[track_caller]
    fn neg(self) -> Result<NDArray> {
        call1("negative", &[self], &NoParams)
    }
}

impl Neg for NDArray {
    type Output = Result<NDArray>;
    #[track_caller]
    fn neg(self) -> Result<NDArray> {
        call1("negative", &[&self], &NoParams)
    }
}
