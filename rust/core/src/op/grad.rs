//! Gradients as graphs of registered operators (MXNet's FGradient).
//!
//! An operator's gradient builds, from entries for its inputs, outputs and output gradients,
//! new graph nodes that compute its input gradients. Because the result is ordinary graph nodes,
//! the same definition serves autograd, symbolic backward, hybridized blocks and higher-order
//! gradients (differentiating the gradient graph again).

use crate::base::Shape;
use crate::error::Result;
use crate::graph::{Entry, Node};
use crate::op::Attrs;

/// What a gradient definition sees and the node factory it builds with.
pub struct Grad<'a> {
    inputs: &'a [Entry],
    outputs: &'a [Entry],
    out_grads: &'a [Entry],
    prefix: &'a str,
    created: usize,
    shapes: &'a dyn Fn(&Entry) -> Option<Shape>,
    needed: Vec<bool>,
}

/// Input gradients: `None` is an input whose gradient is zero (or not needed).
pub type InputGrads = Vec<Option<Entry>>;

impl<'a> Grad<'a> {
    /// `shapes` knows the shapes of forward entries where they are already known (autograd's
    /// recorded values, an inferred symbolic graph), letting definitions skip no-op nodes.
    pub fn new(
        inputs: &'a [Entry],
        outputs: &'a [Entry],
        out_grads: &'a [Entry],
        prefix: &'a str,
        shapes: &'a dyn Fn(&Entry) -> Option<Shape>,
    ) -> Self {
        Grad { inputs, outputs, out_grads, prefix, created: 0, shapes, needed: vec![true; inputs.len()] }
    }
    /// Tell which inputs' gradients anyone uses, so definitions can skip expensive unused ones.
    pub fn with_needed(mut self, needed: Vec<bool>) -> Self {
        self.needed = needed;
        self
    }
    /// Whether input `i`'s gradient is used (a definition may return anything for it otherwise).
    pub fn input_needed(&self, i: usize) -> bool {
        self.needed.get(i).copied().unwrap_or(true)
    }
    /// The shape of a forward entry, where it is known.
    pub fn shape_of(&self, e: &Entry) -> Option<Shape> {
        (self.shapes)(e)
    }
    /// Whether two forward entries are known to have the same shape.
    pub fn known_same_shape(&self, a: &Entry, b: &Entry) -> bool {
        matches!(((self.shapes)(a), (self.shapes)(b)), (Some(x), Some(y)) if x == y)
    }
    // The accessors below index directly: `i` is a constant of the operator's own gradient
    // definition, never a value from input, and a node has exactly its operator's inputs and
    // outputs (checked when the node is built), so an index past them is a bug in that definition.
    #[allow(clippy::indexing_slicing)]
    pub fn input(&self, i: usize) -> Entry {
        self.inputs[i].clone()
    }
    #[allow(clippy::indexing_slicing)]
    pub fn output(&self, i: usize) -> Entry {
        self.outputs[i].clone()
    }
    #[allow(clippy::indexing_slicing)]
    pub fn out_grad(&self, i: usize) -> Entry {
        self.out_grads[i].clone()
    }
    pub fn out_grads(&self) -> &[Entry] {
        self.out_grads
    }
    /// Whether output `i`'s gradient is known to be zero: the gradient pass hands an output that
    /// nothing downstream uses a `zeros_like` of it, and a definition may leave out its terms.
    pub fn out_grad_is_zero(&self, i: usize) -> bool {
        self.out_grads.get(i).and_then(|g| g.node.op.as_ref()).is_some_and(|op| op.name == "zeros_like")
    }
    pub fn num_inputs(&self) -> usize {
        self.inputs.len()
    }
    pub fn num_outputs(&self) -> usize {
        self.outputs.len()
    }

    /// Every output of the operator `name` applied to `inputs`.
    pub fn op_outputs(&mut self, name: &str, attrs: &[(&str, String)], inputs: &[&Entry]) -> Result<Vec<Entry>> {
        let attrs: Attrs = attrs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
        self.created += 1;
        let node = Node::apply(name, attrs, inputs.iter().map(|e| (*e).clone()).collect(), format!("{}_backward{}", self.prefix, self.created))?;
        Ok((0..node.num_outputs()).map(|i| Entry::new(node.clone(), i)).collect())
    }
    /// Every output of an operator instance that is not in the registry (a host callback).
    pub fn instance_outputs(&mut self, name: &str, operator: std::sync::Arc<dyn super::Operator>, inputs: &[Entry]) -> Vec<Entry> {
        self.created += 1;
        let op = crate::graph::NodeOp { name: name.to_string(), attrs: Attrs::new(), operator };
        let node = Node::with_operator(op, inputs.to_vec(), format!("{}_backward{}", self.prefix, self.created), crate::graph::Recorded::Nothing);
        (0..node.num_outputs()).map(|i| Entry::new(node.clone(), i)).collect()
    }
    /// The first output of `name` applied to `inputs`.
    pub fn op(&mut self, name: &str, attrs: &[(&str, String)], inputs: &[&Entry]) -> Result<Entry> {
        Ok(self.op_outputs(name, attrs, inputs)?.swap_remove(0))
    }
    pub fn unary(&mut self, name: &str, x: &Entry) -> Result<Entry> {
        self.op(name, &[], &[x])
    }
    /// An element-wise binary op on operands of one shape (`elemwise_mul`, `_div`, ...).
    pub fn binary(&mut self, name: &str, a: &Entry, b: &Entry) -> Result<Entry> {
        self.op(name, &[], &[a, b])
    }
    pub fn mul(&mut self, a: &Entry, b: &Entry) -> Result<Entry> {
        self.binary("elemwise_mul", a, b)
    }
    pub fn div(&mut self, a: &Entry, b: &Entry) -> Result<Entry> {
        self.binary("elemwise_div", a, b)
    }
    /// `x <op> scalar` with a scalar operator such as `_mul_scalar`.
    pub fn scalar(&mut self, name: &str, x: &Entry, scalar: f64) -> Result<Entry> {
        self.op(name, &[("scalar", format!("{scalar:?}"))], &[x])
    }
    pub fn negative(&mut self, x: &Entry) -> Result<Entry> {
        self.unary("negative", x)
    }
    /// Sum `x` down to the shape of `like` (undoing a broadcast).
    pub fn sum_to_like(&mut self, x: &Entry, like: &Entry) -> Result<Entry> {
        self.op("_reduce_sum_to_like", &[], &[x, like])
    }
}

/// Attribute text of an axis tuple in MXNet's form.
pub fn tuple_attr(values: &[i64]) -> String {
    match values {
        [one] => format!("({one},)"),
        _ => format!("({})", values.iter().map(i64::to_string).collect::<Vec<_>>().join(", ")),
    }
}
