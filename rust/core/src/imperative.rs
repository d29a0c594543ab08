//! Imperative invocation: look an operator up, infer what it produces, allocate its outputs and
//! push its kernel onto the engine. `mx.nd.<op>(...)` ends here.
// Programs' arguments and saved graphs arrive here: no unwrap and no unchecked indexing, so that
// bad input can only ever produce an error (issue 23's lint discipline, as in `io`).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::indexing_slicing))]

use std::sync::Arc;

use crate::autograd;
use crate::base::{Context, DType, Shape};
use crate::engine::{self, OpDescription, PushProps};
use crate::error::Result;
use crate::ndarray::NDArray;
use crate::op::{self, Attrs, Compute, ExecContext, KernelArgs, Operator};

/// Outputs at most this large run on the pushing thread when their inputs are ready: a thread
/// hand-off costs more than the kernel.
const INLINE_MAX_ELEMENTS: usize = 1 << 13;

/// Where an operation was pushed from, resolved to text only if it fails (resolving a source
/// line costs more than running a small op).
pub trait PushSite: Send + Sync {
    fn location(&self) -> String;
    /// Whether this site reads the caller's state only when asked (the Python binding's walks
    /// the interpreter's frames): an op that may fail later, on another thread, keeps what
    /// [`PushSite::capture`] gives instead. An op that runs at once never needs to.
    fn is_deferred(&self) -> bool {
        false
    }
    /// A deferred site's caller as it is now.
    fn capture(&self) -> Site {
        None
    }
}

/// `site` in the form an op that may run later keeps.
fn pinned(site: &Site) -> Site {
    site.as_ref().and_then(|s| if s.is_deferred() { s.capture() } else { Some(s.clone()) })
}

impl PushSite for String {
    fn location(&self) -> String {
        self.clone()
    }
}

pub type Site = Option<Arc<dyn PushSite>>;

/// How a pushed op names itself if it fails later.
struct OpCall {
    name: String,
    inputs: Vec<(Shape, DType)>,
    site: Site,
}

impl OpDescription for OpCall {
    fn describe(&self) -> String {
        let mut s = format!("operator {}({})", self.name, describe_inputs(&self.inputs));
        if let Some(site) = &self.site {
            s.push_str(&format!(", pushed from {}", site.location()));
        }
        s
    }
    fn name(&self) -> String {
        self.name.clone()
    }
    fn inputs(&self) -> String {
        describe_inputs(&self.inputs)
    }
    fn site(&self) -> Option<String> {
        self.site.as_ref().map(|site| site.location())
    }
}

fn describe_inputs(inputs: &[(Shape, DType)]) -> String {
    inputs.iter().map(|(s, d)| format!("{s} {d}")).collect::<Vec<_>>().join(", ")
}

/// Invoke the operator registered as `name` (or an alias).
pub fn invoke(name: &str, inputs: &[NDArray], attrs: &Attrs, out: Option<Vec<NDArray>>, default_ctx: Context, site: Site) -> Result<Vec<NDArray>> {
    let def = op::lookup(name)?;
    let instance = def.instantiate(name, attrs)?;
    invoke_operator(name, instance, attrs, inputs, out, default_ctx, site)
}

/// Invoke an already parsed operator instance: validate the call, let a host-computed
/// operator run, else allocate the outputs, keep them from aliasing an input unsafely, push the
/// kernel and record the call for autograd.
pub fn invoke_operator(
    name: &str,
    operator: Arc<dyn Operator>,
    attrs: &Attrs,
    inputs: &[NDArray],
    out: Option<Vec<NDArray>>,
    default_ctx: Context,
    site: Site,
) -> Result<Vec<NDArray>> {
    let fail = |e: crate::Error| e.context(format!("operator {name}({})", describe_inputs(&shapes_and_types(inputs))));
    let ctx = validate(operator.as_ref(), inputs, default_ctx).map_err(fail)?;
    let host_into: Vec<Option<NDArray>> = out.iter().flatten().cloned().map(Some).collect();
    if operator.compute() != Compute::Kernel {
        let outputs = operator.compute_arrays(inputs, &host_into).map_err(fail)?;
        for (given, computed) in out.iter().flatten().zip(&outputs) {
            if !given.same_data(computed) {
                copy(computed, given, site.clone()).map_err(fail)?;
            }
        }
        let outputs = match out {
            Some(given) => given.into_iter().chain(outputs.into_iter().skip(host_into.len())).collect(),
            None => outputs,
        };
        return Ok(record_if_needed(name, operator, attrs, inputs, outputs));
    }
    let outputs = allocate_outputs(operator.as_ref(), inputs, out, ctx).map_err(fail)?;
    push_into(name, &operator, inputs, &outputs, ctx, &site)?;
    Ok(record_if_needed(name, operator, attrs, inputs, outputs))
}

