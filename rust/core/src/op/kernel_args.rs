//! The arrays of one kernel call, handed to the kernel as typed, checked slices.
//!
//! A CPU kernel asks its [`KernelArgs`] for `&[T]` inputs and `&mut [T]` outputs. The dispatcher
//! builds the arguments once per call and checks how the call's memory overlaps: outputs never
//! overlap each other, and an output overlaps an input only by being exactly that input's memory
//! under a pair the operator declares in place ([`Operator::inplace_pairs`](super::Operator::inplace_pairs)).
//! Lending then follows Rust's borrow rules at run time, as a `RefCell` does: an output is lent
//! once, and never while the input it shares memory with is lent for reading. A kernel that
//! computes in place asks for [`KernelArgs::in_place`] and gets one `&mut` slice where the memory
//! is shared. Making slices from tensors happens only here.

use std::cell::Cell;

use smallvec::SmallVec;

use super::Tensor;
use crate::base::{DType, Elem, Shape};
use crate::error::Result;

/// How one array of the call is lent out so far.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Lent {
    Not,
    /// As `&[T]`, any number of times.
    Read,
    /// As `&mut [T]`, once.
    Written,
}

/// An input and the output computed into it, as [`KernelArgs::in_place`] lends them.
pub enum InOut<'a, T> {
    /// Separate memory: read the first, write the second.
    Separate(&'a [T], &'a mut [T]),
    /// The output is the input's memory: read each element before writing it.
    Same(&'a mut [T]),
}

/// The inputs and outputs of one kernel call (see the module documentation).
pub struct KernelArgs<'t> {
    inputs: &'t [Tensor],
    outputs: &'t [Tensor],
    mutated: &'t [usize],
    /// For each input, the output whose memory it is (a declared in-place pair being used), or
    /// [`NOT_WRITTEN`].
    written_by: SmallVec<[u32; 4]>,
    /// Inputs first, then outputs.
    lent: SmallVec<[Cell<Lent>; 6]>,
}

const NOT_WRITTEN: u32 = u32::MAX;

/// The bytes a tensor occupies; empty for an empty tensor, which overlaps nothing.
#[inline]
fn extent(t: &Tensor) -> std::ops::Range<usize> {
    let start = t.raw().addr();
    start..start + t.size() * t.dtype.size()
}

/// Whether two arrays' bytes overlap; an empty array overlaps nothing.
#[inline]
fn overlap(a: &std::ops::Range<usize>, b: &std::ops::Range<usize>) -> bool {
    a.start < b.end && b.start < a.end && !a.is_empty() && !b.is_empty()
}

/// `dst = src` for two arrays of one dtype and element count, outside any kernel call: copies
/// between whole arrays (`copyto`, a gradient's first write, an identity reduction) need none of
/// the lending bookkeeping, and go through it on every recorded step. The sizes, the dtypes and
/// the overlap are checked here, beside the other places that make slices from tensors.
///
/// # Safety
/// As for [`KernelArgs::new`]: both tensors are valid, the caller holds `src` for reading and
/// `dst` for writing, and nothing else reaches them while the copy runs.
pub(crate) unsafe fn copy_tensor(src: &Tensor, dst: &Tensor) -> Result<()> {
    if src.dtype != dst.dtype || src.size() != dst.size() {
        crate::bail!(Runtime, "copy: {} elements of {} into {} elements of {}", src.size(), src.dtype, dst.size(), dst.dtype);
    }
    let (from, to) = (extent(src), extent(dst));
    if from == to || to.is_empty() {
        return Ok(());
    }
    if overlap(&from, &to) {
        crate::bail!(Runtime, "copy: source and destination overlap without being the same array");
    }
    // SAFETY: the caller's contract makes both spans valid and reachable only here; they are
    // non-empty and disjoint (checked above), so the shared and the unique slice do not alias.
    let (xs, ys) = unsafe { (std::slice::from_raw_parts(src.raw().cast_const(), from.len()), std::slice::from_raw_parts_mut(dst.raw(), to.len())) };
    super::broadcast::copy_into(xs, ys)
}

