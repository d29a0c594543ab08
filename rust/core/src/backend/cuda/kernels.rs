//! Launching the generated kernels of [`kernel_source`] on arrays: element-wise operators (same
//! shapes, or two operands broadcast NumPy-style), reductions over axes, fills and dtype casts.
//! Operators reach these through [`crate::op::Operator::forward_gpu`].

use std::ffi::c_void;
use std::hash::{Hash, Hasher};

use super::device::Gpu;
use super::kernel_source::{self, broadcast_kernel, elementwise_kernel, elementwise_vector_kernel, reduce_kernel, REDUCE_THREADS};
use crate::base::{DType, Shape};
use crate::error::Result;
use crate::op::{Elementwise, Reduction, Tensor};

/// Threads per block of the grid-stride kernels.
const THREADS: u32 = 256;
/// Dimensions a broadcast or reduction kernel can index (`OX_MAX_DIMS` in the prelude).
const MAX_DIMS: usize = 8;

/// A kernel parameter slot: the address of the value the kernel receives.
fn param<T>(value: &mut T) -> *mut c_void {
    value as *mut T as *mut c_void
}

/// A name unique to the source a kernel is generated from (the NVRTC cache is keyed by name).
fn kernel_name(family: &str, identity: impl Hash, dtype: DType) -> String {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    identity.hash(&mut hasher);
    format!("ox_{family}_{:016x}_{}", hasher.finish(), dtype.name())
}

/// `ox_broadcast` of the prelude (same field order and C layout).
#[repr(C)]
struct BroadcastShape {
    dims: [i64; MAX_DIMS],
    lhs_strides: [i64; MAX_DIMS],
    rhs_strides: [i64; MAX_DIMS],
    ndim: i32,
}

/// `ox_reduce` of the prelude (same field order and C layout).
#[repr(C)]
struct ReduceShape {
    kept_dims: [i64; MAX_DIMS],
    kept_strides: [i64; MAX_DIMS],
    reduced_dims: [i64; MAX_DIMS],
    reduced_strides: [i64; MAX_DIMS],
    kept_ndim: i32,
    reduced_ndim: i32,
    count: u64,
}

fn check_rank(what: &str, shape: &Shape) -> Result<()> {
    if shape.ndim() > MAX_DIMS {
        crate::bail!(Device, "{what} on a GPU supports up to {MAX_DIMS} dimensions, got shape {shape}");
    }
    Ok(())
}

/// An element-wise operator: operands of the output's shape, or two operands that broadcast to
/// it. Every operand has the output's dtype (as the CPU kernels require).
pub fn elementwise(gpu: &Gpu, op: &Elementwise, inputs: &[Tensor], output: &Tensor) -> Result<()> {
    if let Some(other) = inputs.iter().find(|t| t.dtype != output.dtype) {
        crate::bail!(Type, "the GPU kernel needs operands of the output's dtype {}, got {}", output.dtype, other.dtype);
    }
    let n = output.size();
    if n == 0 {
        return Ok(());
    }
    let dtype = output.dtype;
    let mut addresses: Vec<u64> = inputs.iter().map(|t| t.raw() as u64).collect();
    addresses.push(output.raw() as u64);
    let mut count = n as u64;
    let mut scalar = op.scalar.unwrap_or(0.0);
    let same_shapes = inputs.iter().all(|t| t.shape == output.shape);
    let mut shape = if same_shapes {
        None
    } else if inputs.len() == 2 {
        Some(broadcast_shape(&inputs[0].shape, &inputs[1].shape, &output.shape)?)
    } else {
        crate::bail!(Shape, "an element-wise GPU kernel needs operands of the output's shape {}", output.shape);
    };
    let mut params: Vec<*mut c_void> = addresses.iter_mut().map(param).collect();
    params.push(param(&mut count));
    if op.scalar.is_some() {
        params.push(param(&mut scalar));
    }
    let identity = (&op.cuda_expr, op.scalar.is_some(), inputs.len());
    match shape.as_mut() {
        None if addresses.iter().all(|&a| a % (4 * dtype.size() as u64) == 0) => {
            let blocks = gpu.blocks_for(n.div_ceil(4), THREADS);
            let name = kernel_name("map4", identity, dtype);
            // SAFETY: as below, and every address is aligned to the four-element accesses of
            // `elementwise_vector_kernel`, which reads and writes only below n.
            unsafe { gpu.launch(&name, || elementwise_vector_kernel(&name, op, inputs.len(), dtype), blocks, THREADS, &mut params) }
        }
        None => {
            let blocks = gpu.blocks_for(n.div_ceil(kernel_source::ELEMENTS_PER_THREAD), THREADS);
            let name = kernel_name("map", identity, dtype);
            // SAFETY: the parameters follow `elementwise_kernel`'s signature (input and output
            // addresses, element count, the scalar where the operator has one); the engine
            // holds every operand's var until the stream has run the kernel.
            unsafe { gpu.launch(&name, || elementwise_kernel(&name, op, inputs.len(), dtype), blocks, THREADS, &mut params) }
        }
        Some(shape) => {
            let blocks = gpu.blocks_for(n, THREADS);
            params.push(param(shape));
            let name = kernel_name("broadcast", identity, dtype);
            // SAFETY: as above, with the `ox_broadcast` struct last, as `broadcast_kernel` takes it.
            unsafe { gpu.launch(&name, || broadcast_kernel(&name, op, dtype), blocks, THREADS, &mut params) }
        }
    }
}