/// Push `operator`'s kernel writing `outputs` (staged through temporaries where an output
/// aliases an input unsafely); under the naive engine, wait for it.
fn push_into(name: &str, operator: &Arc<dyn Operator>, inputs: &[NDArray], outputs: &[NDArray], ctx: Context, site: &Site) -> Result<()> {
    match staging_for_unsafe_aliases(operator.as_ref(), inputs, outputs, ctx)? {
        None => push_kernel(name, operator, inputs, outputs, site),
        Some(staged) => {
            push_kernel(name, operator, inputs, &staged, site);
            for (tmp, dst) in staged.iter().zip(outputs) {
                copy(tmp, dst, site.clone())?;
            }
        }
    }
    if engine::kind() == engine::EngineKind::Naive {
        // The naive engine is for debugging: a failing kernel raises at its own call.
        for o in outputs {
            o.wait_to_read()?;
        }
    }
    Ok(())
}

/// Push `operator`'s kernel on `inputs` into `outputs`, whose shapes and dtypes a compiled
/// graph's inference fixed for its input signature: [`invoke_operator`] without inferring and
/// checking again on every call (a graph's steps were checked when it was compiled). Not
/// recorded: the caller runs it only while autograd does not record.
pub fn invoke_inferred(name: &str, operator: &Arc<dyn Operator>, inputs: &[NDArray], outputs: Vec<NDArray>) -> Result<Vec<NDArray>> {
    let Some(ctx) = outputs.first().or(inputs.first()).map(NDArray::context) else {
        return Ok(outputs);
    };
    push_into(name, operator, inputs, &outputs, ctx, &None)?;
    Ok(outputs)
}

/// The device the call runs on, after checking its arity and that its inputs share one host
/// device.
fn validate(operator: &dyn Operator, inputs: &[NDArray], default_ctx: Context) -> Result<Context> {
    if operator.num_inputs() != inputs.len() {
        let names = operator.input_names();
        crate::bail!(Value, "expects {} input(s) ({}), got {}", names.len(), names.join(", "), inputs.len());
    }
    let ctx = match inputs.first() {
        Some(first) => {
            let ctx = first.context();
            if let Some(other) = inputs.iter().find(|a| a.context() != ctx) {
                crate::bail!(Device, "inputs live on different devices: {ctx} and {}", other.context());
            }
            ctx
        }
        None => operator.context().unwrap_or(default_ctx),
    };
    // The device must exist (and open) before work is queued for it.
    crate::backend::check_device(ctx)?;
    Ok(ctx)
}

