//! The operator registry: every operator is one typed definition in one file.
//!
//! An [`OpDef`] names the operator (and its MXNet aliases), documents it, and parses MXNet's
//! string attributes into an [`Operator`]: the typed instance that knows its inputs, infers
//! shapes and dtypes, and runs its kernel. Python generates `mx.nd.<op>` from [`Registry::defs`].
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::indexing_slicing))]

mod activation;
mod amp;
mod broadcast;
mod conv_epilogue;
mod conv_shifted;
mod convolution;
mod creation;
mod ctc;
pub mod custom;
mod deconvolution;
mod dropout;
mod elemwise_binary;
mod elemwise_unary;
pub mod fused;
mod gather_scatter;
pub mod grad;
mod group_norm;
mod image;
mod indexing;
mod kernel_args;
mod linalg;
mod linalg_la;
mod losses;
mod normalization;
mod optimizer_updates;
mod output_layers;
mod pad;
pub mod params;
mod pooling;
mod rearrange;
mod reduce;
mod rnn;
mod sampling;
mod select;
mod sequence;
mod shape_ops;
mod sorting;
mod stencil;
pub mod typed;
mod upsampling;

use std::sync::{Arc, OnceLock};

use crate::base::{Context, DType, PartialShape, Shape};
use crate::error::Result;
pub(crate) use conv_epilogue::convolution_with_epilogue;
pub use fused::FusedOp;
pub use kernel_args::{InOut, KernelArgs};
pub use params::{Attrs, ParamSpec, Params};
pub(crate) use shape_ops::cast_into;
pub use shape_ops::infer_reshape;

/// The float32 (or, with `bf16`, bfloat16) multiply-add peak of `threads` cores in GFLOP/s,
/// measured (see `backend::cpu::packed_gemm::peak_gflops`); None on CPUs without the kernel (AVX-512, and
/// AVX512-BF16 for bfloat16), where no probe exists yet.
pub fn cpu_peak_gflops(threads: usize, bf16: bool) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    return crate::backend::cpu::packed_gemm::peak_gflops(threads, bf16);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (threads, bf16);
        None
    }
}

/// A float32 element-wise kernel over one block of values: `out[i] = f(inputs[0][i], ...)`. It is
/// given exactly its operator's inputs, in order (the fusion pass makes one operand per input of
/// the node it fuses), so a kernel matches them by a slice pattern and writes nothing otherwise.
pub type BlockKernel = Arc<dyn Fn(&mut [f32], &[&[f32]]) + Send + Sync>;

/// What an element-wise operator contributes to fused and GPU kernels: its float32 block kernel
/// (CPU fusion) and its value as a CUDA C++ expression (NVRTC), in which `$0`, `$1` stand for its
/// operands and `$s` for its scalar parameter, all converted to the compute type: float for
/// 16- and 32-bit floats, double for float64; integers compute in double in unary math and in
/// long long in binary math, as the CPU kernels do.
#[derive(Clone)]
pub struct Elementwise {
    pub kernel: BlockKernel,
    pub cuda_expr: String,
    /// The scalar operand of `_<op>_scalar` operators.
    pub scalar: Option<f64>,
}

impl Elementwise {
    /// The CUDA expression with its operands and scalar filled in (see [`substitute_cuda`]).
    pub fn cuda_expr_of(&self, operands: &[&str], scalar: &str) -> String {
        substitute_cuda(&self.cuda_expr, operands, scalar)
    }
}

/// `template` with `$k` replaced by `operands[k]` and `$s` by `scalar`; operands other than
/// plain names go in parentheses so that the template's precedence is kept.
pub fn substitute_cuda(template: &str, operands: &[&str], scalar: &str) -> String {
    let mut text = String::new();
    let mut rest = template;
    while let Some(at) = rest.find('$') {
        text.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        let (operand, consumed) = if digits > 0 {
            (after[..digits].parse::<usize>().ok().and_then(|k| operands.get(k)).copied(), digits)
        } else if after.starts_with('s') {
            (Some(scalar), 1)
        } else {
            (None, 0)
        };
        match operand {
            Some(value) if value.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'$') => text.push_str(value),
            Some(value) => {
                text.push('(');
                text.push_str(value);
                text.push(')');
            }
            None => text.push('$'),
        }
        rest = &after[consumed..];
    }
    text.push_str(rest);
    text
}