impl<'t> KernelArgs<'t> {
    /// Check the call's memory and prepare to lend it: `inplace` are the operator's declared
    /// (input, output) pairs, `mutated` the inputs its kernel updates.
    ///
    /// # Safety
    /// The tensors are valid as [`Tensor::new`] requires, and while these arguments live nothing
    /// else reads or writes the tensors' memory except through them (no other `KernelArgs`
    /// over the same outputs, no raw access to them).
    pub(crate) unsafe fn new(inputs: &'t [Tensor], outputs: &'t [Tensor], inplace: &[(usize, usize)], mutated: &'t [usize]) -> Result<Self> {
        let mut written_by: SmallVec<[u32; 4]> = SmallVec::from_elem(NOT_WRITTEN, inputs.len());
        // Spans are worked out as they are compared rather than collected first: a call has one
        // or two outputs, and this check runs on every operator call (it is part of the per-op
        // cost that the 2x2-add benchmark measures).
        for (o, out) in outputs.iter().enumerate() {
            let span = extent(out);
            if let Some(b) = outputs.iter().skip(o + 1).position(|other| overlap(&span, &extent(other))) {
                crate::bail!(Runtime, "kernel arguments: outputs {o} and {} share memory", o + 1 + b);
            }
            for (i, (input, written)) in inputs.iter().zip(written_by.iter_mut()).enumerate() {
                let input_span = extent(input);
                if !overlap(&span, &input_span) {
                    continue;
                }
                let declared = inplace.contains(&(i, o)) && span == input_span && out.dtype == input.dtype;
                if !declared {
                    crate::bail!(Runtime, "kernel arguments: output {o} overlaps input {i}, which the operator does not compute in place");
                }
                *written = o as u32;
            }
        }
        for &i in mutated {
            let span = inputs.get(i).map(extent).unwrap_or_default();
            let shared = written_by.get(i).is_some_and(|&w| w != NOT_WRITTEN)
                || inputs.iter().enumerate().any(|(j, other)| j != i && overlap(&span, &extent(other)));
            if shared {
                crate::bail!(Runtime, "kernel arguments: input {i}, which the kernel updates, shares memory with another argument");
            }
        }
        let lent = SmallVec::from_elem(Cell::new(Lent::Not), inputs.len() + outputs.len());
        Ok(KernelArgs { inputs, outputs, mutated, written_by, lent })
    }

