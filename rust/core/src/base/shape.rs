//! Shapes, and the small axis arithmetic every operator needs.

use crate::error::Result;

/// A row-major shape. A 0-d shape (no dims) is a scalar with one element.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Shape(pub Vec<usize>);

impl Shape {
    pub fn new(dims: impl Into<Vec<usize>>) -> Self {
        Shape(dims.into())
    }
    pub fn ndim(&self) -> usize {
        self.0.len()
    }
    pub fn size(&self) -> usize {
        self.0.iter().product()
    }
    pub fn dims(&self) -> &[usize] {
        &self.0
    }
    /// Row-major element strides.
    pub fn strides(&self) -> Vec<usize> {
        let mut strides = vec![1; self.0.len()];
        for i in (0..self.0.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * self.0[i + 1];
        }
        strides
    }
}

impl From<Vec<usize>> for Shape {
    fn from(v: Vec<usize>) -> Self {
        Shape(v)
    }
}

impl From<&[usize]> for Shape {
    fn from(v: &[usize]) -> Self {
        Shape(v.to_vec())
    }
}

impl std::ops::Index<usize> for Shape {
    type Output = usize;
    fn index(&self, i: usize) -> &usize {
        &self.0[i]
    }
}

impl std::fmt::Display for Shape {
    /// MXNet prints shapes as Python tuples: `(2, 3)`, `(5,)`, `()`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("(")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        if self.0.len() == 1 {
            f.write_str(",")?;
        }
        f.write_str(")")
    }
}

/// Map a possibly negative axis into `0..ndim`.
pub fn normalize_axis(axis: i64, ndim: usize) -> Result<usize> {
    let n = ndim as i64;
    let a = if axis < 0 { axis + n } else { axis };
    if a < 0 || a >= n {
        crate::bail!(Value, "axis {axis} is out of bounds for an array of {ndim} dimension(s)");
    }
    Ok(a as usize)
}
