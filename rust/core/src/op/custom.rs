//! `Custom`: operators written in the host language (MXNet's `mx.operator.CustomOp`).
//!
//! The host registers an operator type under a name ([`register_custom_op`]); `Custom(op_type=name,
//! ...)` then asks that type for its argument, output and auxiliary-state names, its shapes and
//! dtypes, and runs its forward and backward on whole arrays. Because `Custom` is an ordinary
//! registered operator with a gradient, it works imperatively, under autograd, in symbols and in
//! hybridized blocks alike. A failure of the host's code is stored on the outputs it should have
//! written, so it surfaces at the next sync point as any kernel's failure does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use crate::base::{Context, DType, Shape};
use crate::engine::{self, PushProps};
use crate::error::Result;
use crate::ndarray::NDArray;
use crate::op::grad::{Grad, InputGrads};
use crate::op::{Attrs, OpDef, Operator, ParamSpec};

/// How an operator writes one of its results (MXNet's `OpReqType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteReq {
    Null,
    Write,
    Add,
}

impl WriteReq {
    /// MXNet's name: `null`, `write`, `add`.
    pub fn as_str(self) -> &'static str {
        match self {
            WriteReq::Null => "null",
            WriteReq::Write => "write",
            WriteReq::Add => "add",
        }
    }
}

/// Shapes (or dtypes) of a custom operator's arguments, outputs and auxiliary states.
#[derive(Clone, Debug, PartialEq)]
pub struct Signature<T> {
    pub arguments: Vec<T>,
    pub outputs: Vec<T>,
    pub auxiliary_states: Vec<T>,
}

/// An operator type the host defines (MXNet's `CustomOpProp`), made from the call's parameters.
pub trait CustomOpType: Send + Sync {
    fn arguments(&self) -> Result<Vec<String>>;
    fn outputs(&self) -> Result<Vec<String>>;
    fn auxiliary_states(&self) -> Result<Vec<String>>;
    /// Every shape, from the inputs' shapes (`None` where unknown, e.g. a weight to be inferred).
    fn infer_shape(&self, inputs: &[Option<Shape>]) -> Result<Signature<Shape>>;
    /// Every dtype, from the inputs' dtypes (`None` where unknown).
    fn infer_type(&self, inputs: &[Option<DType>]) -> Result<Signature<DType>>;
    /// The operator instance that computes (MXNet's `create_operator`), made once per node.
    fn create_operator(&self, ctx: Context, in_shapes: &[Shape], in_types: &[DType]) -> Result<Arc<dyn CustomOpKernel>>;
}

/// A host operator instance (MXNet's `CustomOp`): forward and backward over whole arrays, which it
/// fills according to their requests.
pub trait CustomOpKernel: Send + Sync {
    fn forward(&self, is_train: bool, req: &[WriteReq], in_data: &[NDArray], out_data: &[NDArray], aux: &[NDArray]) -> Result<()>;
    #[allow(clippy::too_many_arguments)]
    fn backward(
        &self,
        req: &[WriteReq],
        out_grad: &[NDArray],
        in_data: &[NDArray],
        out_data: &[NDArray],
        in_grad: &[NDArray],
        aux: &[NDArray],
    ) -> Result<()>;
}

/// Makes a [`CustomOpType`] from the call's parameters (every attribute but `op_type`).
pub type CustomOpFactory = Arc<dyn Fn(&Attrs) -> Result<Arc<dyn CustomOpType>> + Send + Sync>;

fn factories() -> &'static RwLock<HashMap<String, CustomOpFactory>> {
    static FACTORIES: std::sync::OnceLock<RwLock<HashMap<String, CustomOpFactory>>> = std::sync::OnceLock::new();
    FACTORIES.get_or_init(Default::default)
}

/// Register (or replace, as MXNet's `mx.operator.register` does) the operator type `op_type`.
pub fn register_custom_op(op_type: &str, factory: CustomOpFactory) {
    // A poisoned lock only means another registration panicked midway; the map is still whole.
    factories().write().unwrap_or_else(|e| e.into_inner()).insert(op_type.to_string(), factory);
}