    /// The input tensors: shapes and dtypes (their elements through [`KernelArgs::input`]).
    #[inline]
    pub fn inputs(&self) -> &'t [Tensor] {
        self.inputs
    }
    /// The output tensors: shapes and dtypes (their elements through [`KernelArgs::output`]).
    #[inline]
    pub fn outputs(&self) -> &'t [Tensor] {
        self.outputs
    }

    /// `tensor`, checked to hold elements of `T`.
    #[inline]
    fn of_type<T: Elem>(tensor: &'t Tensor, kind: &str, index: usize) -> Result<&'t Tensor> {
        if tensor.dtype != T::DTYPE {
            crate::bail!(Runtime, "kernel arguments: {kind} {index} holds {}, asked for as {}", tensor.dtype, T::DTYPE);
        }
        Ok(tensor)
    }

    #[inline]
    fn state(&self, slot: usize) -> Lent {
        self.lent.get(slot).map_or(Lent::Not, Cell::get)
    }

    #[inline]
    fn mark(&self, slot: usize, how: Lent) {
        if let Some(cell) = self.lent.get(slot) {
            cell.set(how);
        }
    }

    /// Input `i`'s elements.
    #[inline]
    pub fn input<T: Elem>(&self, i: usize) -> Result<&[T]> {
        let tensor = Self::of_type::<T>(self.input_tensor(i)?, "input", i)?;
        let output_written = self.written_by.get(i).is_some_and(|&o| o != NOT_WRITTEN && self.state(self.inputs.len() + o as usize) == Lent::Written);
        if self.state(i) == Lent::Written || output_written {
            crate::bail!(Runtime, "kernel arguments: input {i} is being written (ask for it with in_place)");
        }
        self.mark(i, Lent::Read);
        // SAFETY: `new`'s contract makes the memory valid and reachable only through these
        // arguments, and the lending state just checked shows that no `&mut` to it is out (its
        // own, or that of the output sharing its memory), and none will be lent while `self` is
        // borrowed by the returned slice (the input stays marked read).
        Ok(unsafe { std::slice::from_raw_parts(tensor.ptr::<T>(), tensor.size()) })
    }

    /// Input `i`'s elements as f64, whatever its dtype (sequence lengths, scalars held in arrays).
    pub fn input_f64(&self, i: usize) -> Result<Vec<f64>> {
        crate::dispatch_dtype!(self.input_dtype(i)?, T => Ok(self.input::<T>(i)?.iter().map(|v| v.to_f64()).collect()))
    }

    /// Output `o` written from f64 values, converted to its dtype.
    pub fn output_from_f64(&self, o: usize, values: &[f64]) -> Result<()> {
        crate::dispatch_dtype!(self.output_dtype(o)?, T => {
            let out = self.output::<T>(o)?;
            if out.len() != values.len() {
                crate::bail!(Runtime, "kernel arguments: {} values for output {o} of {} elements", values.len(), out.len());
            }
            out.iter_mut().zip(values).for_each(|(y, &v)| *y = T::from_f64(v));
        });
        Ok(())
    }

    /// Every input's elements, all of one dtype (`add_n`, `Concat`).
    pub fn inputs_as<T: Elem>(&self) -> Result<SmallVec<[&[T]; 4]>> {
        (0..self.inputs.len()).map(|i| self.input(i)).collect()
    }

    /// Output `o`'s elements to write, lent once.
    #[allow(clippy::mut_from_ref)] // lent at most once, checked at run time as a RefCell does
    #[inline]
    pub fn output<T: Elem>(&self, o: usize) -> Result<&mut [T]> {
        let slot = self.inputs.len() + o;
        let tensor = Self::of_type::<T>(self.output_tensor(o)?, "output", o)?;
        let input_read = self.written_by.iter().enumerate().any(|(i, &w)| w as usize == o && self.state(i) != Lent::Not);
        if self.state(slot) != Lent::Not || input_read {
            crate::bail!(Runtime, "kernel arguments: output {o} is already lent, or its memory is lent as an input (ask for it with in_place)");
        }
        self.mark(slot, Lent::Written);
        // SAFETY: as in `input`; nothing else of this call is lent over this memory (outputs
        // never overlap, and the input sharing it, if any, is not lent), and it is now marked
        // written so that neither it nor that input will be lent again.
        Ok(unsafe { std::slice::from_raw_parts_mut(tensor.ptr::<T>(), tensor.size()) })
    }

    /// Input `i`, which the kernel updates in place (one of the operator's
    /// [`mutated_inputs`](super::Operator::mutated_inputs)), lent once for writing.
    #[allow(clippy::mut_from_ref)] // lent at most once, checked at run time as a RefCell does
    pub fn mutated<T: Elem>(&self, i: usize) -> Result<&mut [T]> {
        let tensor = Self::of_type::<T>(self.input_tensor(i)?, "input", i)?;
        if !self.mutated.contains(&i) || self.state(i) != Lent::Not {
            crate::bail!(Runtime, "kernel arguments: input {i} is not an updated input, or is already lent");
        }
        self.mark(i, Lent::Written);
        // SAFETY: as in `output`: `new` checked that an updated input shares memory with no
        // other argument, and it is now marked written.
        Ok(unsafe { std::slice::from_raw_parts_mut(tensor.ptr::<T>(), tensor.size()) })
    }

    /// Input `i` and output `o` of an operator that may compute `o` in `i`'s memory.
    #[inline]
    pub fn in_place<T: Elem>(&self, i: usize, o: usize) -> Result<InOut<'_, T>> {
        if self.shares_memory(i, o) {
            // Lent as the output; the input is marked too, so that it is not read beside it.
            let shared = self.output::<T>(o)?;
            self.mark(i, Lent::Written);
            return Ok(InOut::Same(shared));
        }
        Ok(InOut::Separate(self.input(i)?, self.output(o)?))
    }

    /// Run another operator's kernel over other arrays: this call's own tensors rearranged (a
    /// subset, another order) or temporaries the kernel made. Nothing of this call may be lent
    /// before, and nothing is lent through it while `run` runs.
    pub fn delegate<R>(
        &self,
        operator: &dyn super::Operator,
        inputs: &[Tensor],
        outputs: &[Tensor],
        run: impl FnOnce(&KernelArgs) -> Result<R>,
    ) -> Result<R> {
        if self.lent.iter().any(|c| c.get() != Lent::Not) {
            crate::bail!(Runtime, "kernel arguments: delegated to another kernel after lending");
        }
        self.lent.iter().for_each(|c| c.set(Lent::Written));
        // SAFETY: the tensors are valid as `Tensor::new` requires (this call's own, or
        // temporaries made under that contract); this call's arguments lend nothing while the new
        // ones live (everything is marked lent until they are dropped), and `run` cannot keep
        // their slices past its return (they borrow the arguments it is handed).
        let result = unsafe { KernelArgs::new(inputs, outputs, operator.inplace_pairs(), operator.mutated_inputs()) }.and_then(|sub| run(&sub));
        self.lent.iter().for_each(|c| c.set(Lent::Not));
        result
    }

    /// Whether output `o` is input `i`'s memory (the call computes that declared pair in place).
    #[inline]
    pub fn shares_memory(&self, i: usize, o: usize) -> bool {
        self.written_by.get(i).is_some_and(|&w| w as usize == o)
    }

    #[inline]
    fn input_tensor(&self, i: usize) -> Result<&'t Tensor> {
        self.inputs.get(i).ok_or_else(|| crate::err!(Runtime, "kernel arguments: no input {i} (the call has {})", self.inputs.len()))
    }
    #[inline]
    fn output_tensor(&self, o: usize) -> Result<&'t Tensor> {
        self.outputs.get(o).ok_or_else(|| crate::err!(Runtime, "kernel arguments: no output {o} (the call has {})", self.outputs.len()))
    }
    /// The dtype of input `i` (the first input's decides most kernels' element type).
    #[inline]
    pub fn input_dtype(&self, i: usize) -> Result<DType> {
        Ok(self.input_tensor(i)?.dtype)
    }
    #[inline]
    pub fn output_dtype(&self, o: usize) -> Result<DType> {
        Ok(self.output_tensor(o)?.dtype)
    }
    #[inline]
    pub fn input_shape(&self, i: usize) -> Result<&'t Shape> {
        Ok(&self.input_tensor(i)?.shape)
    }
    #[inline]
    pub fn output_shape(&self, o: usize) -> Result<&'t Shape> {
        Ok(&self.output_tensor(o)?.shape)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(values: &mut [f32]) -> Tensor {
        // SAFETY: the tests keep the vectors alive and untouched while the tensors are used.
        unsafe { Tensor::new(values.as_mut_ptr().cast(), Shape::new(vec![values.len()]), DType::F32) }
    }

    #[test]
    fn separate_arrays_lend_typed_slices_once() {
        let (mut a, mut b, mut out) = (vec![1f32, 2.0], vec![3f32, 4.0], vec![0f32; 2]);
        let (inputs, outputs) = ([tensor(&mut a), tensor(&mut b)], [tensor(&mut out)]);
        // SAFETY: the vectors are reached only through these arguments while they live.
        let args = unsafe { KernelArgs::new(&inputs, &outputs, &[(0, 0)], &[]) }.unwrap();
        let [x, y] = [args.input::<f32>(0).unwrap(), args.input::<f32>(1).unwrap()];
        assert!(args.input::<f64>(0).is_err(), "wrong element type");
        assert!(args.input::<f32>(2).is_err(), "no such input");
        let z = args.output::<f32>(0).unwrap();
        assert!(args.output::<f32>(0).is_err(), "an output is lent once");
        for ((z, x), y) in z.iter_mut().zip(x).zip(y) {
            *z = x + y;
        }
        assert!(args.in_place::<f32>(0, 0).is_err(), "the output is already lent");
        drop(args);
        assert_eq!(out, vec![4.0, 6.0]);
    }

    #[test]
    fn a_declared_pair_in_one_memory_is_lent_as_one_slice() {
        let mut a = vec![1f32, 2.0, 3.0];
        let t = tensor(&mut a);
        let (inputs, outputs) = ([t.clone()], [t]);
        // SAFETY: as above.
        let args = unsafe { KernelArgs::new(&inputs, &outputs, &[(0, 0)], &[]) }.unwrap();
        match args.in_place::<f32>(0, 0).unwrap() {
            InOut::Same(values) => values.iter_mut().for_each(|v| *v *= 2.0),
            InOut::Separate(..) => panic!("the memory is shared"),
        }
        assert!(args.input::<f32>(0).is_err(), "the input is being written");
        drop(args);
        assert_eq!(a, vec![2.0, 4.0, 6.0]);
    }

    #[test]
    fn reading_an_input_then_writing_its_memory_is_refused() {
        let mut a = vec![1f32, 2.0];
        let t = tensor(&mut a);
        let (inputs, outputs) = ([t.clone()], [t]);
        // SAFETY: as above.
        let args = unsafe { KernelArgs::new(&inputs, &outputs, &[(0, 0)], &[]) }.unwrap();
        let _read = args.input::<f32>(0).unwrap();
        assert!(args.output::<f32>(0).is_err());
    }

    #[test]
    fn undeclared_or_partial_overlaps_are_refused() {
        let mut a = vec![0f32; 4];
        let whole = tensor(&mut a);
        // SAFETY: a view of the vector's first half, alive as long as it.
        let half = unsafe { Tensor::new(whole.raw(), Shape::new(vec![2]), DType::F32) };
        let one = std::slice::from_ref::<Tensor>;
        // SAFETY: these arguments are refused before any slice is made.
        let refuse = |inputs: &[Tensor], outputs: &[Tensor], pairs: &[(usize, usize)], mutated: &[usize]| unsafe {
            KernelArgs::new(inputs, outputs, pairs, mutated).err().map(|e| e.message).unwrap_or_default()
        };
        assert!(refuse(one(&whole), one(&whole), &[], &[]).contains("does not compute in place"));
        assert!(refuse(one(&whole), one(&half), &[(0, 0)], &[]).contains("does not compute in place"));
        assert!(refuse(&[], &[whole.clone(), half.clone()], &[], &[]).contains("outputs 0 and 1 share memory"));
        assert!(refuse(&[whole.clone(), half], &[], &[], &[0]).contains("updates, shares memory"));
        let mut empty: Vec<f32> = Vec::new();
        let nothing = tensor(&mut empty);
        // SAFETY: empty tensors reach no memory.
        assert!(unsafe { KernelArgs::new(one(&nothing), one(&nothing), &[], &[]) }.is_ok(), "empty arrays overlap nothing");
    }

    #[test]
    fn updated_inputs_are_lent_for_writing_only_when_declared() {
        let (mut w, mut m) = (vec![1f32], vec![0f32]);
        let inputs = [tensor(&mut w), tensor(&mut m)];
        // SAFETY: as above.
        let args = unsafe { KernelArgs::new(&inputs, &[], &[], &[1]) }.unwrap();
        assert!(args.mutated::<f32>(0).is_err());
        args.mutated::<f32>(1).unwrap()[0] = 5.0;
        assert!(args.input::<f32>(1).is_err());
        drop(args);
        assert_eq!(m, vec![5.0]);
    }

    #[test]
    fn whole_array_copies_check_dtype_size_and_overlap() {
        let (mut a, mut b, mut c) = (vec![1f32, 2.0, 3.0, 4.0], vec![0f32; 4], vec![0f32; 3]);
        let (x, y, short) = (tensor(&mut a), tensor(&mut b), tensor(&mut c));
        // SAFETY: the vectors are reached only through these tensors while they are used.
        unsafe {
            copy_tensor(&x, &y).unwrap();
            copy_tensor(&x, &x).unwrap();
            assert!(copy_tensor(&x, &short).unwrap_err().message.contains("4 elements of float32 into 3"));
            let tail = Tensor::new(x.raw().add(4), Shape::new(vec![3]), DType::F32);
            let head = Tensor::new(x.raw(), Shape::new(vec![3]), DType::F32);
            assert!(copy_tensor(&head, &tail).unwrap_err().message.contains("overlap"));
            let as_ints = Tensor::new(y.raw(), Shape::new(vec![4]), DType::I32);
            assert!(copy_tensor(&x, &as_ints).is_err(), "no dtype conversion here");
        }
        assert_eq!(b, a);
    }
}