/// Where each output element reads two operands that broadcast to `out`: strides right-aligned,
/// 0 along the dimensions an operand repeats.
fn broadcast_shape(lhs: &Shape, rhs: &Shape, out: &Shape) -> Result<BroadcastShape> {
    check_rank("broadcasting", out)?;
    let ndim = out.ndim();
    let strides = |operand: &Shape| -> Result<[i64; MAX_DIMS]> {
        let mut strides = [0i64; MAX_DIMS];
        let offset = ndim.checked_sub(operand.ndim()).ok_or_else(|| crate::err!(Shape, "cannot broadcast {operand} to {out}"))?;
        let own = operand.strides();
        for (d, (&size, &stride)) in operand.dims().iter().zip(&own).enumerate() {
            if size != 1 && size != out.dims()[offset + d] {
                crate::bail!(Shape, "cannot broadcast {operand} to {out}");
            }
            strides[offset + d] = if size == 1 { 0 } else { stride as i64 };
        }
        Ok(strides)
    };
    let mut dims = [1i64; MAX_DIMS];
    for (d, &size) in out.dims().iter().enumerate() {
        dims[d] = size as i64;
    }
    Ok(BroadcastShape { dims, lhs_strides: strides(lhs)?, rhs_strides: strides(rhs)?, ndim: ndim as i32 })
}

/// A reduction of `input` over the axes `reduced` marks into `output` (whose elements are the
/// kept axes in order, with or without size-one reduced axes).
pub fn reduce(gpu: &Gpu, reduction: &Reduction, reduced: &[bool], input: &Tensor, output: &Tensor) -> Result<()> {
    check_rank("a reduction", &input.shape)?;
    if input.dtype != output.dtype {
        crate::bail!(Type, "the GPU reduction needs an output of the input's dtype {}, got {}", input.dtype, output.dtype);
    }
    let mut shape = ReduceShape {
        kept_dims: [1; MAX_DIMS],
        kept_strides: [0; MAX_DIMS],
        reduced_dims: [1; MAX_DIMS],
        reduced_strides: [0; MAX_DIMS],
        kept_ndim: 0,
        reduced_ndim: 0,
        count: 1,
    };
    for ((&size, stride), &is_reduced) in input.shape.dims().iter().zip(input.shape.strides()).zip(reduced) {
        let (dims, strides, ndim) = if is_reduced {
            shape.count *= size as u64;
            (&mut shape.reduced_dims, &mut shape.reduced_strides, &mut shape.reduced_ndim)
        } else {
            (&mut shape.kept_dims, &mut shape.kept_strides, &mut shape.kept_ndim)
        };
        dims[*ndim as usize] = size as i64;
        strides[*ndim as usize] = stride as i64;
        *ndim += 1;
    }
    let n = output.size();
    if n == 0 {
        return Ok(());
    }
    let dtype = input.dtype;
    let (mut source, mut target, mut outputs) = (input.raw() as u64, output.raw() as u64, n as u64);
    let mut params = [param(&mut source), param(&mut target), param(&mut outputs), param(&mut shape)];
    let name = kernel_name("reduce", (reduction.init, reduction.step, reduction.merge, reduction.finish), dtype);
    let blocks = n.min(65_535) as u32;
    // SAFETY: the parameters follow `reduce_kernel`'s signature; the block size is the
    // REDUCE_THREADS its shared-memory tree assumes; the engine holds both arrays' vars.
    unsafe { gpu.launch(&name, || reduce_kernel(&name, reduction, dtype), blocks, REDUCE_THREADS as u32, &mut params) }
}