/// The call's outputs: inferred shapes and dtypes, the caller's arrays where given (checked
/// against them; hidden outputs may be left out), new arrays elsewhere.
fn allocate_outputs(operator: &dyn Operator, inputs: &[NDArray], out: Option<Vec<NDArray>>, ctx: Context) -> Result<Vec<NDArray>> {
    let in_shapes: smallvec::SmallVec<[Shape; 4]> = inputs.iter().map(|a| a.shape().clone()).collect();
    let in_types: smallvec::SmallVec<[DType; 4]> = inputs.iter().map(NDArray::dtype).collect();
    let out_shapes = if operator.shape_depends_on_values() {
        operator.infer_shape(&in_shapes)?;
        if !ctx.is_host() {
            crate::bail!(Device, "operators whose output shape depends on input values run on cpu contexts only, not {ctx}");
        }
        for a in inputs {
            a.wait_to_read()?;
        }
        let tensors: Vec<_> = inputs.iter().map(NDArray::tensor).collect::<Result<_>>()?;
        operator.infer_shape_from_values(&tensors)?
    } else {
        operator.infer_shape(&in_shapes)?
    };
    let out_types = operator.infer_type(&in_types)?;
    let Some(given) = out else {
        let kept_for_backward = if autograd::should_record(inputs) { 0 } else { operator.backward_only_outputs() };
        let needed = out_shapes.len().saturating_sub(kept_for_backward);
        return out_shapes
            .iter()
            .zip(&out_types)
            .enumerate()
            .map(|(i, (s, &d))| NDArray::empty(if i < needed { s.clone() } else { Shape::new(vec![0]) }, d, ctx))
            .collect();
    };
    if autograd::is_recording() && given.iter().any(autograd::is_marked_variable) {
        crate::bail!(
            Value,
            "Assigning to NDArrays that are already in a computational graph will cause undefined behavior when \
             evaluating gradients. Please call backward first to clear the graph or do this out side of a record \
             section. Also note that you cannot use inplace operations like +=, *=, relu(x, out=x), y[idx]=x, etc \
             inside a record section."
        );
    }
    if autograd::should_record(inputs) && given.iter().any(|g| inputs.iter().any(|i| g.same_chunk(i))) {
        // Recording would make the written array both an input and an output of one node.
        crate::bail!(Value, "Inplace operations (+=, -=, x[:]=, etc) are not supported when recording with autograd.");
    }
    let visible = operator.num_visible_outputs();
    if given.len() != visible && given.len() != out_shapes.len() {
        crate::bail!(Value, "has {visible} output(s), {} given as out", given.len());
    }
    // A backward-only output may be given empty: the caller's plan has no gradient to keep it for.
    let backward_only = out_shapes.len().saturating_sub(operator.backward_only_outputs());
    for (i, (g, (shape, &dtype))) in given.iter().zip(out_shapes.iter().zip(&out_types)).enumerate() {
        let emptied = i >= backward_only && g.size() == 0;
        if (g.shape() != shape && !emptied) || g.dtype() != dtype {
            crate::bail!(Shape, "out[{i}] has shape {} and dtype {}, but the result has shape {shape} and dtype {dtype}", g.shape(), g.dtype());
        }
        if g.context() != ctx {
            crate::bail!(Device, "out[{i}] lives on {}, the inputs on {ctx}", g.context());
        }
    }
    let hidden = out_shapes.iter().zip(&out_types).skip(given.len()).map(|(shape, &dtype)| NDArray::empty(shape.clone(), dtype, ctx));
    given.into_iter().map(Ok).chain(hidden).collect()
}

/// Temporaries for the kernel to write instead of the outputs (copied over afterwards) when an
/// output overlaps an input in a way the operator does not declare safe; None when it may write
/// the outputs themselves.
fn staging_for_unsafe_aliases(operator: &dyn Operator, inputs: &[NDArray], outputs: &[NDArray], ctx: Context) -> Result<Option<Vec<NDArray>>> {
    let pairs = operator.inplace_pairs();
    let unsafe_alias = outputs
        .iter()
        .enumerate()
        .any(|(o, out)| inputs.iter().enumerate().any(|(i, inp)| out.same_chunk(inp) && !(pairs.contains(&(i, o)) && out.same_data(inp))));
    if !unsafe_alias {
        return Ok(None);
    }
    outputs.iter().map(|o| NDArray::empty(o.shape().clone(), o.dtype(), ctx)).collect::<Result<_>>().map(Some)
}

fn shapes_and_types(arrays: &[NDArray]) -> Vec<(Shape, DType)> {
    arrays.iter().map(|a| (a.shape().clone(), a.dtype())).collect()
}

/// Run the operator's forward kernel on arrays its caller holds the vars of.
fn run_kernel(operator: &dyn Operator, exec: &ExecContext, inputs: &[NDArray], outputs: &[NDArray]) -> Result<()> {
    // Filled in place: collecting through a Result would copy the inline arrays once more.
    let (mut ins, mut outs) = (smallvec::SmallVec::<[_; 4]>::new(), smallvec::SmallVec::<[_; 2]>::new());
    for a in inputs {
        ins.push(a.tensor()?);
    }
    for a in outputs {
        outs.push(a.tensor()?);
    }
    match outputs.first().or(inputs.first()).map(NDArray::context) {
        #[cfg(feature = "cuda")]
        Some(ctx) if !ctx.is_host() => operator.forward_gpu(crate::backend::cuda::gpu(ctx)?, exec, &ins, &outs),
        _ => {
            // SAFETY: the tensors view arrays this call holds (the caller holds their vars: read
            // access to the inputs, write access to the outputs and mutated inputs), and only
            // these arguments reach them while the kernel runs.
            let args = unsafe { KernelArgs::new(&ins, &outs, operator.inplace_pairs(), operator.mutated_inputs()) }?;
            operator.forward(exec, &args)
        }
    }
}