/// What a reduction contributes to its GPU kernel: CUDA C++ code over the accumulator type (float
/// for 16- and 32-bit floats, double otherwise): the initial value, `acc` combined with element
/// `x`, two partial results `a` and `b` merged, and the result from `acc` and the element
/// `count`.
#[derive(Clone, Copy, Debug)]
pub struct Reduction {
    pub init: &'static str,
    pub step: &'static str,
    pub merge: &'static str,
    pub finish: &'static str,
}

/// A float64 value as a CUDA C++ double literal, infinities and NaN included.
pub fn cuda_double_literal(value: f64) -> String {
    if value.is_nan() {
        "__longlong_as_double(0x7ff8000000000000LL)".to_string()
    } else if value.is_infinite() {
        format!("{}__longlong_as_double(0x7ff0000000000000LL)", if value < 0.0 { "-" } else { "" })
    } else {
        format!("{value:e}")
    }
}

/// A tensor as a kernel sees it: memory the engine has granted to the running op.
#[derive(Clone, Debug)]
pub struct Tensor {
    ptr: *mut u8,
    pub shape: Shape,
    pub dtype: DType,
    /// `shape.size()`, worked out once: kernels and the dispatcher's checks ask for it often.
    len: usize,
}

// SAFETY: a Tensor is only created for an op the engine is running, and the engine grants that op
// shared access to what it reads and exclusive access to what it writes, on whichever thread runs it.
unsafe impl Send for Tensor {}
unsafe impl Sync for Tensor {}

impl Tensor {
    /// # Safety
    /// `ptr` must address `shape.size()` elements of `dtype` that stay valid and are not written
    /// by anyone else while the tensor is used.
    #[inline]
    pub unsafe fn new(ptr: *mut u8, shape: Shape, dtype: DType) -> Self {
        let len = shape.size();
        Tensor { ptr, shape, dtype, len }
    }
    #[inline]
    pub fn size(&self) -> usize {
        self.len
    }
    pub fn ptr<T>(&self) -> *mut T {
        debug_assert_eq!(std::mem::size_of::<T>(), self.dtype.size());
        self.ptr as *mut T
    }
    pub fn raw(&self) -> *mut u8 {
        self.ptr
    }
}

/// What a running kernel may ask of its environment.
#[derive(Clone, Copy, Debug, Default)]
pub struct ExecContext {
    /// Seed drawn for this op at push time (random operators), so results do not depend on timing.
    pub seed: u64,
    pub is_train: bool,
}

/// See [`Operator::gradient_identity`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GradientIdentity {
    /// The operator's name and attributes define it (every operator the registry makes from
    /// them).
    Attributes,
    /// They and this shared object do (a cached graph's compiled run, by address: the object
    /// lives as long as a gradient built from it).
    Shared(usize),
    /// The gradient uses what this one instance holds (a host callback, a subgraph): never
    /// reused for another call.
    Unique,
}

/// How an operator computes its outputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compute {
    /// A kernel over the arrays' elements ([`Operator::forward`] on the CPU, `forward_gpu` on a
    /// GPU), pushed onto the engine.
    Kernel,
    /// Whole arrays, by calling back into the host language (`CustomOp`, `autograd.Function`):
    /// [`Operator::compute_arrays`].
    Host,
    /// Whole arrays, by running the graphs the operator holds (control flow, a cached graph and
    /// its gradient): [`Operator::compute_arrays`].
    Graph,
}

impl std::fmt::Display for Compute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Compute::Kernel => "with a kernel",
            Compute::Host => "whole arrays in the host language",
            Compute::Graph => "whole arrays by running its graphs",
        })
    }
}

