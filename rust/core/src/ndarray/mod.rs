//! NDArray: a handle onto a shared chunk of device memory.
//!
//! A chunk is one allocation plus the engine var that orders every access to it. An NDArray is
//! that chunk plus an element offset, a shape and a dtype, so reshapes and first-axis slices are
//! views that share the chunk and therefore its var: writes through a view are ordered with reads
//! of the original.
// Programs' arguments and saved graphs arrive here: no unwrap and no unchecked indexing, so that
// bad input can only ever produce an error (issue 23's lint discipline, as in `io`).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::indexing_slicing))]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use crate::base::{Context, DType, Shape};
use crate::engine::{self, Var};
use crate::error::Result;
use crate::graph::Entry;
use crate::op::Tensor;
use crate::storage::{self, Buffer};

pub struct Chunk {
    /// Allocated on first access, as MXNet's delayed allocation: an op's output gets memory when
    /// the op runs rather than when it is pushed, so a Python thread running ahead of the engine
    /// holds no memory for work that has not started (and the pool can hand the op buffers that
    /// its predecessors released meanwhile).
    buffer: OnceLock<Buffer>,
    bytes: usize,
    /// For a gradient buffer: written by `backward` since the optimizer last consumed it
    /// (MXNet's fresh_out_grad, which Trainer checks for stale gradients). Only a status flag:
    /// Relaxed, nothing is published through it.
    fresh_grad: AtomicBool,
    pub var: Arc<Var>,
    pub ctx: Context,
}

impl Chunk {
    fn buffer(&self) -> Result<&Buffer> {
        if let Some(buffer) = self.buffer.get() {
            return Ok(buffer);
        }
        let fresh = storage::alloc(self.ctx, self.bytes)?;
        // Two threads may race to the first access; the loser's buffer goes back to the pool.
        Ok(self.buffer.get_or_init(|| fresh))
    }
}

#[derive(Clone)]
pub struct NDArray {
    chunk: Arc<Chunk>,
    /// Offset of the first element, in elements of `dtype`.
    offset: usize,
    shape: Shape,
    dtype: DType,
    /// The graph value this array is, when autograd recorded it or marked it as a variable.
    autograd: Option<Entry>,
}

impl NDArray {
    /// A new array with uninitialized contents (MXNet's `empty`).
    pub fn empty(shape: Shape, dtype: DType, ctx: Context) -> Result<NDArray> {
        let bytes = shape.checked_bytes(dtype.size()).ok().filter(|&b| b <= isize::MAX as usize / 2);
        let Some(bytes) = bytes else {
            crate::bail!(Value, "cannot allocate an array of shape {shape} and dtype {dtype}: too many bytes");
        };
        let chunk = Chunk { buffer: OnceLock::new(), bytes, fresh_grad: AtomicBool::new(false), var: Var::new(), ctx };
        Ok(NDArray { chunk: Arc::new(chunk), offset: 0, shape, dtype, autograd: None })
    }

    /// An array over memory that already holds its row-major elements (no copy), on the host.
    pub fn from_buffer(buffer: Buffer, shape: Shape, dtype: DType) -> Result<NDArray> {
        let bytes = shape.dims().iter().try_fold(dtype.size(), |total, &d| total.checked_mul(d));
        if bytes != Some(buffer.len()) {
            crate::bail!(Value, "a buffer of {} bytes cannot hold an array of shape {shape} and dtype {dtype}", buffer.len());
        }
        let len = buffer.len();
        let chunk = Chunk { buffer: OnceLock::from(buffer), bytes: len, fresh_grad: AtomicBool::new(false), var: Var::new(), ctx: Context::cpu(0) };
        Ok(NDArray { chunk: Arc::new(chunk), offset: 0, shape, dtype, autograd: None })
    }

    /// A new array holding a copy of `bytes` (row-major elements of `dtype`).
    pub fn from_bytes(shape: Shape, dtype: DType, ctx: Context, bytes: &[u8]) -> Result<NDArray> {
        let expected = shape.checked_bytes(dtype.size())?;
        if bytes.len() != expected {
            crate::bail!(Value, "{} bytes given for an array of shape {shape} and dtype {dtype} ({expected} bytes)", bytes.len());
        }
        let arr = NDArray::empty(shape, dtype, ctx)?;
        if !ctx.is_host() {
            let address = arr.address()?;
            // SAFETY: the array is brand new, so no engine op can be using its chunk, and its
            // device buffer holds exactly `expected` bytes.
            return device_copy(ctx, |gpu| unsafe { gpu.copy_from_host(address, bytes) }).map(|()| arr);
        }
        // SAFETY: the array is brand new, so no engine op can be using its chunk, and the buffer
        // holds exactly `expected` bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), arr.address()?, expected) };
        Ok(arr)
    }