/// Every element of `output` set to `value` (converted to its dtype as MXNet does).
pub fn fill(gpu: &Gpu, output: &Tensor, value: f64) -> Result<()> {
    let n = output.size();
    if n == 0 {
        return Ok(());
    }
    let dtype = output.dtype;
    let (mut target, mut count, mut value) = (output.raw() as u64, n as u64, value);
    let mut params = [param(&mut target), param(&mut count), param(&mut value)];
    let name = format!("ox_fill_{}", dtype.name());
    // SAFETY: the parameters follow `fill_kernel`'s signature; the engine holds the output's var.
    unsafe { gpu.launch(&name, || kernel_source::fill_kernel(&name, dtype), gpu.blocks_for(n, THREADS), THREADS, &mut params) }
}

/// Every element of `output` multiplied by `factor`.
pub fn scale(gpu: &Gpu, output: &Tensor, factor: f64) -> Result<()> {
    let n = output.size();
    if n == 0 {
        return Ok(());
    }
    let dtype = output.dtype;
    let (mut target, mut count, mut factor) = (output.raw() as u64, n as u64, factor);
    let mut params = [param(&mut target), param(&mut count), param(&mut factor)];
    let name = format!("ox_scale_{}", dtype.name());
    // SAFETY: the parameters follow `scale_kernel`'s signature; the engine holds the output's var.
    unsafe { gpu.launch(&name, || kernel_source::scale_kernel(&name, dtype), gpu.blocks_for(n, THREADS), THREADS, &mut params) }
}

/// `output` = `input` converted element by element to the output's dtype.
pub fn cast(gpu: &Gpu, input: &Tensor, output: &Tensor) -> Result<()> {
    let n = output.size();
    if n == 0 {
        return Ok(());
    }
    if input.dtype == output.dtype {
        // SAFETY: both are device arrays of n elements of one dtype, held by the calling op.
        return unsafe { gpu.copy_on_device(output.raw(), input.raw(), n * output.dtype.size()) };
    }
    let (mut source, mut target, mut count) = (input.raw() as u64, output.raw() as u64, n as u64);
    let mut params = [param(&mut source), param(&mut target), param(&mut count)];
    let name = format!("ox_cast_{}_{}", input.dtype.name(), output.dtype.name());
    // SAFETY: the parameters follow `cast_kernel`'s signature; the engine holds both vars.
    unsafe { gpu.launch(&name, || kernel_source::cast_kernel(&name, input.dtype, output.dtype), gpu.blocks_for(n, THREADS), THREADS, &mut params) }
}

