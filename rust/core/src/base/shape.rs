//! Shapes, and the small axis arithmetic every operator needs.

use crate::error::Result;

/// The dims of a [`Shape`]: up to six stored inline, more on the heap. Every imperative call
/// copies its inputs' and outputs' shapes several times; inline dims make those copies free of
/// allocation (a 2x2 add spent a sixth of its time allocating and freeing shape vectors).
pub type Dims = smallvec::SmallVec<[usize; 6]>;

/// A row-major shape. A 0-d shape (no dims) is a scalar with one element.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Shape(pub Dims);

impl Shape {
    pub fn new(dims: impl Into<Dims>) -> Self {
        Shape(dims.into())
    }
    pub fn ndim(&self) -> usize {
        self.0.len()
    }
    /// The element count. A product that overflows `usize` saturates at `usize::MAX`, a count no
    /// array can have, so size comparisons and allocation checks fail instead of wrapping to a
    /// small number; [`Shape::checked_size`] reports the overflow as an error.
    #[inline]
    pub fn size(&self) -> usize {
        self.0.iter().try_fold(1usize, |count, &d| count.checked_mul(d)).unwrap_or(usize::MAX)
    }
    /// The element count, or an error naming the shape when its extent does not fit in `isize`.
    /// Every array's shape passes this check when the array is made (allocation, reshape, views).
    pub fn checked_size(&self) -> Result<usize> {
        self.checked_bytes(1)
    }
    /// The byte count of an array of this shape with elements of `element_bytes` bytes, or an
    /// error when its extent in bytes does not fit in `isize`. The extent multiplies the nonzero
    /// dims only, so an empty shape such as `(2**61, 0)` is rejected as NumPy rejects it: every
    /// dim of an array must be addressable, whether or not the array holds elements.
    pub fn checked_bytes(&self, element_bytes: usize) -> Result<usize> {
        let extent = self.0.iter().try_fold(element_bytes, |total, &d| total.checked_mul(d.max(1))).filter(|&total| total <= isize::MAX as usize);
        match extent {
            Some(_) if self.0.contains(&0) => Ok(0),
            Some(bytes) => Ok(bytes),
            None => Err(crate::err!(Value, "shape {self} with {element_bytes}-byte elements spans more bytes than the address space holds")),
        }
    }
    pub fn dims(&self) -> &[usize] {
        &self.0
    }
    /// Row-major element strides.
    pub fn strides(&self) -> Vec<usize> {
        let mut strides = vec![1usize; self.0.len()];
        let mut stride = 1usize;
        for (s, &d) in strides.iter_mut().zip(&self.0).rev() {
            *s = stride;
            // Saturating like `size`: an overflowing shape never addresses memory (it fails the
            // checks every array passes when it is made).
            stride = stride.saturating_mul(d);
        }
        strides
    }
}

impl From<Vec<usize>> for Shape {
    fn from(v: Vec<usize>) -> Self {
        Shape(Dims::from_vec(v))
    }
}