/// A parsed operator instance.
pub trait Operator: Send + Sync + 'static {
    /// Argument names of the inputs, in order (`data`, `lhs`/`rhs`, `weight`, ...).
    fn input_names(&self) -> Vec<String> {
        vec!["data".to_string()]
    }
    fn num_inputs(&self) -> usize {
        self.input_names().len()
    }
    /// Whether MXNet declares the input names (its FListInputNames): monitors and Gluon op hooks
    /// then call an input `<node>_<name>` (`fc_data`), otherwise `<node>_input<i>`.
    fn declares_input_names(&self) -> bool {
        true
    }
    fn num_outputs(&self) -> usize {
        1
    }
    /// Outputs a caller sees; the rest (Dropout's mask) exist for the gradient.
    fn num_visible_outputs(&self) -> usize {
        self.num_outputs()
    }
    /// How many of the last hidden outputs only the gradient reads (RNN's reserve space). An
    /// imperative call that is not recorded gets them empty (shape `(0,)`), and the kernel
    /// then keeps nothing for a backward pass that cannot follow.
    fn backward_only_outputs(&self) -> usize {
        0
    }
    /// Inputs the kernel updates in place (optimizer states such as momentum): the engine
    /// orders them as writes.
    fn mutated_inputs(&self) -> &[usize] {
        &[]
    }
    /// Output shapes from input shapes.
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>>;
    /// Fill in the shapes of inputs that are unknown (`None`) from those that are known: a
    /// layer's weight shape from its data (MXNet infers shapes in both directions this way).
    fn complete_input_shapes(&self, _inputs: &mut [Option<Shape>]) -> Result<()> {
        Ok(())
    }
    /// Two-way inference over partly known shapes (`None`: rank unknown; a [`PartialShape`]
    /// may have unknown dimensions), asked while some input is not fully known: refine inputs
    /// and outputs from what each tells about the other, as MXNet's shape functions do
    /// (`(0, 10) + (12, 0)` makes both `(12, 10)`). By default an element-wise operator of one
    /// input makes its input and output agree; other operators learn nothing.
    fn infer_partial_shapes(&self, inputs: &mut [Option<PartialShape>], outputs: &mut [Option<PartialShape>]) -> Result<()> {
        if inputs.len() == 1 && outputs.len() == 1 && self.elementwise().is_some() {
            crate::base::unify_partial(inputs, outputs)?;
        }
        Ok(())
    }
    /// Output shapes with unknown (0) dimensions, which MXNet 1.x symbols allow for creation ops
    /// (`zeros(shape=(2, 0, 8))`): shape inference completes them from what the consumer
    /// expects instead of computing them. `None` when the outputs are fully determined.
    fn partial_output_shapes(&self) -> Option<Vec<Shape>> {
        None
    }
    /// This operator with the unknown dimensions of [`Operator::partial_output_shapes`] filled in.
    fn with_output_shapes(&self, _shapes: &[Shape]) -> Result<Arc<dyn Operator>> {
        crate::bail!(Runtime, "the operator's output shapes are fully determined")
    }
    /// Whether output shapes depend on input values (`boolean_mask`): the caller then waits for
    /// the inputs and asks [`Operator::infer_shape_from_values`].
    fn shape_depends_on_values(&self) -> bool {
        false
    }
    /// Output shapes from the inputs' values, for operators whose shapes depend on them.
    fn infer_shape_from_values(&self, _inputs: &[Tensor]) -> Result<Vec<Shape>> {
        crate::bail!(Runtime, "the operator's output shape does not depend on input values")
    }
    /// Output dtypes from input dtypes; by default every input and output share one dtype.
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        same_dtype(inputs, self.num_outputs())
    }
    /// Output dtypes fixed by the parameters alone (Cast's `dtype`): inference knows them while
    /// an input's dtype is still unknown. `None` when they follow the inputs.
    fn fixed_output_types(&self) -> Option<Vec<DType>> {
        None
    }
    /// Fill in unknown input dtypes from known ones; by default they take the first known
    /// input's dtype (float32 when none is known), as the default dtype rule demands.
    fn complete_input_types(&self, inputs: &mut [Option<DType>]) {
        let fill = inputs.iter().flatten().next().copied().unwrap_or(DType::F32);
        for d in inputs.iter_mut().filter(|d| d.is_none()) {
            *d = Some(fill);
        }
    }
    /// Device for operators without inputs (creation ops); `None` means the caller's default.
    fn context(&self) -> Option<Context> {
        None
    }
    /// (input, output) pairs whose memory may be shared: the kernel is correct when the output
    /// aliases that input element for element.
    fn inplace_pairs(&self) -> &[(usize, usize)] {
        &[]
    }
    /// The operator as a float32 element-wise function of its same-shape inputs, if it is one:
    /// the fusion pass merges chains of such operators into one kernel.
    fn elementwise(&self) -> Option<Elementwise> {
        None
    }
    /// The operator as a reduction over some axes of its one input, if it is one.
    fn reduction(&self) -> Option<Reduction> {
        None
    }
    /// Whether equal inputs always give equal outputs, so that two nodes computing the same
    /// thing may be merged (MXNet's THasDeterministicOutput): false for random draws and for
    /// operators that run user code.
    fn deterministic(&self) -> bool {
        !self.needs_rng()
    }
    /// Whether the kernel draws random numbers: it then gets a seed drawn at push time.
    fn needs_rng(&self) -> bool {
        false
    }
    /// How the operator computes: a kernel over elements (the default) or whole arrays.
    fn compute(&self) -> Compute {
        Compute::Kernel
    }
    /// The CPU kernel, over the call's arrays lent as typed slices. Errors are reported on the
    /// outputs at the next sync point.
    fn forward(&self, _ctx: &ExecContext, _args: &KernelArgs) -> Result<()> {
        crate::bail!(Runtime, "the operator computes {}, not with a kernel", self.compute())
    }
    /// The kernel on a GPU: enqueue the work on `gpu`'s stream over device tensors. An
    /// element-wise operator has one generated from its [`Operator::elementwise`] expression;
    /// other operators define their own, and one without a GPU kernel says so.
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        match (self.elementwise(), outputs) {
            (Some(op), [output]) => crate::backend::cuda::kernels::elementwise(gpu, &op, inputs, output),
            _ => crate::bail!(Device, "the operator has no kernel for {} yet (it runs on cpu contexts)", gpu.context()),
        }
    }
    /// The outputs of an operator that computes whole arrays ([`Compute::Host`],
    /// [`Compute::Graph`]). `into` may name arrays to compute outputs into (an operator is free
    /// to ignore it; the caller copies what did not land there).
    fn compute_arrays(&self, _inputs: &[crate::ndarray::NDArray], _into: &[Option<crate::ndarray::NDArray>]) -> Result<Vec<crate::ndarray::NDArray>> {
        crate::bail!(Runtime, "the operator computes {}, not on whole arrays", self.compute())
    }
    /// What besides the graph around it and the shapes decides this operator's gradient: autograd
    /// reuses the compiled gradient of a recording that repeats an earlier one node for node.
    fn gradient_identity(&self) -> GradientIdentity {
        GradientIdentity::Attributes
    }
    /// Input gradients as graph nodes of registered operators (see [`grad`]).
    fn gradient(&self, _g: &mut grad::Grad) -> Result<grad::InputGrads> {
        crate::bail!(Value, "the operator is non-differentiable: it has no gradient definition")
    }
    /// The graphs a control flow operator holds (a loop body, a branch), which Symbol JSON
    /// stores under the node's `subgraphs`.
    fn subgraphs(&self) -> Vec<crate::symbol::Symbol> {
        Vec::new()
    }
}