/// Add `bias[c]` to every element of channel `c` of `output`, laid out (..., channels, inner).
pub fn add_bias(gpu: &Gpu, bias: &Tensor, output: &Tensor, channels: usize, inner: usize) -> Result<()> {
    let n = output.size();
    if n == 0 || channels == 0 || inner == 0 {
        return Ok(());
    }
    if bias.dtype != output.dtype || bias.size() != channels || !n.is_multiple_of(channels * inner) {
        crate::bail!(
            Shape,
            "cannot add a bias of {} {} per channel to {} {} ({channels} channels of {inner})",
            bias.shape,
            bias.dtype,
            output.shape,
            output.dtype
        );
    }
    let dtype = output.dtype;
    let (mut source, mut target, mut count, mut width, mut stride) =
        (bias.raw() as u64, output.raw() as u64, n as u64, channels as u64, inner as u64);
    let mut params = [param(&mut source), param(&mut target), param(&mut count), param(&mut width), param(&mut stride)];
    let name = format!("ox_add_bias_{}", dtype.name());
    // SAFETY: the parameters follow `add_bias_kernel`'s signature; sizes were checked above and
    // the engine holds both arrays' vars.
    unsafe { gpu.launch(&name, || kernel_source::add_bias_kernel(&name, dtype), gpu.blocks_for(n, THREADS), THREADS, &mut params) }
}

/// `ox_strided` of [`kernel_source::strided_copy_kernel`] (same field order and C layout).
#[repr(C)]
struct StridedShape {
    dims: [i64; MAX_DIMS],
    src_strides: [i64; MAX_DIMS],
    dst_strides: [i64; MAX_DIMS],
    src_base: i64,
    dst_base: i64,
    ndim: i32,
}

/// One side of a strided copy: an array, the element offset where the index space starts in it
/// and its stride (in elements, possibly 0 or negative) along each dim of the space.
pub struct Strided<'a> {
    pub tensor: &'a Tensor,
    pub base: isize,
    pub strides: &'a [isize],
}

/// Copy the index space `dims` from `src` to `dst` (the GPU form of the CPU's `strided_copy`;
/// both arrays of one dtype).
pub fn strided_copy(gpu: &Gpu, dims: &[usize], src: Strided<'_>, dst: Strided<'_>) -> Result<()> {
    if dims.len() > MAX_DIMS {
        crate::bail!(Device, "a strided copy on a GPU supports up to {MAX_DIMS} dimensions, got {}", dims.len());
    }
    if src.tensor.dtype != dst.tensor.dtype {
        crate::bail!(Type, "a strided copy needs one dtype, got {} and {}", src.tensor.dtype, dst.tensor.dtype);
    }
    let n: usize = dims.iter().product();
    if n == 0 {
        return Ok(());
    }
    let mut shape = StridedShape {
        dims: [1; MAX_DIMS],
        src_strides: [0; MAX_DIMS],
        dst_strides: [0; MAX_DIMS],
        src_base: src.base as i64,
        dst_base: dst.base as i64,
        ndim: dims.len() as i32,
    };
    for (d, &size) in dims.iter().enumerate() {
        shape.dims[d] = size as i64;
        shape.src_strides[d] = src.strides[d] as i64;
        shape.dst_strides[d] = dst.strides[d] as i64;
    }
    let bytes = dst.tensor.dtype.size();
    let (mut from, mut to, mut count) = (src.tensor.raw() as u64, dst.tensor.raw() as u64, n as u64);
    let mut params = [param(&mut from), param(&mut to), param(&mut count), param(&mut shape)];
    let name = format!("ox_strided_copy_{bytes}");
    // SAFETY: the parameters follow `strided_copy_kernel`'s signature; the caller's dims,
    // bases and strides stay inside both arrays (as for the CPU's strided_copy), whose vars the
    // calling op holds.
    unsafe { gpu.launch(&name, || kernel_source::strided_copy_kernel(&name, bytes), gpu.blocks_for(n, THREADS), THREADS, &mut params) }
}

/// `dst`'s bytes = `src`'s bytes (same byte size, e.g. a reshape's copy).
pub fn copy_bytes(gpu: &Gpu, src: &Tensor, dst: &Tensor) -> Result<()> {
    let bytes = dst.size() * dst.dtype.size();
    if bytes != src.size() * src.dtype.size() {
        crate::bail!(Shape, "cannot copy {} {} into {} {}", src.shape, src.dtype, dst.shape, dst.dtype);
    }
    if bytes == 0 || std::ptr::eq(src.raw(), dst.raw()) {
        return Ok(());
    }
    // SAFETY: both are device arrays of `bytes` bytes held by the calling op; distinct arrays of
    // one op never partly overlap (the imperative layer stages unsafe aliases).
    unsafe { gpu.copy_on_device(dst.raw(), src.raw(), bytes) }
}