    pub fn shape(&self) -> &Shape {
        &self.shape
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    pub fn context(&self) -> Context {
        self.chunk.ctx
    }
    pub fn size(&self) -> usize {
        self.shape.size()
    }
    pub fn var(&self) -> &Arc<Var> {
        &self.chunk.var
    }
    pub fn nbytes(&self) -> usize {
        self.size() * self.dtype.size()
    }
    /// Whether `backward` wrote this (gradient) array since the flag was last cleared.
    pub fn fresh_grad(&self) -> bool {
        self.chunk.fresh_grad.load(Ordering::Relaxed)
    }
    pub fn set_fresh_grad(&self, fresh: bool) {
        self.chunk.fresh_grad.store(fresh, Ordering::Relaxed)
    }
    /// Whether two arrays share one chunk (and so one var).
    pub fn same_chunk(&self, other: &NDArray) -> bool {
        Arc::ptr_eq(&self.chunk, &other.chunk)
    }
    /// Whether two arrays cover exactly the same elements.
    pub fn same_data(&self, other: &NDArray) -> bool {
        self.same_chunk(other) && self.offset == other.offset && self.nbytes() == other.nbytes()
    }

    pub fn autograd_entry(&self) -> Option<&Entry> {
        self.autograd.as_ref()
    }
    /// The same array as the graph value `entry`.
    pub fn with_entry(&self, entry: Entry) -> NDArray {
        NDArray { autograd: Some(entry), ..self.clone() }
    }
    /// The same array outside any autograd graph (MXNet's `detach`).
    pub fn detached(&self) -> NDArray {
        NDArray { autograd: None, ..self.clone() }
    }

    /// Address of the first element, allocating the chunk on first use (which fails only when
    /// the host is out of memory). Dereferencing it is only sound inside an engine op that was
    /// granted this array's var (or on a chunk no op can reach yet).
    /// Host code can only read host memory: for an array on a GPU this is an error (copy it to
    /// a cpu context first).
    pub fn data_ptr(&self) -> Result<*mut u8> {
        if !self.context().is_host() {
            crate::bail!(Device, "the host cannot address memory of an array on {}: copy it to a cpu context first", self.context());
        }
        self.address()
    }

    /// Address of the first element in the array's own memory space (device memory for a GPU
    /// array), allocating the chunk on first use.
    fn address(&self) -> Result<*mut u8> {
        let buffer = self.chunk.buffer()?;
        // SAFETY: offset * size stays within the buffer: views are only created in-bounds (only
        // the address is computed; device memory is never dereferenced here).
        Ok(unsafe { buffer.as_ptr().add(self.offset * self.dtype.size()) })
    }

    /// The kernel's view of this array, for an op that holds its var; on a GPU the tensor holds a
    /// device address, for GPU kernels only.
    #[inline]
    pub fn tensor(&self) -> Result<Tensor> {
        // SAFETY: the pointer addresses shape.size() elements of dtype inside the chunk, which
        // the op's closure keeps alive by holding this NDArray.
        Ok(unsafe { Tensor::new(self.address()?, self.shape.clone(), self.dtype) })
    }

    /// A view with another shape of the same size (reshape without copy). Views start outside
    /// any autograd graph: [`crate::autograd::record_view`] records them.
    pub fn reshape_view(&self, shape: Shape) -> Result<NDArray> {
        if shape.checked_size().map_err(|e| e.context(format!("cannot reshape array of shape {}", self.shape)))? != self.size() {
            crate::bail!(Shape, "cannot reshape array of shape {} into {shape}", self.shape);
        }
        Ok(NDArray { shape, autograd: None, ..self.clone() })
    }

    /// The start of this array's memory seen as `shape` elements of `dtype` (a planned storage
    /// block holding one value after another).
    pub fn reinterpret(&self, shape: Shape, dtype: DType) -> Result<NDArray> {
        let needed = shape.checked_bytes(dtype.size())?;
        if self.offset != 0 || needed > self.nbytes() {
            crate::bail!(Value, "cannot view {} bytes at offset {} as {needed} bytes of {dtype} {shape}", self.nbytes(), self.offset);
        }
        Ok(NDArray { chunk: self.chunk.clone(), offset: 0, shape, dtype, autograd: None })
    }

    /// Rows `begin..end` of the first axis, as a view.
    pub fn slice_view(&self, begin: usize, end: usize) -> Result<NDArray> {
        let Some(&rows) = self.shape.dims().first() else {
            crate::bail!(Index, "cannot slice a 0-d array");
        };
        if begin > end || end > rows {
            crate::bail!(Index, "slice [{begin}, {end}) is out of bounds for axis 0 of size {rows}");
        }
        let row = self.size() / rows.max(1);
        let mut dims = self.shape.dims().to_vec();
        if let Some(first) = dims.first_mut() {
            *first = end - begin;
        }
        Ok(NDArray { offset: self.offset + begin * row, shape: Shape::new(dims), autograd: None, ..self.clone() })
    }

    /// Row `index` of the first axis, as a view without that axis.
    pub fn at_view(&self, index: usize) -> Result<NDArray> {
        let v = self.slice_view(index, index + 1)?;
        let dims = v.shape.dims().get(1..).unwrap_or_default().to_vec();
        v.reshape_view(Shape::new(dims))
    }

    /// Block until pending writes are done; return the error of the op that failed to write it.
    /// (On a GPU: until the device has run them too.)
    pub fn wait_to_read(&self) -> Result<()> {
        engine::wait_for_var(&self.chunk.var, false)?;
        self.wait_for_device()
    }

    /// Block until pending reads and writes are done.
    pub fn wait_to_write(&self) -> Result<()> {
        engine::wait_for_var(&self.chunk.var, true)?;
        self.wait_for_device()
    }

    /// Engine ops on a GPU are done once their work is enqueued; this waits for the device to
    /// run it (a sync point: a kernel's failure is reported here).
    fn wait_for_device(&self) -> Result<()> {
        if self.context().is_host() {
            return Ok(());
        }
        device_copy(self.context(), |gpu| gpu.synchronize())
    }

    /// Copy the elements out (waits for pending writes first).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        self.wait_to_read()?;
        let mut out = vec![0u8; self.nbytes()];
        self.read_into(&mut out)?;
        Ok(out)
    }