/// Gradient of an operator whose output does not change under small input changes (rounding,
/// comparisons, indices, creation from a shape): zero for every input.
pub(crate) fn zero_gradient(g: &grad::Grad) -> Result<grad::InputGrads> {
    Ok(vec![None; g.num_inputs()])
}

/// A gradient operator's check that the output gradient it was given has the shape its forward
/// operator produced: with any other shape, part of the input gradient would go unwritten or the
/// kernel would read past the gradient.
pub(crate) fn check_out_grad(op: &str, grad: &Shape, forward_output: &Shape) -> Result<()> {
    if grad != forward_output {
        crate::bail!(Shape, "{op}: the output gradient has shape {grad}, expected {forward_output} (the forward output's shape)");
    }
    Ok(())
}

/// The first input's shape of a variadic operator, or an error when it was given none.
pub(crate) fn first_input<'a>(op: &str, inputs: &'a [Shape]) -> Result<&'a Shape> {
    inputs.first().ok_or_else(|| crate::err!(Shape, "{op}: at least one input is needed, got none"))
}

/// The `N` inputs (or outputs) an operator was given, as an array to destructure: `let [x] =
/// exactly(op, "input", inputs)?;`. Callers check the count first, so this is the checked
/// form of indexing that never panics.
pub(crate) fn exactly<'a, T, const N: usize>(op: &str, what: &str, items: &'a [T]) -> Result<&'a [T; N]> {
    items.try_into().map_err(|_| crate::err!(Value, "{op}: {N} {what}(s) expected, got {}", items.len()))
}