/// One weight's update for [`update`]: the arrays (unused states absent) and its rates.
pub struct UpdateArrays<'a> {
    pub weight: &'a Tensor,
    pub grad: &'a Tensor,
    pub states: &'a [Tensor],
    pub master: Option<&'a Tensor>,
    pub out: &'a Tensor,
    pub lr: f64,
    pub wd: f64,
    pub rescale: f64,
}

/// An optimizer update (see [`kernel_source::update_kernel`] for what `rule` may use), writing
/// the master copy too when `write_master`.
pub fn update(gpu: &Gpu, rule: &str, constants: [f64; 4], arrays: UpdateArrays<'_>, write_master: bool) -> Result<()> {
    let n = arrays.weight.size();
    if n == 0 {
        return Ok(());
    }
    let types = kernel_source::UpdateTypes {
        weight: arrays.weight.dtype,
        state: arrays.master.or(arrays.states.first()).map_or(arrays.weight.dtype, |t| t.dtype),
        out: arrays.out.dtype,
    };
    let (num_states, master) = (arrays.states.len(), arrays.master.is_some());
    if num_states > 3 {
        crate::bail!(Device, "a GPU optimizer update keeps at most 3 states, got {num_states}");
    }
    let address = |t: Option<&Tensor>| t.map_or(0u64, |t| t.raw() as u64);
    let mut pointers = [
        address(Some(arrays.weight)),
        address(Some(arrays.grad)),
        address(arrays.states.first()),
        address(arrays.states.get(1)),
        address(arrays.states.get(2)),
        address(arrays.master),
        address(Some(arrays.out)),
    ];
    let mut count = n as u64;
    let mut scalars = [arrays.lr, arrays.wd, arrays.rescale, constants[0], constants[1], constants[2], constants[3]];
    let mut params: Vec<*mut c_void> = pointers.iter_mut().map(param).collect();
    params.push(param(&mut count));
    params.extend(scalars.iter_mut().map(param));
    let name = kernel_name("update", (rule, num_states, master, write_master, types.state.name(), types.out.name()), types.weight);
    // SAFETY: the parameters follow `update_kernel`'s signature (null for absent states, which
    // the generated code never touches); every array holds n elements (the operator's shape
    // inference checks it) and the engine holds their vars.
    unsafe {
        gpu.launch(
            &name,
            || kernel_source::update_kernel(&name, rule, types, num_states, master, write_master),
            gpu.blocks_for(n, THREADS),
            THREADS,
            &mut params,
        )
    }
}

/// Where softmax-like kernels work: `lanes` lanes of `n` elements at stride `inner` (see
/// [`kernel_source::softmax_kernel`]).
#[derive(Clone, Copy, Debug)]
pub struct Lanes {
    pub outer: usize,
    pub n: usize,
    pub inner: usize,
}

impl Lanes {
    fn count(&self) -> usize {
        self.outer * self.inner
    }
}

/// Softmax or log-softmax of `input` along `lanes`, the input scaled by `scale` first.
pub fn softmax(gpu: &Gpu, lanes: Lanes, scale: f64, log: bool, input: &Tensor, output: &Tensor) -> Result<()> {
    if lanes.count() == 0 || lanes.n == 0 {
        return Ok(());
    }
    let dtype = input.dtype;
    let (mut source, mut target) = (input.raw() as u64, output.raw() as u64);
    let (mut count, mut n, mut inner, mut scale) = (lanes.count() as u64, lanes.n as u64, lanes.inner as u64, scale);
    let mut params = [param(&mut source), param(&mut target), param(&mut count), param(&mut n), param(&mut inner), param(&mut scale)];
    let name = format!("ox_{}softmax_{}", if log { "log_" } else { "" }, dtype.name());
    // SAFETY: the parameters follow `softmax_kernel`'s signature; the lanes lie inside both
    // arrays (the operator derived them from the input's shape, which the output shares); the
    // block size is the REDUCE_THREADS its reductions assume.
    unsafe {
        gpu.launch(&name, || kernel_source::softmax_kernel(&name, dtype, log), lanes.count().min(65_535) as u32, REDUCE_THREADS as u32, &mut params)
    }
}