fn create(attrs: &Attrs) -> Result<Arc<dyn Operator>> {
    let Some(op_type) = attrs.get("op_type") else {
        crate::bail!(Param, "operator Custom: required parameter 'op_type' is missing (the name given to mx.operator.register)");
    };
    let factory = factories().read().unwrap_or_else(|e| e.into_inner()).get(op_type).cloned();
    let Some(factory) = factory else {
        crate::bail!(Param, "operator Custom: no custom operator is registered as '{op_type}'; register it with @mx.operator.register('{op_type}')");
    };
    let params: Attrs =
        attrs.iter().filter(|(k, _)| k.as_str() != "op_type" && !crate::op::params::is_annotation(k)).map(|(k, v)| (k.clone(), v.clone())).collect();
    let prop = factory(&params).map_err(|e| e.context(format!("creating custom operator '{op_type}'")))?;
    let arguments = prop.arguments()?;
    let num_outputs = prop.outputs()?.len();
    let auxiliary_states = prop.auxiliary_states()?;
    if num_outputs == 0 {
        crate::bail!(Value, "custom operator '{op_type}': list_outputs() is empty");
    }
    Ok(Arc::new(
        Custom {
            node: Arc::new(CustomNode { op_type: op_type.clone(), prop, kernel: Mutex::new(None) }),
            arguments,
            auxiliary_states,
            num_outputs,
            aux_indices: Vec::new(),
        }
        .with_aux_indices(),
    ))
}

pub(crate) fn register(add: &mut impl FnMut(OpDef)) {
    add(OpDef {
        name: "Custom",
        aliases: &[],
        doc: "Apply a custom operator implemented in Python (mx.operator.CustomOp) registered as `op_type`.",
        variadic: false,
        params: || vec![ParamSpec { name: "op_type", type_name: "string", default: None, doc: "Name the operator was registered with." }],
        create: Box::new(|_called_as, attrs| create(attrs)),
    });
}

/// What the forward node and its gradient node share: the operator type and the one instance that
/// computes both directions (MXNet keeps one `CustomOp` per node, so state set in forward is seen
/// by backward).
struct CustomNode {
    op_type: String,
    prop: Arc<dyn CustomOpType>,
    kernel: Mutex<Option<Arc<dyn CustomOpKernel>>>,
}

impl CustomNode {
    fn kernel(&self, inputs: &[NDArray]) -> Result<Arc<dyn CustomOpKernel>> {
        // The lock only guards the lazily made instance; a panic elsewhere cannot leave it torn.
        let mut slot = self.kernel.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(kernel) = slot.as_ref() {
            return Ok(kernel.clone());
        }
        let ctx = inputs.first().map_or(Context::cpu(0), NDArray::context);
        let shapes: Vec<Shape> = inputs.iter().map(|a| a.shape().clone()).collect();
        let types: Vec<DType> = inputs.iter().map(NDArray::dtype).collect();
        let kernel = self.prop.create_operator(ctx, &shapes, &types)?;
        *slot = Some(kernel.clone());
        Ok(kernel)
    }

    /// Store `error` on `arrays` (they become failed, like a kernel's outputs when it fails), so
    /// that it is raised at the next sync point instead of at the call.
    fn fail(&self, arrays: &[NDArray], direction: &str, error: crate::Error) {
        let writes: Vec<_> = arrays.iter().map(|a| a.var().clone()).collect();
        let description = format!("custom operator '{}' ({direction})", self.op_type);
        engine::push(Box::new(move || Err(error)), &[], &writes, PushProps { inline_if_ready: true }, Box::new(description));
    }
}

struct Custom {
    node: Arc<CustomNode>,
    arguments: Vec<String>,
    auxiliary_states: Vec<String>,
    num_outputs: usize,
    /// Input positions of the auxiliary states (after the arguments): updated in place.
    aux_indices: Vec<usize>,
}

impl Custom {
    fn with_aux_indices(mut self) -> Self {
        self.aux_indices = (self.arguments.len()..self.arguments.len() + self.auxiliary_states.len()).collect();
        self
    }

    fn signature_shapes(&self, inputs: &[Option<Shape>]) -> Result<Signature<Shape>> {
        let sig = self.node.prop.infer_shape(inputs)?;
        if sig.arguments.len() != self.arguments.len()
            || sig.outputs.len() != self.num_outputs
            || sig.auxiliary_states.len() != self.auxiliary_states.len()
        {
            crate::bail!(
                Shape,
                "custom operator '{}': infer_shape returned {} argument, {} output and {} auxiliary shape(s); expected {}, {} and {}",
                self.node.op_type,
                sig.arguments.len(),
                sig.outputs.len(),
                sig.auxiliary_states.len(),
                self.arguments.len(),
                self.num_outputs,
                self.auxiliary_states.len()
            );
        }
        Ok(sig)
    }