/// Run the operator's kernel reading `inputs` and writing `targets` (and its mutated inputs,
/// and the random generator when it draws numbers): at once on this thread when it is small and
/// its arrays are free, else pushed onto the engine.
fn push_kernel(name: &str, operator: &Arc<dyn Operator>, inputs: &[NDArray], targets: &[NDArray], site: &Site) {
    let seed = if operator.needs_rng() { crate::random::next_op_seed() } else { 0 };
    let exec = ExecContext { seed, is_train: autograd::is_training() };
    let reads: smallvec::SmallVec<[&Arc<engine::Var>; 4]> = inputs.iter().map(NDArray::var).collect();
    let mutated = operator.mutated_inputs().iter().filter_map(|&i| inputs.get(i));
    let mut writes: smallvec::SmallVec<[&Arc<engine::Var>; 4]> = targets.iter().chain(mutated).map(NDArray::var).collect();
    if operator.needs_rng() {
        writes.push(crate::random::engine_var());
    }
    let work_items: usize = targets.iter().map(NDArray::size).sum::<usize>().max(inputs.iter().map(NDArray::size).max().unwrap_or(0));
    let small = work_items <= INLINE_MAX_ELEMENTS;
    let describe = || -> Box<dyn OpDescription> { Box::new(OpCall { name: name.to_string(), inputs: shapes_and_types(inputs), site: pinned(site) }) };
    if small && engine::run_if_free(|| run_kernel(operator.as_ref(), &exec, inputs, targets), &reads, &writes, describe).is_ok() {
        return;
    }
    let kernel_inputs: Vec<NDArray> = inputs.iter().map(NDArray::detached).collect();
    let kernel_outputs: Vec<NDArray> = targets.iter().map(NDArray::detached).collect();
    let kernel_op = operator.clone();
    let owned = |vars: &[&Arc<engine::Var>]| -> Vec<Arc<engine::Var>> { vars.iter().map(|&v| v.clone()).collect() };
    engine::push(
        Box::new(move || run_kernel(kernel_op.as_ref(), &exec, &kernel_inputs, &kernel_outputs)),
        &owned(&reads),
        &owned(&writes),
        PushProps { inline_if_ready: small },
        describe(),
    );
}

/// `outputs`, recorded as one node of the autograd graph when the call is recorded.
fn record_if_needed(name: &str, operator: Arc<dyn Operator>, attrs: &Attrs, inputs: &[NDArray], outputs: Vec<NDArray>) -> Vec<NDArray> {
    if autograd::should_record(inputs) {
        autograd::record(name, operator, attrs, inputs, outputs)
    } else {
        outputs
    }
}

/// [`invoke_operator`] writing output i into `into[i]` where given (shape and dtype must match)
/// and into a fresh array elsewhere.
pub fn invoke_operator_into(
    name: &str,
    operator: Arc<dyn Operator>,
    attrs: &Attrs,
    inputs: &[NDArray],
    into: Vec<Option<NDArray>>,
    ctx: Context,
) -> Result<Vec<NDArray>> {
    if operator.shape_depends_on_values() {
        // Its output shapes are known only once the inputs are computed.
        return invoke_operator(name, operator, attrs, inputs, None, ctx, None);
    }
    let shapes = operator.infer_shape(&inputs.iter().map(|a| a.shape().clone()).collect::<Vec<_>>())?;
    let types = operator.infer_type(&inputs.iter().map(NDArray::dtype).collect::<Vec<_>>())?;
    let out = into
        .into_iter()
        .zip(shapes.into_iter().zip(types))
        .map(|(given, (shape, dtype))| given.map_or_else(|| NDArray::empty(shape, dtype, inputs.first().map_or(ctx, NDArray::context)), Ok))
        .collect::<Result<Vec<_>>>()?;
    invoke_operator(name, operator, attrs, inputs, Some(out), ctx, None)
}