/// The softmax (or log-softmax) gradient along `lanes` from the output gradient and output.
pub fn softmax_backward(gpu: &Gpu, lanes: Lanes, log: bool, grad: &Tensor, output: &Tensor, input_grad: &Tensor) -> Result<()> {
    if lanes.count() == 0 || lanes.n == 0 {
        return Ok(());
    }
    let dtype = grad.dtype;
    let (mut g, mut y, mut dx) = (grad.raw() as u64, output.raw() as u64, input_grad.raw() as u64);
    let (mut count, mut n, mut inner) = (lanes.count() as u64, lanes.n as u64, lanes.inner as u64);
    let mut params = [param(&mut g), param(&mut y), param(&mut dx), param(&mut count), param(&mut n), param(&mut inner)];
    let name = format!("ox_{}softmax_backward_{}", if log { "log_" } else { "" }, dtype.name());
    // SAFETY: as for `softmax`, with `softmax_backward_kernel`'s signature.
    unsafe {
        gpu.launch(
            &name,
            || kernel_source::softmax_backward_kernel(&name, dtype, log),
            lanes.count().min(65_535) as u32,
            REDUCE_THREADS as u32,
            &mut params,
        )
    }
}

/// pick (or, `backward`, its gradient scattered into `dst`, which the caller zeroed) along the
/// middle axis of the (outer, n, inner) layout; `wrap` wraps indices, else they are clipped.
pub fn pick(gpu: &Gpu, n: usize, inner: usize, wrap: bool, backward: bool, src: &Tensor, index: &Tensor, dst: &Tensor) -> Result<()> {
    let cells = index.size();
    if cells == 0 {
        return Ok(());
    }
    if n == 0 {
        crate::bail!(Index, "pick: indices cannot address an axis of size 0");
    }
    let dtype = dst.dtype;
    let (mut from, mut at, mut to) = (src.raw() as u64, index.raw() as u64, dst.raw() as u64);
    let (mut count, mut len, mut width, mut wrap) = (cells as u64, n as u64, inner.max(1) as u64, i32::from(wrap));
    let mut params = [param(&mut from), param(&mut at), param(&mut to), param(&mut count), param(&mut len), param(&mut width), param(&mut wrap)];
    let name = format!("ox_pick{}_{}_{}", if backward { "_backward" } else { "" }, dtype.name(), index.dtype.name());
    // SAFETY: the parameters follow `pick_kernel`'s signature; every clipped or wrapped position
    // lies inside the full array, which the (outer, n, inner) layout describes; the engine holds
    // the three arrays' vars.
    unsafe {
        gpu.launch(&name, || kernel_source::pick_kernel(&name, dtype, index.dtype, backward), gpu.blocks_for(cells, THREADS), THREADS, &mut params)
    }
}

/// Dropout while active (see [`kernel_source::dropout_kernel`]): one draw per element of
/// `shared` (the input's shape with size 1 along the axes that share a mask value).
pub fn dropout(gpu: &Gpu, seed: u64, p: f64, scale: f64, shared: &Shape, input: &Tensor, output: &Tensor, mask: &Tensor) -> Result<()> {
    let n = input.size();
    if n == 0 {
        return Ok(());
    }
    let mut shape = broadcast_shape(shared, shared, &input.shape)?;
    let dtype = input.dtype;
    let (mut x, mut out, mut m) = (input.raw() as u64, output.raw() as u64, mask.raw() as u64);
    let (mut count, mut seed, mut p, mut scale) = (n as u64, seed, p, scale);
    let mut params =
        [param(&mut x), param(&mut out), param(&mut m), param(&mut count), param(&mut seed), param(&mut p), param(&mut scale), param(&mut shape)];
    let name = format!("ox_dropout_{}", dtype.name());
    // SAFETY: the parameters follow `dropout_kernel`'s signature; input, output and mask hold n
    // elements each and the engine holds their vars.
    unsafe { gpu.launch(&name, || kernel_source::dropout_kernel(&name, dtype), gpu.blocks_for(n, THREADS), THREADS, &mut params) }
}

