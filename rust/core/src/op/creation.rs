//! Operators that create arrays: zeros, ones, full, arange, zeros_like, ones_like and the random
//! samplers. Creation ops have no inputs; shape, dtype and device come from their parameters.

use crate::op::KernelArgs;
use std::sync::Arc;

use super::params::NoParams;
use super::{exactly, parallel_units, ExecContext, OpDef, Operator, Tensor, PARALLEL_GRAIN};
use crate::base::{Context, DType, Elem, Shape};
use crate::error::{Error, Result};

/// Fill `out` with `value(i)` for each flat index `i`.
fn fill_with<T: Elem>(out: &mut [T], value: impl Fn(usize) -> f64 + Sync) -> Result<()> {
    parallel_units(out, 1, PARALLEL_GRAIN, |start, piece| {
        for (i, element) in (start..).zip(piece.iter_mut()) {
            *element = T::from_f64(value(i));
        }
        Ok(())
    })
}

/// Fill output 0 of a kernel call with `value(i)` for each flat index `i`.
fn fill_output(args: &KernelArgs, value: impl Fn(usize) -> f64 + Sync) -> Result<()> {
    crate::dispatch_dtype!(args.output_dtype(0)?, T => fill_with::<T>(args.output(0)?, value))
}

fn shape_from(op: &str, dims: &[i64]) -> Result<Shape> {
    dims.iter()
        .map(|&d| usize::try_from(d).map_err(|_| crate::err!(Shape, "{op}: invalid shape {dims:?}: dimensions must be >= 0")))
        .collect::<Result<Vec<_>>>()
        .map(Shape::new)
}

/// What a creation op writes at flat index `i` (given the op's seed).
type Generator = Arc<dyn Fn(u64, usize) -> f64 + Send + Sync>;

#[derive(Clone)]
struct Create {
    shape: Shape,
    dtype: DType,
    ctx: Option<Context>,
    value: Generator,
    /// The value of every element, for zeros, ones and full (filled on the device directly;
    /// read by GPU kernels only).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    constant: Option<f64>,
    random: bool,
    /// Invalid distribution parameters of a sampler. As in MXNet they are reported when the op
    /// runs, not when it is called: the pushed op fails and the error surfaces at the next sync
    /// point (wait_to_read, asnumpy, waitall) like any failure of an asynchronous op.
    invalid_params: Option<Error>,
}

impl Operator for Create {
    fn input_names(&self) -> Vec<String> {
        Vec::new()
    }
    fn infer_shape(&self, _inputs: &[Shape]) -> Result<Vec<Shape>> {
        Ok(vec![self.shape.clone()])
    }
    fn partial_output_shapes(&self) -> Option<Vec<Shape>> {
        self.shape.dims().contains(&0).then(|| vec![self.shape.clone()])
    }
    fn with_output_shapes(&self, shapes: &[Shape]) -> Result<Arc<dyn Operator>> {
        let [shape] = exactly("creation operator", "output shape", shapes)?;
        Ok(Arc::new(Create { shape: shape.clone(), ..self.clone() }))
    }
    fn infer_type(&self, _inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(vec![self.dtype])
    }
    fn context(&self) -> Option<Context> {
        self.ctx
    }
    fn needs_rng(&self) -> bool {
        self.random
    }
    fn forward(&self, ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        if let Some(error) = &self.invalid_params {
            return Err(error.clone());
        }
        let seed = ctx.seed;
        fill_output(args, |i| (self.value)(seed, i))
    }
    /// Constants are filled on the device. Samples and ranges are drawn on the host from the
    /// same seed (so a GPU array holds exactly the numbers a CPU one would) and copied over.
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, ctx: &ExecContext, _inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        if let Some(error) = &self.invalid_params {
            return Err(error.clone());
        }
        let [out] = exactly("creation operator", "output", outputs)?;
        if let Some(value) = self.constant {
            return crate::backend::cuda::kernels::fill(gpu, out, value);
        }
        let host = crate::storage::cpu_pool().alloc(out.size() * out.dtype.size())?;
        // SAFETY: `host` is a fresh block of out's byte size, used by no one else.
        let staged = unsafe { Tensor::new(host.as_ptr(), out.shape.clone(), out.dtype) };
        let seed = ctx.seed;
        // SAFETY: as above; the arguments are the only way to the block while they live.
        fill_output(&unsafe { KernelArgs::new(&[], std::slice::from_ref(&staged), &[], &[]) }?, |i| (self.value)(seed, i))?;
        // SAFETY: the block holds out's bytes; out is device memory this op owns.
        unsafe { gpu.copy_from_host(out.raw(), std::slice::from_raw_parts(host.as_ptr(), host.len())) }
    }
}