    fn forward_on_host(&self, inputs: &[NDArray], into: &[Option<NDArray>]) -> Result<Vec<NDArray>> {
        let expected = self.arguments.len() + self.auxiliary_states.len();
        if inputs.len() != expected {
            crate::bail!(
                Value,
                "custom operator '{}' takes {expected} input(s) ({}), got {}",
                self.node.op_type,
                self.input_names().join(", "),
                inputs.len()
            );
        }
        let shapes = self.infer_shape(&inputs.iter().map(|a| a.shape().clone()).collect::<Vec<_>>())?;
        let types = self.infer_type(&inputs.iter().map(NDArray::dtype).collect::<Vec<_>>())?;
        let ctx = inputs.first().map_or(Context::cpu(0), NDArray::context);
        let outputs = shapes
            .into_iter()
            .zip(types)
            .enumerate()
            .map(|(i, (shape, dtype))| match into.get(i).cloned().flatten() {
                Some(given) if given.shape() == &shape && given.dtype() == dtype => Ok(given),
                _ => NDArray::empty(shape, dtype, ctx),
            })
            .collect::<Result<Vec<_>>>()?;
        let (args, aux) = inputs.split_at(self.arguments.len());
        let req = vec![WriteReq::Write; outputs.len()];
        let _profiled = crate::profiler::custom_op_section(|| self.node.op_type.clone());
        let result = self.node.kernel(inputs).and_then(|k| k.forward(crate::autograd::is_training(), &req, args, &outputs, aux));
        if let Err(e) = result {
            self.node.fail(&outputs, "forward", e);
        }
        Ok(outputs)
    }
}

impl Operator for Custom {
    fn input_names(&self) -> Vec<String> {
        self.arguments.iter().chain(&self.auxiliary_states).cloned().collect()
    }
    fn num_outputs(&self) -> usize {
        self.num_outputs
    }
    fn mutated_inputs(&self) -> &[usize] {
        &self.aux_indices
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let known: Vec<Option<Shape>> = inputs.iter().cloned().map(Some).collect();
        Ok(self.signature_shapes(&known)?.outputs)
    }
    fn complete_input_shapes(&self, inputs: &mut [Option<Shape>]) -> Result<()> {
        let sig = self.signature_shapes(inputs)?;
        for (slot, shape) in inputs.iter_mut().zip(sig.arguments.into_iter().chain(sig.auxiliary_states)) {
            if slot.is_none() && shape.size() > 0 {
                *slot = Some(shape);
            }
        }
        Ok(())
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let known: Vec<Option<DType>> = inputs.iter().copied().map(Some).collect();
        Ok(self.node.prop.infer_type(&known)?.outputs)
    }
    fn complete_input_types(&self, inputs: &mut [Option<DType>]) {
        if let Ok(sig) = self.node.prop.infer_type(inputs) {
            for (slot, dtype) in inputs.iter_mut().zip(sig.arguments.into_iter().chain(sig.auxiliary_states)) {
                slot.get_or_insert(dtype);
            }
        }
    }
    /// User code: two calls are two computations.
    fn deterministic(&self) -> bool {
        false
    }
    fn compute(&self) -> crate::op::Compute {
        crate::op::Compute::Host
    }
    fn compute_arrays(&self, inputs: &[NDArray], into: &[Option<NDArray>]) -> Result<Vec<NDArray>> {
        self.forward_on_host(inputs, into)
    }
    /// The gradient calls back into this call's Python operator object.
    fn gradient_identity(&self) -> super::GradientIdentity {
        super::GradientIdentity::Unique
    }
    fn gradient(&self, g: &mut Grad) -> Result<InputGrads> {
        let num_args = self.arguments.len();
        let needed: Vec<bool> = (0..num_args).map(|i| g.input_needed(i)).collect();
        let backward = Arc::new(CustomBackward {
            node: self.node.clone(),
            num_args,
            num_aux: self.auxiliary_states.len(),
            num_outputs: self.num_outputs,
            needed,
        });
        // Inputs of the gradient node: output gradients, then the forward inputs, then its outputs.
        let mut inputs = g.out_grads().to_vec();
        inputs.extend((0..g.num_inputs()).map(|i| g.input(i)));
        inputs.extend((0..g.num_outputs()).map(|i| g.output(i)));
        let grads = g.instance_outputs("_backward_Custom", backward, &inputs);
        Ok(grads.into_iter().map(Some).chain(std::iter::repeat_n(None, self.auxiliary_states.len())).collect())
    }
}