/// How a pooling window is reduced (the kind codes of [`kernel_source::pool_kernel`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolKind {
    Max,
    Avg { include_pad: bool },
    Sum,
    Lp(i32),
}

/// A pooling problem over planes of three spatial axes (leading axes of size 1 for 1-D and 2-D
/// pooling).
#[derive(Clone, Copy, Debug)]
pub struct PoolGeometry {
    pub input: [usize; 3],
    pub kernel: [usize; 3],
    pub stride: [usize; 3],
    pub pad: [usize; 3],
    pub output: [usize; 3],
}

/// `ox_pool` of the pooling kernels (same field order and C layout).
#[repr(C)]
struct PoolShape {
    input: [i64; 3],
    kernel: [i64; 3],
    stride: [i64; 3],
    pad: [i64; 3],
    output: [i64; 3],
    kind: i32,
    include_pad: i32,
    p: i32,
}

impl PoolShape {
    fn new(g: &PoolGeometry, kind: PoolKind) -> PoolShape {
        let wide = |v: [usize; 3]| v.map(|x| x as i64);
        let (code, include_pad, p) = match kind {
            PoolKind::Max => (0, 0, 0),
            PoolKind::Avg { include_pad } => (1, i32::from(include_pad), 0),
            PoolKind::Sum => (2, 0, 0),
            PoolKind::Lp(p) => (3, 0, p),
        };
        PoolShape {
            input: wide(g.input),
            kernel: wide(g.kernel),
            stride: wide(g.stride),
            pad: wide(g.pad),
            output: wide(g.output),
            kind: code,
            include_pad,
            p,
        }
    }
}

/// Pool every plane of `x` (planes of `geometry.input` elements, one after another) into `y`.
pub fn pool(gpu: &Gpu, geometry: &PoolGeometry, kind: PoolKind, x: &Tensor, y: &Tensor) -> Result<()> {
    let total = y.size();
    if total == 0 {
        return Ok(());
    }
    let mut shape = PoolShape::new(geometry, kind);
    let dtype = x.dtype;
    let (mut source, mut target, mut count) = (x.raw() as u64, y.raw() as u64, total as u64);
    let mut params = [param(&mut source), param(&mut target), param(&mut count), param(&mut shape)];
    let name = format!("ox_pool_{}", dtype.name());
    // SAFETY: the parameters follow `pool_kernel`'s signature; x holds planes of the input
    // geometry and y the same planes of the output geometry (the operator's shape inference
    // derived both); the engine holds both vars.
    unsafe { gpu.launch(&name, || kernel_source::pool_kernel(&name, dtype), gpu.blocks_for(total, THREADS), THREADS, &mut params) }
}

/// The pooling gradient into `dx` from the output gradient `g`, the input `x` and output `y`.
pub fn pool_backward(gpu: &Gpu, geometry: &PoolGeometry, kind: PoolKind, g: &Tensor, x: &Tensor, y: &Tensor, dx: &Tensor) -> Result<()> {
    let total = dx.size();
    if total == 0 {
        return Ok(());
    }
    let mut shape = PoolShape::new(geometry, kind);
    let dtype = x.dtype;
    let (mut grad, mut data, mut out, mut target, mut count) = (g.raw() as u64, x.raw() as u64, y.raw() as u64, dx.raw() as u64, total as u64);
    let mut params = [param(&mut grad), param(&mut data), param(&mut out), param(&mut target), param(&mut count), param(&mut shape)];
    let name = format!("ox_pool_backward_{}", dtype.name());
    // SAFETY: as for `pool`, with `pool_backward_kernel`'s signature; g and y have the output's
    // planes, x and dx the input's.
    unsafe { gpu.launch(&name, || kernel_source::pool_backward_kernel(&name, dtype), gpu.blocks_for(total, THREADS), THREADS, &mut params) }
}

