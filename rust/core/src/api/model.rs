//! A saved MXNet model ready for inference: a `-symbol.json` graph with its `.params` weights,
//! as `Module.save_checkpoint` and Gluon's `HybridBlock.export` write them.

use std::collections::HashMap;
use std::path::Path;

use crate::base::{Context, DType, PartialShape, Shape};
use crate::error::Result;
use crate::executor::BoundExecutor;
use crate::graph::GradReq;
use crate::imperative;
use crate::io::params;
use crate::ndarray::NDArray;
use crate::symbol::Symbol;

/// An MXNet model for inference (MXNet's C predict API, `MXPredCreate`): its inputs are the
/// graph's arguments that the parameter file does not hold (`data`, and `softmax_label` for a
/// network ending in `SoftmaxOutput`).
///
/// The first [`Model::predict`] binds the graph to the inputs' shapes: shapes and dtypes are
/// inferred once, element-wise chains fused, and every intermediate value placed in memory
/// planned for inference, which later calls with the same shapes reuse. Inputs of another
/// shape (a different batch size) rebind, sharing the previous plan's memory where it is
/// large enough. Inputs a caller leaves out (a label the forward pass ignores) are zeros of
/// their inferred shape.
///
/// ```no_run
/// use oxnet::{Context, Model, NDArray};
///
/// let mut model = Model::load_checkpoint("model/digits", 0, Context::cpu(0))?;
/// let images = NDArray::zeros([16, 1, 8, 8], oxnet::DType::F32, Context::cpu(0))?;
/// let scores = &model.predict(&[("data", &images)])?[0]; // (16, 10)
/// let classes = oxnet::ops::argmax(scores, oxnet::params::ArgReduceParams::new().axis(Some(1)))?;
/// # Ok::<(), oxnet::Error>(())
/// ```
pub struct Model {
    symbol: Symbol,
    ctx: Context,
    /// `list_arguments` order: the parameter's array, or `None` for an input.
    arguments: Vec<(String, Option<NDArray>)>,
    aux: Vec<NDArray>,
    inputs: Vec<String>,
    bound: Option<Bound>,
}

/// The executor for one set of input shapes and dtypes.
struct Bound {
    signature: Vec<(String, Shape, DType)>,
    executor: BoundExecutor,
}

impl Model {
    /// Load `{prefix}-symbol.json` and `{prefix}-{epoch:04}.params` (the files
    /// `mx.model.save_checkpoint` and `HybridBlock.export(prefix, epoch)` write).
    pub fn load_checkpoint(prefix: impl AsRef<Path>, epoch: usize, ctx: Context) -> Result<Model> {
        let prefix = prefix.as_ref().to_string_lossy().into_owned();
        Model::load(format!("{prefix}-symbol.json"), format!("{prefix}-{epoch:04}.params"), ctx)
    }

    /// Load a graph and its parameters from their files.
    pub fn load(symbol_file: impl AsRef<Path>, params_file: impl AsRef<Path>, ctx: Context) -> Result<Model> {
        let symbol_file = symbol_file.as_ref();
        let text = std::fs::read_to_string(symbol_file).map_err(|e| crate::err!(Io, "cannot read {}: {e}", symbol_file.display()))?;
        let symbol = Symbol::from_json(&text).map_err(|e| e.context(symbol_file.display()))?;
        let (arrays, names) = params::load(params_file.as_ref())?;
        Model::new(symbol, names.into_iter().zip(arrays).collect(), ctx)
    }

    /// A model from a graph and named parameters. Names may carry the checkpoint prefixes
    /// `arg:` and `aux:`; parameters the graph does not use are ignored, as MXNet does.
    pub fn new(symbol: Symbol, parameters: Vec<(String, NDArray)>, ctx: Context) -> Result<Model> {
        let mut by_name: HashMap<String, NDArray> = HashMap::with_capacity(parameters.len());
        for (name, array) in parameters {
            let name = name.strip_prefix("arg:").or_else(|| name.strip_prefix("aux:")).map_or_else(|| name.clone(), str::to_string);
            by_name.insert(name, on_device(array, ctx)?);
        }
        let aux = symbol
            .list_auxiliary_states()
            .into_iter()
            .map(|name| by_name.remove(&name).ok_or_else(|| crate::err!(Value, "Model: auxiliary state '{name}' is missing from the parameters")))
            .collect::<Result<Vec<_>>>()?;
        let arguments: Vec<(String, Option<NDArray>)> =
            symbol.list_arguments().into_iter().map(|name| (name.clone(), by_name.remove(&name))).collect();
        let inputs = arguments.iter().filter(|(_, value)| value.is_none()).map(|(name, _)| name.clone()).collect();
        Ok(Model { symbol, ctx, arguments, aux, inputs, bound: None })
    }

    /// The graph's arguments that are not parameters, in `list_arguments` order.
    pub fn input_names(&self) -> &[String] {
        &self.inputs
    }

    /// The names of the outputs, in order (`fc2_output`, ...).
    pub fn output_names(&self) -> Vec<String> {
        self.symbol.list_outputs()
    }

    /// The graph.
    pub fn symbol(&self) -> &Symbol {
        &self.symbol
    }