/// `values[start..start + len]`, or an error of `op` naming the block: the checked slicing of
/// kernels that walk blocks of a buffer (an impossible geometry becomes an error, never a panic).
#[inline]
pub(crate) fn part<'a, T>(op: &str, values: &'a [T], start: usize, len: usize, what: &str) -> Result<&'a [T]> {
    values.get(start..start.saturating_add(len)).ok_or_else(|| outside(op, what, start, len, values.len()))
}

/// `values[start..start + len]` to write, or an error of `op` naming the block.
#[inline]
pub(crate) fn part_mut<'a, T>(op: &str, values: &'a mut [T], start: usize, len: usize, what: &str) -> Result<&'a mut [T]> {
    let total = values.len();
    values.get_mut(start..start.saturating_add(len)).ok_or_else(|| outside(op, what, start, len, total))
}

/// `values[start..]`, or an error of `op` naming the block.
#[inline]
pub(crate) fn tail<'a, T>(op: &str, values: &'a [T], start: usize, what: &str) -> Result<&'a [T]> {
    values.get(start..).ok_or_else(|| outside(op, what, start, 0, values.len()))
}

/// `values[start..]` to write, or an error of `op` naming the block.
#[inline]
pub(crate) fn tail_mut<'a, T>(op: &str, values: &'a mut [T], start: usize, what: &str) -> Result<&'a mut [T]> {
    let total = values.len();
    values.get_mut(start..).ok_or_else(|| outside(op, what, start, 0, total))
}

/// The error of a block `[start, start + len)` that does not lie within a buffer of `total` elements.
#[cold]
pub(crate) fn outside(op: &str, what: &str, start: usize, len: usize, total: usize) -> crate::error::Error {
    crate::err!(Runtime, "{op}: {what} [{start}, {}) lies outside its {total} elements", start.saturating_add(len))
}

/// Shared dtype check: all inputs have one dtype, which every output takes.
pub fn same_dtype(inputs: &[DType], num_outputs: usize) -> Result<Vec<DType>> {
    let Some(&first) = inputs.first() else {
        crate::bail!(Type, "cannot infer the output dtype without inputs");
    };
    if let Some(other) = inputs.iter().find(|&&d| d != first) {
        crate::bail!(Type, "inputs must share one dtype, got {first} and {other}");
    }
    Ok(vec![first; num_outputs])
}

/// One registered operator.
pub struct OpDef {
    pub name: &'static str,
    pub aliases: &'static [&'static str],
    pub doc: &'static str,
    /// Inputs taken as a variable-length list (`Concat`, `add_n`): `num_args` counts them.
    pub variadic: bool,
    pub params: fn() -> Vec<ParamSpec>,
    pub create: Box<dyn Fn(&str, &Attrs) -> Result<Arc<dyn Operator>> + Send + Sync>,
}

impl OpDef {
    /// Register an operator whose parameters are `P` and whose instance `build` makes from them.
    pub fn new<P: Params + 'static, O: Operator>(
        name: &'static str,
        aliases: &'static [&'static str],
        doc: &'static str,
        build: impl Fn(P) -> Result<O> + Send + Sync + 'static,
    ) -> Self {
        OpDef {
            name,
            aliases,
            doc,
            variadic: false,
            params: P::specs,
            create: Box::new(move |called_as, attrs| {
                let p = P::parse(called_as, attrs)?;
                Ok(Arc::new(build(p).map_err(|e| e.context(format!("operator {called_as}")))?) as Arc<dyn Operator>)
            }),
        }
    }

    pub fn variadic(mut self) -> Self {
        self.variadic = true;
        self
    }

    /// Parse `attrs` into an instance, naming the operator as it was called.
    pub fn instantiate(&self, called_as: &str, attrs: &Attrs) -> Result<Arc<dyn Operator>> {
        let operator = (self.create)(called_as, attrs)?;
        // Every variadic operator's inference and kernel read its first input; a call with none
        // is refused here, once for all of them, imperative and symbolic alike.
        if self.variadic && operator.num_inputs() == 0 {
            crate::bail!(Param, "operator {called_as}: at least one input is needed (num_args is 0)");
        }
        Ok(operator)
    }
}