crate::op_params! {
    pub struct InitParams {
        /// The shape of the output.
        shape: Vec<i64> = Vec::new(),
        /// Context of the output (default: the current context).
        ctx: Option<Context> = None,
        /// Target data type.
        dtype: Option<DType> = None,
    }
}

crate::op_params! {
    pub struct FullParams {
        /// The shape of the output.
        shape: Vec<i64> = Vec::new(),
        /// Context of the output (default: the current context).
        ctx: Option<Context> = None,
        /// Target data type.
        dtype: Option<DType> = None,
        /// Value with which to fill the output.
        value: f64,
    }
}

crate::op_params! {
    pub struct ArangeParams {
        /// Start of the interval.
        start: f64,
        /// End of the interval (exclusive); if None, the interval is [0, start).
        stop: Option<f64> = None,
        /// Spacing between values.
        step: f64 = 1.0,
        /// Number of times each value is repeated.
        repeat: usize = 1,
        /// Infer stop from the output shape (symbolic use only).
        infer_range: bool = false,
        /// Context of the output.
        ctx: Option<Context> = None,
        /// Target data type.
        dtype: Option<DType> = None,
    }
}

crate::op_params! {
    pub struct UniformParams {
        /// Lower bound of the distribution.
        low: f64 = 0.0,
        /// Upper bound of the distribution.
        high: f64 = 1.0,
        /// Shape of the output.
        shape: Vec<i64> = Vec::new(),
        /// Context of the output.
        ctx: Option<Context> = None,
        /// Data type of the output (float32 by default).
        dtype: Option<DType> = None,
    }
}

crate::op_params! {
    pub struct NormalParams {
        /// Mean of the distribution.
        loc: f64 = 0.0,
        /// Standard deviation of the distribution.
        scale: f64 = 1.0,
        /// Shape of the output.
        shape: Vec<i64> = Vec::new(),
        /// Context of the output.
        ctx: Option<Context> = None,
        /// Data type of the output (float32 by default).
        dtype: Option<DType> = None,
    }
}