    /// Copy the elements into `dst` after waiting for pending writes.
    pub fn read_into(&self, dst: &mut [u8]) -> Result<()> {
        if dst.len() != self.nbytes() {
            crate::bail!(Value, "destination holds {} bytes, the array {}", dst.len(), self.nbytes());
        }
        engine::wait_for_var(&self.chunk.var, false)?;
        if !self.context().is_host() {
            let address = self.address()?;
            // SAFETY: no writer is pending on this chunk (see below) and its device memory holds
            // the array's bytes; the copy waits for the stream, so earlier kernels have run.
            return device_copy(self.context(), |gpu| unsafe { gpu.copy_to_host(dst, address) });
        }
        // SAFETY: after the wait no writer is pending on this chunk; a writer pushed later from
        // another thread would race, exactly as with MXNet's SyncCopyToCPU.
        unsafe { std::ptr::copy_nonoverlapping(self.address()?, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// The elements as `T` (test and I/O helper; waits for pending writes).
    pub fn to_vec<T: crate::base::Elem>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype {
            crate::bail!(Type, "array has dtype {}, asked for {}", self.dtype, T::DTYPE);
        }
        let mut values = vec![T::default(); self.size()];
        // SAFETY: T is a plain-old-data element type of exactly dtype's size; its elements may be
        // written as bytes.
        let bytes = unsafe { std::slice::from_raw_parts_mut(values.as_mut_ptr() as *mut u8, std::mem::size_of_val(values.as_slice())) };
        self.read_into(bytes)?;
        Ok(values)
    }

    /// Build an array from typed elements.
    pub fn from_vec<T: crate::base::Elem>(shape: Shape, data: &[T], ctx: Context) -> Result<NDArray> {
        // SAFETY: T is a plain-old-data element type; viewing its elements as bytes is sound.
        let bytes = unsafe { std::slice::from_raw_parts(data.as_ptr() as *const u8, std::mem::size_of_val(data)) };
        NDArray::from_bytes(shape, T::DTYPE, ctx, bytes)
    }
}

/// Run `work` on the GPU of `ctx` (every non-host context is one).
#[cfg(feature = "cuda")]
fn device_copy(ctx: Context, work: impl FnOnce(&crate::backend::cuda::Gpu) -> Result<()>) -> Result<()> {
    work(crate::backend::cuda::gpu(ctx)?)
}

#[cfg(not(feature = "cuda"))]
fn device_copy(ctx: Context, _work: impl FnOnce(&crate::backend::Gpu) -> Result<()>) -> Result<()> {
    Err(crate::backend::gpu_unavailable(ctx))
}

impl std::fmt::Debug for NDArray {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NDArray({} {} @{})", self.shape, self.dtype, self.chunk.ctx)
    }
}