/// Push a copy of `src` into `dst` (same shape; dtypes may differ, in which case it casts), on
/// one device or between devices.
pub fn copy(src: &NDArray, dst: &NDArray, site: Site) -> Result<()> {
    if src.shape() != dst.shape() {
        crate::bail!(Shape, "copyto: source shape {} differs from destination shape {}", src.shape(), dst.shape());
    }
    if src.same_data(dst) && src.dtype() == dst.dtype() {
        return Ok(());
    }
    crate::backend::check_device(src.context())?;
    crate::backend::check_device(dst.context())?;
    // Host memory of every flavour (cpu, cpu_pinned, cpu(1)) is one space to the host kernels.
    let one_space = src.context() == dst.context() || (src.context().is_host() && dst.context().is_host());
    if src.same_chunk(dst) || (!one_space && src.dtype() != dst.dtype()) {
        // Overlapping views of one chunk: stage through a temporary so no copy reads what it
        // wrote. Between devices: cast where the data is, then move it.
        let staged = NDArray::empty(src.shape().clone(), dst.dtype(), src.context())?;
        copy(src, &staged, site.clone())?;
        return copy(&staged, dst, site);
    }
    let work = if one_space { cast_on_device } else { transfer };
    let small = dst.size() <= INLINE_MAX_ELEMENTS;
    let describe = || -> Box<dyn OpDescription> {
        Box::new(OpCall { name: "_copyto".into(), inputs: shapes_and_types(std::slice::from_ref(src)), site: pinned(&site) })
    };
    if small && engine::run_if_free(|| work(src, dst), &[src.var()], &[dst.var()], describe).is_ok() {
        return Ok(());
    }
    let (s, d) = (src.clone(), dst.clone());
    engine::push(Box::new(move || work(&s, &d)), &[src.var().clone()], &[dst.var().clone()], PushProps { inline_if_ready: small }, describe());
    Ok(())
}

/// `dst = src` converted to dst's dtype, both on one device; run by an op holding their vars.
fn cast_on_device(src: &NDArray, dst: &NDArray) -> Result<()> {
    let (s, d) = (src.tensor()?, dst.tensor()?);
    match src.context() {
        #[cfg(feature = "cuda")]
        ctx if !ctx.is_host() => crate::backend::cuda::kernels::cast(crate::backend::cuda::gpu(ctx)?, &s, &d),
        // SAFETY: the caller holds src's var for reading and dst's for writing; they are
        // different chunks (`copy` stages copies within one chunk), reached only here.
        _ => unsafe { op::cast_into(&s, &d) },
    }
}

/// `dst = src` between two devices, one dtype; run by an op holding their vars.
#[cfg(feature = "cuda")]
fn transfer(src: &NDArray, dst: &NDArray) -> Result<()> {
    use crate::backend::cuda::gpu;
    let (s, d) = (src.tensor()?, dst.tensor()?);
    let bytes = src.nbytes();
    match (src.context().is_host(), dst.context().is_host()) {
        // SAFETY (all three): the op holds src's var for reading and dst's for writing, so both
        // hold `bytes` bytes that nothing else writes meanwhile; host slices are host memory.
        (true, false) => unsafe { gpu(dst.context())?.copy_from_host(d.raw(), std::slice::from_raw_parts(s.raw(), bytes)) },
        (false, true) => unsafe { gpu(src.context())?.copy_to_host(std::slice::from_raw_parts_mut(d.raw(), bytes), s.raw()) },
        _ => {
            // Between two GPUs through the host: correct on any pair of devices, peer access
            // or not.
            let mut staging = vec![0u8; bytes];
            unsafe { gpu(src.context())?.copy_to_host(&mut staging, s.raw())? };
            unsafe { gpu(dst.context())?.copy_from_host(d.raw(), &staging) }
        }
    }
}

#[cfg(not(feature = "cuda"))]
fn transfer(src: &NDArray, dst: &NDArray) -> Result<()> {
    let gpu = if src.context().is_host() { dst.context() } else { src.context() };
    Err(crate::backend::gpu_unavailable(gpu))
}