pub struct Registry {
    defs: Vec<OpDef>,
    /// Looked up on every imperative call: with the default (SipHash) hasher hashing the name
    /// took 3% of a 2x2 add; FxHash needs no protection against chosen keys here.
    by_name: rustc_hash::FxHashMap<&'static str, usize>,
}

impl Registry {
    fn add(&mut self, def: OpDef) {
        let index = self.defs.len();
        for name in std::iter::once(def.name).chain(def.aliases.iter().copied()) {
            let previous = self.by_name.insert(name, index);
            assert!(previous.is_none(), "operator name {name} registered twice");
        }
        self.defs.push(def);
    }

    pub fn get(&self, name: &str) -> Result<&OpDef> {
        self.by_name.get(name).and_then(|&i| self.defs.get(i)).ok_or_else(|| crate::err!(Param, "operator '{name}' is not registered"))
    }

    pub fn defs(&self) -> &[OpDef] {
        &self.defs
    }
}

pub fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let mut r = Registry { defs: Vec::new(), by_name: rustc_hash::FxHashMap::default() };
        let mut add = |d: OpDef| r.add(d);
        elemwise_unary::register(&mut add);
        elemwise_binary::register(&mut add);
        reduce::register(&mut add);
        linalg::register(&mut add);
        linalg_la::register(&mut add);
        shape_ops::register(&mut add);
        indexing::register(&mut add);
        rearrange::register(&mut add);
        select::register(&mut add);
        sorting::register(&mut add);
        gather_scatter::register(&mut add);
        pad::register(&mut add);
        image::register(&mut add);
        sampling::register(&mut add);
        activation::register(&mut add);
        convolution::register(&mut add);
        deconvolution::register(&mut add);
        pooling::register(&mut add);
        normalization::register(&mut add);
        group_norm::register(&mut add);
        upsampling::register(&mut add);
        rnn::register(&mut add);
        sequence::register(&mut add);
        output_layers::register(&mut add);
        losses::register(&mut add);
        ctc::register(&mut add);
        dropout::register(&mut add);
        optimizer_updates::register(&mut add);
        creation::register(&mut add);
        custom::register(&mut add);
        amp::register(&mut add);
        r
    })
}

pub fn lookup(name: &str) -> Result<&'static OpDef> {
    registry().get(name)
}

/// The f64 sum of `term(a[i], b[i])` over eight independent accumulators: a single running sum
/// serializes every addition on the adder's latency, lanes let the compiler use vectors.
/// `#[inline(always)]` so that it compiles inside the caller's `simd::vectorized` body.
#[inline(always)]
pub(crate) fn sum_lanes<T: crate::base::Elem>(a: &[T], b: &[T], term: impl Fn(f64, f64) -> f64) -> f64 {
    const LANES: usize = 8;
    let mut lanes = [0f64; LANES];
    let (a_blocks, a_tail) = a.as_chunks::<LANES>();
    let (b_blocks, b_tail) = b.as_chunks::<LANES>();
    for (x, y) in a_blocks.iter().zip(b_blocks) {
        for ((lane, x), y) in lanes.iter_mut().zip(x).zip(y) {
            *lane += term(x.to_f64(), y.to_f64());
        }
    }
    let tail: f64 = a_tail.iter().zip(b_tail).map(|(x, y)| term(x.to_f64(), y.to_f64())).sum();
    lanes.iter().sum::<f64>() + tail
}

/// Run `f` over `0..n` in parallel chunks when `n` is large enough to pay for the threads.
pub(crate) fn parallel_chunks(n: usize, min_chunk: usize, f: impl Fn(std::ops::Range<usize>) + Sync) {
    let threads = crate::engine::parallel::threads();
    if n <= min_chunk || threads <= 1 {
        f(0..n);
        return;
    }
    let chunk = (n.div_ceil(threads * 4)).max(min_chunk);
    crate::engine::parallel::run(n.div_ceil(chunk), &|p| f(p * chunk..((p + 1) * chunk).min(n)));
}