/// Declare a sampler's parameter struct: its distribution parameters, then shape, ctx and dtype.
macro_rules! sampler_params {
    ($name:ident { $( $(#[doc = $doc:literal])* $field:ident : $ty:ty = $default:expr ),* }) => {
        crate::op_params! {
            pub struct $name {
                $( $(#[doc = $doc])* $field: $ty = $default, )*
                /// Shape of the output.
                shape: Vec<i64> = Vec::new(),
                /// Context of the output.
                ctx: Option<Context> = None,
                /// Data type of the output.
                dtype: Option<DType> = None,
            }
        }
    };
}

sampler_params!(RandIntParams {
    /// Lower bound (inclusive).
    low: i64 = 0,
    /// Upper bound (exclusive).
    high: i64 = 1
});
sampler_params!(ExponentialParams {
    /// Rate (inverse scale) of the distribution.
    lam: f64 = 1.0
});
sampler_params!(GammaParams {
    /// Shape of the gamma distribution.
    alpha: f64 = 1.0,
    /// Scale of the gamma distribution.
    beta: f64 = 1.0
});
sampler_params!(PoissonParams {
    /// Mean (lambda) of the distribution.
    lam: f64 = 1.0
});
sampler_params!(NegativeBinomialParams {
    /// Number of successes to wait for.
    k: i64 = 1,
    /// Success probability of each trial.
    p: f64 = 1.0
});

crate::op_params! {
    /// MXNet names the dimensions N and M.
    #[allow(non_snake_case)]
    pub struct EyeParams {
        /// Number of rows.
        N: i64,
        /// Number of columns (0 means N).
        M: i64 = 0,
        /// Index of the diagonal: 0 is the main one, positive above, negative below.
        k: i64 = 0,
        /// Context of the output.
        ctx: Option<Context> = None,
        /// Data type of the output.
        dtype: Option<DType> = None,
    }
}

crate::op_params! {
    pub struct LinspaceParams {
        /// First value.
        start: f64,
        /// Last value (included when endpoint is True).
        stop: f64,
        /// Number of values.
        num: i64,
        /// Whether stop is the last value.
        endpoint: bool = true,
        /// Context of the output.
        ctx: Option<Context> = None,
        /// Data type of the output.
        dtype: Option<DType> = None,
    }
}

/// A random creation op drawing element `i` with `draw(seed, i)`; `invalid_params` (see
/// [`Create`]) makes it fail when it runs.
fn sampler(
    name: &str,
    shape: &[i64],
    ctx: Option<Context>,
    dtype: DType,
    invalid_params: Option<Error>,
    draw: impl Fn(u64, u64) -> f64 + Send + Sync + 'static,
) -> Result<Create> {
    Ok(Create {
        shape: shape_from(name, shape)?,
        dtype,
        ctx,
        value: Arc::new(move |seed, i| draw(seed, i as u64)),
        constant: None,
        random: true,
        invalid_params,
    })
}

/// zeros_like / ones_like: the input's shape and dtype, filled with a constant.
struct FillLike {
    value: f64,
}

impl Operator for FillLike {
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [x] = exactly("zeros_like/ones_like", "input", inputs)?;
        Ok(vec![x.clone()])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let v = self.value;
        fill_output(args, |_| v)
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, _inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        let [out] = exactly("zeros_like/ones_like", "output", outputs)?;
        crate::backend::cuda::kernels::fill(gpu, out, self.value)
    }
    fn gradient(&self, d: &mut super::grad::Grad) -> Result<super::grad::InputGrads> {
        super::zero_gradient(d)
    }
}

pub(super) fn register(add: &mut dyn FnMut(OpDef)) {
    let constant = |name: &'static str, value: f64| -> Box<dyn Fn(InitParams) -> Result<Create> + Send + Sync> {
        Box::new(move |p: InitParams| {
            Ok(Create {
                shape: shape_from(name, &p.shape)?,
                dtype: p.dtype.unwrap_or(DType::F32),
                ctx: p.ctx,
                value: Arc::new(move |_, _| value),
                constant: Some(value),
                random: false,
                invalid_params: None,
            })
        })
    };
    add(OpDef::new("_zeros", &[], "Returns a new array filled with zeros.", constant("_zeros", 0.0)));
    add(OpDef::new("_ones", &[], "Returns a new array filled with ones.", constant("_ones", 1.0)));
    add(OpDef::new("_full", &[], "Returns a new array filled with the given value.", |p: FullParams| {
        let value = p.value;
        Ok(Create {
            shape: shape_from("_full", &p.shape)?,
            dtype: p.dtype.unwrap_or(DType::F32),
            ctx: p.ctx,
            value: Arc::new(move |_, _| value),
            constant: Some(value),
            random: false,
            invalid_params: None,
        })
    }));
    add(OpDef::new(
        "_arange",
        &[],
        "Returns evenly spaced values within [start, stop) with the given step, each repeated `repeat` times.",
        |p: ArangeParams| {
            let (start, stop) = match p.stop {
                Some(stop) => (p.start, stop),
                None => (0.0, p.start),
            };
            if p.infer_range {
                crate::bail!(Param, "_arange: infer_range=True needs a symbolic graph to infer the range from");
            }
            if p.step == 0.0 {
                crate::bail!(Value, "_arange: step cannot be 0");
            }
            let count = ((stop - start) / p.step).ceil().max(0.0) as usize;
            let (step, repeat) = (p.step, p.repeat.max(1));
            Ok(Create {
                shape: Shape::new(vec![count * repeat]),
                dtype: p.dtype.unwrap_or(DType::F32),
                ctx: p.ctx,
                value: Arc::new(move |_, i| start + (i / repeat) as f64 * step),
                constant: None,
                random: false,
                invalid_params: None,
            })
        },
    ));
    add(OpDef::new(
        "_random_uniform",
        &["uniform", "random_uniform"],
        "Draws samples from a uniform distribution on [low, high).",
        |p: UniformParams| {
            let invalid = (p.high < p.low).then(|| crate::err!(Value, "_random_uniform: low ({}) must not exceed high ({})", p.low, p.high));
            let (low, span) = (p.low, p.high - p.low);
            sampler("_random_uniform", &p.shape, p.ctx, p.dtype.unwrap_or(DType::F32), invalid, move |seed, i| {
                low + span * crate::random::uniform(seed, i)
            })
        },
    ));
    add(OpDef::new(
        "_random_normal",
        &["normal", "random_normal"],
        "Draws samples from a normal (Gaussian) distribution with mean `loc` and standard deviation `scale`.",
        |p: NormalParams| {
            let invalid = (p.scale < 0.0).then(|| crate::err!(Value, "_random_normal: scale must be >= 0, got {}", p.scale));
            let (loc, scale) = (p.loc, p.scale);
            sampler("_random_normal", &p.shape, p.ctx, p.dtype.unwrap_or(DType::F32), invalid, move |seed, i| {
                loc + scale * crate::random::normal(seed, i)
            })
        },
    ));
    add(OpDef::new("_random_randint", &["random_randint"], "Draws integers uniformly from [low, high).", |p: RandIntParams| {
        let invalid = (p.high <= p.low).then(|| crate::err!(Value, "_random_randint: low ({}) must be less than high ({})", p.low, p.high));
        let (low, span) = (p.low as f64, (p.high - p.low) as f64);
        sampler("_random_randint", &p.shape, p.ctx, p.dtype.unwrap_or(DType::I32), invalid, move |seed, i| {
            (low + span * crate::random::uniform(seed, i)).floor()
        })
    }));
    add(OpDef::new(
        "_random_exponential",
        &["random_exponential"],
        "Draws samples from an exponential distribution with rate lam.",
        |p: ExponentialParams| {
            let lam = p.lam;
            sampler("_random_exponential", &p.shape, p.ctx, p.dtype.unwrap_or(DType::F32), None, move |seed, i| {
                -(1.0 - crate::random::uniform(seed, i)).ln() / lam
            })
        },
    ));
    add(OpDef::new(
        "_random_gamma",
        &["random_gamma"],
        "Draws samples from a gamma distribution with shape alpha and scale beta.",
        |p: GammaParams| {
            let (alpha, beta) = (p.alpha, p.beta);
            sampler("_random_gamma", &p.shape, p.ctx, p.dtype.unwrap_or(DType::F32), None, move |seed, i| beta * crate::random::gamma(seed, i, alpha))
        },
    ));
    add(OpDef::new("_random_poisson", &["random_poisson"], "Draws samples from a Poisson distribution with mean lam.", |p: PoissonParams| {
        let lam = p.lam;
        sampler("_random_poisson", &p.shape, p.ctx, p.dtype.unwrap_or(DType::F32), None, move |seed, i| crate::random::poisson(seed, i, lam))
    }));
    add(OpDef::new(
        "_random_negative_binomial",
        &["random_negative_binomial"],
        "Draws the number of failures before k successes, each trial succeeding with probability p.",
        |p: NegativeBinomialParams| {
            let invalid = (!(p.p > 0.0 && p.p <= 1.0) || p.k <= 0)
                .then(|| crate::err!(Value, "_random_negative_binomial: need k > 0 and 0 < p <= 1, got k={} p={}", p.k, p.p));
            let (k, prob) = (p.k as f64, p.p);
            sampler("_random_negative_binomial", &p.shape, p.ctx, p.dtype.unwrap_or(DType::F32), invalid, move |seed, i| {
                // A Poisson whose mean is gamma distributed: the negative binomial mixture.
                let rate = crate::random::gamma(seed, 2 * i, k) * (1.0 - prob) / prob;
                crate::random::poisson(seed, 2 * i + 1, rate)
            })
        },
    ));
    add(OpDef::new("_eye", &[], "Returns a 2-D array with ones on the k-th diagonal and zeros elsewhere.", |p: EyeParams| {
        let cols = if p.M == 0 { p.N } else { p.M };
        let (m, k) = (cols.max(0) as usize, p.k);
        Ok(Create {
            shape: shape_from("_eye", &[p.N, cols])?,
            dtype: p.dtype.unwrap_or(DType::F32),
            ctx: p.ctx,
            value: Arc::new(move |_, i| ((i % m.max(1)) as i64 - (i / m.max(1)) as i64 == k) as u8 as f64),
            constant: None,
            random: false,
            invalid_params: None,
        })
    }));
    add(OpDef::new("_linspace", &[], "Returns num evenly spaced values over [start, stop].", |p: LinspaceParams| {
        let n = p.num.max(0);
        let intervals = if p.endpoint { (n - 1).max(1) } else { n.max(1) };
        let (start, step) = (p.start, (p.stop - p.start) / intervals as f64);
        Ok(Create {
            shape: shape_from("_linspace", &[n])?,
            dtype: p.dtype.unwrap_or(DType::F32),
            ctx: p.ctx,
            value: Arc::new(move |_, i| start + i as f64 * step),
            constant: None,
            random: false,
            invalid_params: None,
        })
    }));
    add(OpDef::new("zeros_like", &[], "Returns an array of zeros with the same shape and type as the input.", |_: NoParams| {
        Ok(FillLike { value: 0.0 })
    }));
    add(OpDef::new("ones_like", &[], "Returns an array of ones with the same shape and type as the input.", |_: NoParams| {
        Ok(FillLike { value: 1.0 })
    }));
}