/// A convolution's geometry as the GPU kernels take it: three spatial axes (leading ones of size
/// 1), the input's channels and the channels of one group.
#[derive(Clone, Copy, Debug)]
pub struct ConvGeometry {
    pub input: [usize; 3],
    pub kernel: [usize; 3],
    pub stride: [usize; 3],
    pub dilate: [usize; 3],
    pub pad: [usize; 3],
    pub output: [usize; 3],
    pub channels: usize,
    pub group_channels: usize,
}

/// `ox_conv` of the convolution kernels (same field order and C layout).
#[repr(C)]
struct ConvShape {
    input: [i64; 3],
    kernel: [i64; 3],
    stride: [i64; 3],
    dilate: [i64; 3],
    pad: [i64; 3],
    output: [i64; 3],
    channels: i64,
    group_channels: i64,
    first_channel: i64,
}

impl ConvShape {
    fn new(g: &ConvGeometry, first_channel: usize) -> ConvShape {
        let wide = |v: [usize; 3]| v.map(|x| x as i64);
        ConvShape {
            input: wide(g.input),
            kernel: wide(g.kernel),
            stride: wide(g.stride),
            dilate: wide(g.dilate),
            pad: wide(g.pad),
            output: wide(g.output),
            channels: g.channels as i64,
            group_channels: g.group_channels as i64,
            first_channel: first_channel as i64,
        }
    }
}

/// Which of the two column-matrix kernels runs: im2col (x to col) or its adjoint (col to dx).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Columns {
    FromImages,
    IntoImages,
}

/// im2col (or col2im) of the group starting at `first_channel`, for `images` images starting
/// at `images_at` (the first image of the chunk) and `col` holding their column matrices.
pub fn columns(
    gpu: &Gpu,
    direction: Columns,
    geometry: &ConvGeometry,
    first_channel: usize,
    images: usize,
    images_at: &Tensor,
    col: &Tensor,
) -> Result<()> {
    let per_image = geometry.group_channels * geometry.kernel.iter().product::<usize>() * geometry.output.iter().product::<usize>();
    let plane: usize = geometry.input.iter().product();
    if images == 0 || per_image == 0 || plane == 0 {
        return Ok(());
    }
    if col.size() < images * per_image || images_at.size() < images * geometry.channels * plane || col.dtype != images_at.dtype {
        crate::bail!(
            Shape,
            "convolution columns: {images} images do not fit {} {} and {} {}",
            images_at.shape,
            images_at.dtype,
            col.shape,
            col.dtype
        );
    }
    let mut shape = ConvShape::new(geometry, first_channel);
    let dtype = col.dtype;
    let (mut from, mut to) = match direction {
        Columns::FromImages => (images_at.raw() as u64, col.raw() as u64),
        Columns::IntoImages => (col.raw() as u64, images_at.raw() as u64),
    };
    let mut count = images as u64;
    let mut params = [param(&mut from), param(&mut to), param(&mut count), param(&mut shape)];
    let (family, threads_over) = match direction {
        Columns::FromImages => ("im2col", images * per_image),
        Columns::IntoImages => ("col2im", images * geometry.group_channels * plane),
    };
    let name = format!("ox_{family}_{}", dtype.name());
    let source = || match direction {
        Columns::FromImages => kernel_source::im2col_kernel(&name, dtype),
        Columns::IntoImages => kernel_source::col2im_kernel(&name, dtype),
    };
    // SAFETY: the parameters follow the kernel's signature; both arrays hold the images'
    // elements (checked above) and the calling op holds their vars.
    unsafe { gpu.launch(&name, source, gpu.blocks_for(threads_over, THREADS), THREADS, &mut params) }
}

/// The elements of `t` from element `offset` on, as a tensor of their own.
///
/// # Safety
/// `offset` must not exceed `t.size()`; the view is valid as long as `t`'s memory is.
pub unsafe fn elements_from(t: &Tensor, offset: usize) -> Tensor {
    debug_assert!(offset <= t.size());
    // SAFETY: the caller's contract keeps the address inside (or one past) t's memory.
    unsafe { Tensor::new(t.raw().add(offset * t.dtype.size()), Shape::new(vec![t.size() - offset]), t.dtype) }
}