/// `f(first_unit, piece)` over `out` cut into pieces of whole units (`unit` elements each, the
/// last unit possibly shorter), in parallel when it holds more than `min_units` units: the
/// counterpart of [`parallel_chunks`] for a kernel holding its output as a slice. Pieces are
/// split as `parallel_chunks` splits, so the two parallelize alike. The first error is returned.
#[inline]
pub(crate) fn parallel_units<T: Send>(out: &mut [T], unit: usize, min_units: usize, f: impl Fn(usize, &mut [T]) -> Result<()> + Sync) -> Result<()> {
    let unit = unit.max(1);
    let units = out.len().div_ceil(unit);
    let threads = crate::engine::parallel::threads();
    // One piece runs here, generically, so that `f` inlines into a caller compiled for the
    // CPU's vectors.
    if units <= min_units || threads <= 1 {
        return f(0, out);
    }
    pieces_on_pool(out, unit, units, min_units, threads, &f)
}

/// [`parallel_units`]' pieces on the pool, compiled once per element type rather than once per
/// kernel (see `engine::parallel::map_owned` on what generic closures cost the build).
fn pieces_on_pool<T: Send>(
    out: &mut [T],
    unit: usize,
    units: usize,
    min_units: usize,
    threads: usize,
    f: &(dyn Fn(usize, &mut [T]) -> Result<()> + Sync),
) -> Result<()> {
    let per_piece = units.div_ceil(threads * 4).max(min_units);
    let pieces: Vec<&mut [T]> = out.chunks_mut(per_piece * unit).collect();
    crate::engine::parallel::map_owned(pieces, |p, piece| f(p * per_piece, piece)).into_iter().collect()
}

/// Zeroed temporary memory for a kernel, from the pooled host allocator: large scratch buffers
/// (im2col columns, per-channel partials) reuse already-touched pages instead of faulting in fresh
/// ones on every call.
pub(crate) struct Scratch<T> {
    buffer: crate::storage::Buffer,
    len: usize,
    _elements: std::marker::PhantomData<T>,
}

impl<T: crate::base::Elem> Scratch<T> {
    pub(crate) fn zeroed(len: usize) -> Result<Scratch<T>> {
        let bytes = len * std::mem::size_of::<T>();
        let buffer = crate::storage::alloc(Context::cpu(0), bytes)?;
        // SAFETY: the buffer holds at least `bytes` bytes and nobody else can reach it yet; all
        // element types are plain data for which all-zero bytes are a valid value.
        unsafe { std::ptr::write_bytes(buffer.as_ptr(), 0, bytes) };
        Ok(Scratch { buffer, len, _elements: std::marker::PhantomData })
    }
    pub(crate) fn as_slice(&self) -> &[T] {
        // SAFETY: `len` initialized elements of T live in the buffer, which this value owns.
        unsafe { std::slice::from_raw_parts(self.buffer.as_ptr() as *const T, self.len) }
    }
    pub(crate) fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: `len` initialized elements of T live in the buffer, which this value owns.
        unsafe { std::slice::from_raw_parts_mut(self.buffer.as_ptr() as *mut T, self.len) }
    }
}

/// Elements below which element-wise kernels stay on one thread.
pub(crate) const PARALLEL_GRAIN: usize = 1 << 15;

/// A raw pointer that kernels hand to worker threads.
pub(crate) struct SendPtr<T>(pub *mut T);

// Manual impls: a raw pointer is Copy whatever it points to (derive would demand T: Copy).
impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SendPtr<T> {}
// SAFETY: kernels only share SendPtrs across threads for disjoint index ranges of one buffer the
// engine has granted to the running op.
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}

impl<T> SendPtr<T> {
    #[inline(always)]
    pub fn get(self) -> *mut T {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_has_mxnet_names_and_aliases() {
        for name in [
            "broadcast_add",
            "elemwise_add",
            "_plus",
            "_Plus",
            "sum",
            "dot",
            "batch_dot",
            "transpose",
            "Concat",
            "concat",
            "SliceChannel",
            "split",
            "Cast",
            "cast",
            "_random_uniform",
            "_random_normal",
            "exp",
            "_plus_scalar",
            "Reshape",
        ] {
            assert!(lookup(name).is_ok(), "{name} missing");
        }
        assert!(lookup("no_such_op").err().unwrap().message.contains("no_such_op"));
    }
}