impl From<&[usize]> for Shape {
    fn from(v: &[usize]) -> Self {
        Shape(Dims::from_slice(v))
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(dims: [usize; N]) -> Self {
        Shape(Dims::from_slice(&dims))
    }
}

impl FromIterator<usize> for Shape {
    fn from_iter<I: IntoIterator<Item = usize>>(dims: I) -> Self {
        Shape(dims.into_iter().collect())
    }
}

impl std::ops::Index<usize> for Shape {
    type Output = usize;
    // Index's contract, as a slice's: an axis out of range panics (`dims().get(i)` is the
    // checked form).
    #[allow(clippy::indexing_slicing)]
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

/// A shape whose dimensions may be unknown (`None`), as two-way shape inference refines it:
/// MXNet writes such a dimension as 0 (legacy semantics) or -1 (NumPy semantics).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartialShape(pub Vec<Option<usize>>);

impl PartialShape {
    /// `ndim` dimensions, none of them known.
    pub fn unknown(ndim: usize) -> Self {
        PartialShape(vec![None; ndim])
    }
    pub fn ndim(&self) -> usize {
        self.0.len()
    }
    pub fn dims(&self) -> &[Option<usize>] {
        &self.0
    }
    /// The shape, when every dimension is known.
    pub fn full(&self) -> Option<Shape> {
        self.0.iter().copied().collect::<Option<Dims>>().map(Shape)
    }
    pub fn is_full(&self) -> bool {
        self.0.iter().all(Option::is_some)
    }
    /// Product of dimensions `from..`, when all of them are known.
    pub fn known_product(&self, from: usize) -> Option<usize> {
        self.0.get(from..).unwrap_or(&[]).iter().copied().try_fold(1usize, |acc, d| d.map(|d| acc * d))
    }
    /// Fill in the unknown dimensions of `self` from `other` (same rank). Returns whether anything
    /// changed; fails when a dimension known on both sides differs, or the ranks differ.
    pub fn merge(&mut self, other: &PartialShape) -> Result<bool> {
        if self.ndim() != other.ndim() {
            crate::bail!(Shape, "shapes {self} and {other} have different numbers of dimensions");
        }
        if self.0.iter().zip(&other.0).any(|(a, b)| matches!((a, b), (Some(a), Some(b)) if a != b)) {
            crate::bail!(Shape, "shapes {self} and {other} disagree");
        }
        let mut changed = false;
        for (mine, theirs) in self.0.iter_mut().zip(&other.0) {
            if mine.is_none() && theirs.is_some() {
                *mine = *theirs;
                changed = true;
            }
        }
        Ok(changed)
    }
}

impl From<&Shape> for PartialShape {
    fn from(shape: &Shape) -> Self {
        PartialShape(shape.dims().iter().map(|&d| Some(d)).collect())
    }
}

impl std::fmt::Display for PartialShape {
    /// Like [`Shape`]'s tuples, with `?` for an unknown dimension: `(?, 10)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("(")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            match d {
                Some(d) => write!(f, "{d}")?,
                None => f.write_str("?")?,
            }
        }
        if self.0.len() == 1 {
            f.write_str(",")?;
        }
        f.write_str(")")
    }
}

/// Merge `value` into a slot of partial inference (`None`: not even the rank is known).
/// Returns whether the slot learned something.
pub fn merge_partial(slot: &mut Option<PartialShape>, value: &PartialShape) -> Result<bool> {
    match slot {
        None => {
            *slot = Some(value.clone());
            Ok(true)
        }
        Some(known) => known.merge(value),
    }
}

/// Make every input and output agree: the partial inference of an operator whose outputs have
/// its inputs' shape.
pub fn unify_partial(inputs: &mut [Option<PartialShape>], outputs: &mut [Option<PartialShape>]) -> Result<()> {
    let mut common: Option<PartialShape> = None;
    for shape in inputs.iter().chain(outputs.iter()).flatten() {
        merge_partial(&mut common, shape)?;
    }
    if let Some(common) = common {
        for slot in inputs.iter_mut().chain(outputs.iter_mut()) {
            merge_partial(slot, &common)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Shape;

    #[test]
    fn an_empty_shape_still_needs_addressable_dims() {
        assert_eq!(Shape::from([3, 0, 5]).checked_bytes(4).unwrap(), 0);
        assert!(Shape::from([1usize << 61, 0]).checked_bytes(4).is_err());
        assert!(Shape::from([1usize << 63, 0]).checked_size().is_err());
        assert_eq!(Shape::from([1usize << 40, 0]).checked_size().unwrap(), 0);
    }

    #[test]
    fn byte_counts_stop_at_isize_max() {
        assert_eq!(Shape::from([2, 3]).checked_bytes(8).unwrap(), 48);
        assert_eq!(Shape::from([]).checked_size().unwrap(), 1);
        assert!(Shape::from([1usize << 31, 1 << 31]).checked_bytes(2).is_err());
        assert!(Shape::from([usize::MAX, 2]).checked_size().is_err());
    }
}
