//! Constructors, conversions and views of [`NDArray`] for Rust callers.

use crate::base::{Context, DType, Elem, Shape};
use crate::error::Result;
use crate::ndarray::NDArray;
use crate::op::typed::{DotParams, FullParams, InitParams, ReduceParams, ReshapeParams, SliceAxisParams};
use crate::op::Params;

use super::ops::{self, call1};

fn dims_param(shape: &Shape) -> Vec<i64> {
    shape.dims().iter().map(|&d| d as i64).collect()
}

impl NDArray {
    /// A new array holding a copy of `data`, row-major, of the given shape.
    ///
    /// ```
    /// use oxnet::{Context, NDArray};
    /// let x = NDArray::from_slice(&[1i32, 2, 3, 4, 5, 6], [2, 3], Context::cpu(0))?;
    /// assert_eq!((x.shape().dims(), x.dtype()), (&[2, 3][..], oxnet::DType::I32));
    /// # Ok::<(), oxnet::Error>(())
    /// ```
    pub fn from_slice<T: Elem>(data: &[T], shape: impl Into<Shape>, ctx: Context) -> Result<NDArray> {
        NDArray::from_vec(shape.into(), data, ctx)
    }

    /// An array of zeros.
    #[track_caller]
    pub fn zeros(shape: impl Into<Shape>, dtype: DType, ctx: Context) -> Result<NDArray> {
        let params = InitParams::new().shape(dims_param(&shape.into())).dtype(Some(dtype)).ctx(Some(ctx));
        call1("_zeros", &[], &params)
    }

    /// An array of ones.
    #[track_caller]
    pub fn ones(shape: impl Into<Shape>, dtype: DType, ctx: Context) -> Result<NDArray> {
        let params = InitParams::new().shape(dims_param(&shape.into())).dtype(Some(dtype)).ctx(Some(ctx));
        call1("_ones", &[], &params)
    }

    /// An array with every element `value` (converted to `dtype`).
    #[track_caller]
    pub fn full(shape: impl Into<Shape>, value: f64, dtype: DType, ctx: Context) -> Result<NDArray> {
        let params = FullParams::new(value).shape(dims_param(&shape.into())).dtype(Some(dtype)).ctx(Some(ctx));
        call1("_full", &[], &params)
    }

    /// The one element of a one-element array (MXNet's `asscalar`); waits for pending writes.
    pub fn to_scalar<T: Elem>(&self) -> Result<T> {
        if self.size() != 1 {
            crate::bail!(Value, "The current array is not a scalar: it has shape {} ({} elements)", self.shape(), self.size());
        }
        let values = self.to_vec::<T>()?;
        values.into_iter().next().ok_or_else(|| crate::err!(Value, "The current array is not a scalar: it has no elements"))
    }

    /// The elements converted to `dtype` (MXNet's `astype`); a new array even when the dtype is
    /// already `dtype`.
    #[track_caller]
    pub fn astype(&self, dtype: DType) -> Result<NDArray> {
        ops::cast(self, dtype)
    }

    /// A new array with the same elements (MXNet's `copy`): later writes to either one leave
    /// the other unchanged.
    #[track_caller]
    pub fn deep_copy(&self) -> Result<NDArray> {
        call1("_copy", &[self], &crate::op::params::NoParams)
    }

    /// The array on `ctx` (MXNet's `as_in_context`): itself when it is there already, else a copy
    /// that the engine orders after pending writes of this array.
    ///
    /// ```
    /// # use oxnet::{Context, NDArray};
    /// let x = NDArray::from_slice(&[1f32, 2.], [2], Context::cpu(0))?;
    /// assert_eq!(x.to_context(Context::cpu(0))?.to_vec::<f32>()?, [1., 2.]);
    /// # Ok::<(), oxnet::Error>(())
    /// ```
    pub fn to_context(&self, ctx: Context) -> Result<NDArray> {
        if self.context() == ctx {
            return Ok(self.clone());
        }
        let copy = NDArray::empty(self.shape().clone(), self.dtype(), ctx)?;
        crate::imperative::copy(self, &copy, None)?;
        Ok(copy)
    }

    /// The same elements seen with another shape of the same size, sharing memory (writes
    /// through either are seen by both). Under [`crate::record`] the view is recorded, so
    /// gradients flow through it.
    pub fn reshape(&self, shape: impl Into<Shape>) -> Result<NDArray> {
        let view = self.reshape_view(shape.into())?;
        let attrs = ReshapeParams::new().shape(dims_param(view.shape())).to_attrs();
        crate::autograd::record_view("Reshape", &attrs, self, view)
    }

    /// Rows `begin..end` of the first axis, sharing memory (MXNet's `x[begin:end]`); recorded
    /// under [`crate::record`] like [`NDArray::reshape`].
    pub fn slice_rows(&self, begin: usize, end: usize) -> Result<NDArray> {
        let view = self.slice_view(begin, end)?;
        let attrs = SliceAxisParams::new(0, begin as i64, Some(end as i64)).to_attrs();
        crate::autograd::record_view("slice_axis", &attrs, self, view)
    }

    /// Matrix product (see [`ops::dot`] for transposed operands).
    #[track_caller]
    pub fn dot(&self, rhs: &NDArray) -> Result<NDArray> {
        ops::dot(self, rhs, DotParams::new())
    }

    /// Sum of all elements, as a one-element array.
    #[track_caller]
    pub fn sum_all(&self) -> Result<NDArray> {
        ops::sum(self, ReduceParams::new())
    }

    /// Mean of all elements, as a one-element array.
    #[track_caller]
    pub fn mean_all(&self) -> Result<NDArray> {
        ops::mean(self, ReduceParams::new())
    }
}
