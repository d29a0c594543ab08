//! Composing graphs from Rust with typed operator parameters (MXNet's `mx.sym`).

use crate::error::Result;
use crate::op::{Attrs, Params};
use crate::symbol::Symbol;

impl Symbol {
    /// A variable named `name`: a graph input or a parameter (MXNet's `mx.sym.var`).
    pub fn var(name: &str) -> Symbol {
        Symbol::variable(name, Attrs::new())
    }

    /// Apply operator `op` with its typed parameters to `inputs`, in the operator's input order,
    /// as the node `name`. Inputs left out at the end become variables named `{name}_{input}`
    /// (`fc1_weight`, `fc1_bias`), as MXNet names a layer's parameters.
    ///
    /// ```
    /// use oxnet::params::{ActivationParams, ActivationType, FullyConnectedParams};
    /// use oxnet::symbol::Symbol;
    ///
    /// let data = Symbol::var("data");
    /// let fc1 = Symbol::apply("FullyConnected", "fc1", &[&data], &FullyConnectedParams::new(64))?;
    /// let act = Symbol::apply("Activation", "relu1", &[&fc1], &ActivationParams::new(ActivationType::Relu))?;
    /// let fc2 = Symbol::apply("FullyConnected", "fc2", &[&act], &FullyConnectedParams::new(10))?;
    /// assert_eq!(fc2.list_arguments(), ["data", "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias"]);
    /// # Ok::<(), oxnet::Error>(())
    /// ```
    pub fn apply<P: Params>(op: &str, name: &str, inputs: &[&Symbol], params: &P) -> Result<Symbol> {
        let positional: Vec<Symbol> = inputs.iter().map(|&s| s.clone()).collect();
        Symbol::create(op, params.to_attrs(), name, &positional, &[])
    }
}