/// The gradient node of [`Custom`]: runs the host's backward on the shared instance.
struct CustomBackward {
    node: Arc<CustomNode>,
    num_args: usize,
    num_aux: usize,
    num_outputs: usize,
    needed: Vec<bool>,
}

impl CustomBackward {
    fn split<'a>(&self, inputs: &'a [NDArray]) -> (&'a [NDArray], &'a [NDArray], &'a [NDArray], &'a [NDArray]) {
        let (out_grad, rest) = inputs.split_at(self.num_outputs);
        let (args, rest) = rest.split_at(self.num_args);
        let (aux, outputs) = rest.split_at(self.num_aux);
        (out_grad, args, aux, outputs)
    }

    /// The forward arguments' entries among the gradient node's inputs: each input gradient has
    /// its argument's shape and dtype.
    fn arguments_of<T: Clone>(&self, inputs: &[T]) -> Result<Vec<T>> {
        inputs.get(self.num_outputs..self.num_outputs + self.num_args).map(<[T]>::to_vec).ok_or_else(|| {
            crate::err!(Value, "_backward_Custom of '{}': {} input(s) given, expected {}", self.node.op_type, inputs.len(), self.input_names().len())
        })
    }

    fn backward_on_host(&self, inputs: &[NDArray], into: &[Option<NDArray>]) -> Result<Vec<NDArray>> {
        if inputs.len() != self.input_names().len() {
            crate::bail!(
                Value,
                "_backward_Custom of '{}': {} input(s) given, expected {}",
                self.node.op_type,
                inputs.len(),
                self.input_names().len()
            );
        }
        let (out_grad, args, aux, outputs) = self.split(inputs);
        let in_grad = args
            .iter()
            .enumerate()
            .map(|(i, a)| match into.get(i).cloned().flatten() {
                Some(given) if given.shape() == a.shape() && given.dtype() == a.dtype() => Ok(given),
                // Zeroed, so that a gradient the host leaves unwritten ('null' request) reads as zero.
                _ => crate::imperative::invoke("zeros_like", std::slice::from_ref(a), &Attrs::new(), None, a.context(), None)?
                    .into_iter()
                    .next()
                    .ok_or_else(|| crate::err!(Runtime, "zeros_like returned no output")),
            })
            .collect::<Result<Vec<_>>>()?;
        let req: Vec<WriteReq> = self.needed.iter().map(|&n| if n { WriteReq::Write } else { WriteReq::Null }).collect();
        let forward_inputs: Vec<NDArray> = args.iter().chain(aux).cloned().collect();
        let _profiled = crate::profiler::custom_op_section(|| format!("_backward_{}", self.node.op_type));
        let result = self.node.kernel(&forward_inputs).and_then(|k| k.backward(&req, out_grad, args, outputs, &in_grad, aux));
        if let Err(e) = result {
            self.node.fail(&in_grad, "backward", e);
        }
        Ok(in_grad)
    }
}

impl Operator for CustomBackward {
    fn input_names(&self) -> Vec<String> {
        let mut names: Vec<String> = (0..self.num_outputs).map(|i| format!("out_grad{i}")).collect();
        names.extend((0..self.num_args).map(|i| format!("in_data{i}")));
        names.extend((0..self.num_aux).map(|i| format!("aux{i}")));
        names.extend((0..self.num_outputs).map(|i| format!("out_data{i}")));
        names
    }
    fn num_outputs(&self) -> usize {
        self.num_args
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        self.arguments_of(inputs)
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        self.arguments_of(inputs)
    }
    fn compute(&self) -> crate::op::Compute {
        crate::op::Compute::Host
    }
    fn compute_arrays(&self, inputs: &[NDArray], into: &[Option<NDArray>]) -> Result<Vec<NDArray>> {
        self.backward_on_host(inputs, into)
    }
}