    /// Shapes of the outputs for inputs of the given shapes (inputs left out are inferred as
    /// far as the graph allows).
    pub fn output_shapes(&self, inputs: &[(&str, &Shape)]) -> Result<Vec<Shape>> {
        let inferred = self.symbol.infer_shape(&self.given_shapes(inputs.iter().map(|&(name, shape)| (name, shape))))?;
        inferred
            .outputs
            .into_iter()
            .zip(self.output_names())
            .map(|(shape, name)| {
                shape
                    .and_then(|s| s.full())
                    .ok_or_else(|| crate::err!(Shape, "Model: the shape of output '{name}' cannot be inferred from the inputs given"))
            })
            .collect()
    }

    /// Bytes of the memory planned for the intermediate values and outputs of the current
    /// binding (0 before the first [`Model::predict`]).
    pub fn planned_bytes(&self) -> usize {
        self.bound.as_ref().map_or(0, |b| b.executor.planned_bytes())
    }

    /// Run the graph in inference mode on the named inputs (on the model's device, in any
    /// dtype the graph accepts). The outputs live in the model's planned memory: the next call
    /// overwrites them, so copy ([`NDArray::deep_copy`]) what must outlive it.
    pub fn predict(&mut self, inputs: &[(&str, &NDArray)]) -> Result<&[NDArray]> {
        let mut positions = Vec::with_capacity(inputs.len());
        for (name, array) in inputs {
            let Some(position) = self.arguments.iter().position(|(n, value)| n == name && value.is_none()) else {
                crate::bail!(Value, "Model: '{name}' is not an input of the model (inputs: {})", self.inputs.join(", "));
            };
            if array.context() != self.ctx {
                crate::bail!(Device, "Model: input '{name}' lives on {}, the model on {}", array.context(), self.ctx);
            }
            positions.push(position);
        }
        let signature: Vec<(String, Shape, DType)> = inputs.iter().map(|(name, a)| (name.to_string(), a.shape().clone(), a.dtype())).collect();
        let bound = match self.bound.take() {
            Some(bound) if bound.signature == signature => bound,
            previous => Bound { executor: self.bind(&signature, previous.as_ref().map(|b| &b.executor))?, signature },
        };
        let bound = self.bound.insert(bound);
        for ((name, array), position) in inputs.iter().zip(positions) {
            // Same shape, dtype and device as bound: the executor reads the caller's array
            // directly instead of a copy.
            let slot = bound
                .executor
                .args
                .get_mut(position)
                .ok_or_else(|| crate::err!(Value, "Model::predict: input '{name}' is not an argument of the bound graph"))?;
            *slot = array.detached();
        }
        bound.executor.forward(false)?;
        Ok(&bound.executor.outputs)
    }

    /// What is known of the arguments' shapes: the given inputs' and the parameters'.
    fn given_shapes<'a>(&'a self, inputs: impl Iterator<Item = (&'a str, &'a Shape)>) -> HashMap<String, PartialShape> {
        let parameters = self.arguments.iter().filter_map(|(name, value)| Some((name.as_str(), value.as_ref()?.shape())));
        inputs.chain(parameters).map(|(name, shape)| (name.to_string(), PartialShape::from(shape))).collect()
    }

    /// An executor for inputs of these shapes and dtypes, sharing `previous`'s memory.
    fn bind(&self, signature: &[(String, Shape, DType)], previous: Option<&BoundExecutor>) -> Result<BoundExecutor> {
        let shapes = self.symbol.infer_shape(&self.given_shapes(signature.iter().map(|(name, shape, _)| (name.as_str(), shape))))?;
        let given_types: HashMap<String, DType> = signature
            .iter()
            .map(|(name, _, dtype)| (name.clone(), *dtype))
            .chain(self.arguments.iter().filter_map(|(name, value)| Some((name.clone(), value.as_ref()?.dtype()))))
            .collect();
        let types = self.symbol.infer_type(&given_types)?;
        let args = self
            .arguments
            .iter()
            .zip(shapes.arguments.iter().zip(&types.arguments))
            .map(|((name, value), (shape, dtype))| match (value, signature.iter().find(|(n, _, _)| n == name)) {
                (Some(parameter), _) => Ok(parameter.clone()),
                (None, Some((_, shape, dtype))) => NDArray::empty(shape.clone(), *dtype, self.ctx),
                (None, None) => match shape.as_ref().and_then(PartialShape::full) {
                    // An input the caller leaves out (a label the forward pass ignores) reads as zeros.
                    Some(shape) => NDArray::zeros(shape, dtype.unwrap_or(DType::F32), self.ctx),
                    None => crate::bail!(Shape, "Model: input '{name}' is not given and its shape cannot be inferred from the inputs given"),
                },
            })
            .collect::<Result<Vec<_>>>()?;
        let n = args.len();
        BoundExecutor::bind(self.symbol.clone(), self.ctx, args, vec![None; n], vec![GradReq::Null; n], self.aux.clone(), &[], previous)
    }
}

/// `array` on `ctx`, copied there when it lives elsewhere.
fn on_device(array: NDArray, ctx: Context) -> Result<NDArray> {
    if array.context() == ctx {
        return Ok(array);
    }
    let copy = NDArray::empty(array.shape().clone(), array.dtype(), ctx)?;
    imperative::copy(&array, &copy, None)?;
    Ok(copy)
}
