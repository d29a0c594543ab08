//! Random sampling driven by arrays: `_sample_<dist>` draws `shape` samples per element of its
//! parameter arrays, `_sample_multinomial` draws category indices from probability rows and
//! `_shuffle` permutes the first axis. Like the `_random_*` creation ops they draw from a seed
//! taken at push time and a counter, so results do not depend on scheduling.
//!
//! Gradients are MXNet 1.9.1's: zero for the parameters of `_sample_<dist>` (a draw is not
//! differentiated through its distribution's parameters), and for `_sample_multinomial` with
//! `get_prob` the log-probability output differentiated with respect to the probabilities
//! (`_backward_sample_multinomial`), the score-function estimator of reinforcement learning.

use super::grad::{Grad, InputGrads};
use super::{parallel_chunks, zero_gradient, ExecContext, OpDef, Operator, SendPtr, PARALLEL_GRAIN};
use crate::base::{DType, Elem, Shape};
use crate::error::Result;
use crate::op::KernelArgs;
use crate::random;

crate::op_params! {
    pub struct SampleParams {
        /// Shape of the samples drawn for each parameter element.
        shape: Vec<i64> = Vec::new(),
        /// Output dtype; by default the parameters' dtype.
        dtype: Option<DType> = None,
    }
}

/// Draws sample `index` (a counter under `seed`) given one element of each parameter array.
type Draw = fn(u64, u64, &[f64]) -> f64;

struct Sample {
    inputs: &'static [&'static str],
    shape: Vec<usize>,
    dtype: Option<DType>,
    draw: Draw,
}

impl Operator for Sample {
    fn input_names(&self) -> Vec<String> {
        self.inputs.iter().map(|s| s.to_string()).collect()
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        if let Some(bad) = inputs.iter().find(|s| **s != inputs[0]) {
            crate::bail!(Shape, "parameter arrays must share one shape, got {} and {bad}", inputs[0]);
        }
        let mut dims = inputs[0].dims().to_vec();
        dims.extend_from_slice(&self.shape);
        Ok(vec![Shape::new(dims)])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(vec![self.dtype.unwrap_or(inputs[0])])
    }
    fn needs_rng(&self) -> bool {
        true
    }
    fn forward(&self, ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let params: Vec<Vec<f64>> = inputs
            .iter()
            .map(|t| {
                crate::dispatch_dtype!(t.dtype, T => {
                    // SAFETY: parameter arrays are inputs this op does not write.
                    unsafe { t.slice::<T>() }.iter().map(|v| v.to_f64()).collect()
                })
            })
            .collect();
        let per_param: usize = self.shape.iter().product();
        let (seed, draw, out) = (ctx.seed, self.draw, &outputs[0]);
        crate::dispatch_dtype!(out.dtype, T => {
            let op = SendPtr(out.ptr::<T>());
            parallel_chunks(out.size(), PARALLEL_GRAIN / 8, |range| {
                let mut args = vec![0.0; params.len()];
                for i in range {
                    let p = i / per_param.max(1);
                    for (a, values) in args.iter_mut().zip(&params) {
                        *a = values[p];
                    }
                    // SAFETY: i < out.size(); the op owns its output.
                    unsafe { *op.get().add(i) = T::from_f64(draw(seed, i as u64, &args)) };
                }
            });
        });
        Ok(())
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        zero_gradient(d)
    }
}

fn negative_binomial(seed: u64, i: u64, k: f64, p: f64) -> f64 {
    // A Poisson whose mean is gamma distributed: the negative binomial mixture.
    let rate = random::gamma(seed, 2 * i, k) * (1.0 - p) / p;
    random::poisson(seed, 2 * i + 1, rate)
}

crate::op_params! {
    pub struct MultinomialParams {
        /// Number of samples drawn from each distribution.
        shape: Vec<i64> = Vec::new(),
        /// Also return the log-probability of each sample.
        get_prob: bool = false,
        /// Dtype of the sampled indices.
        dtype: DType = DType::I32,
    }
}

/// `_sample_multinomial(data)`: category indices drawn from the probability rows of data.
struct Multinomial {
    shape: Vec<usize>,
    get_prob: bool,
    dtype: DType,
}

impl Operator for Multinomial {
    fn num_outputs(&self) -> usize {
        if self.get_prob {
            2
        } else {
            1
        }
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let d = inputs[0].dims();
        if d.is_empty() || d[d.len() - 1] == 0 {
            crate::bail!(Shape, "_sample_multinomial: data {} must have a non-empty last axis of probabilities", inputs[0]);
        }
        let mut dims = d[..d.len() - 1].to_vec();
        dims.extend_from_slice(&self.shape);
        let out = Shape::new(if dims.is_empty() { vec![1] } else { dims });
        Ok(vec![out; self.num_outputs()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(if self.get_prob { vec![self.dtype, inputs[0]] } else { vec![self.dtype] })
    }
    fn needs_rng(&self) -> bool {
        true
    }
    fn forward(&self, ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let x = &inputs[0];
        let k = *x.shape.dims().last().unwrap_or(&1);
        let probs: Vec<f64> = crate::dispatch_dtype!(x.dtype, T => {
            // SAFETY: data is an input this op does not write.
            unsafe { x.slice::<T>() }.iter().map(|v| v.to_f64()).collect()
        });
        let per_row: usize = self.shape.iter().product();
        let mut picks = vec![0usize; outputs[0].size()];
        for (i, pick) in picks.iter_mut().enumerate() {
            let row = &probs[(i / per_row.max(1)) * k..][..k];
            let u = random::uniform(ctx.seed, i as u64) * row.iter().sum::<f64>();
            let mut acc = 0.0;
            *pick = row
                .iter()
                .position(|&p| {
                    acc += p;
                    u < acc
                })
                .unwrap_or(k - 1);
        }
        crate::dispatch_dtype!(outputs[0].dtype, T => {
            let y = args.output::<T>(0)?;
            y.iter_mut().zip(&picks).for_each(|(v, &p)| *v = T::from_f64(p as f64));
        });
        if self.get_prob {
            crate::dispatch_dtype!(outputs[1].dtype, T => {
                let y = args.output::<T>(1)?;
                for (i, (v, &p)) in y.iter_mut().zip(&picks).enumerate() {
                    *v = T::from_f64(probs[(i / per_row.max(1)) * k + p].ln());
                }
            });
        }
        Ok(())
    }
    /// Only the log-probabilities depend smoothly on data; the drawn indices give no gradient.
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        if !self.get_prob {
            return zero_gradient(d);
        }
        let (prob_grad, data, samples) = (d.out_grad(1), d.input(0), d.output(0));
        Ok(vec![Some(d.op("_backward_sample_multinomial", &[], &[&prob_grad, &data, &samples])?)])
    }
}

/// `_backward_sample_multinomial(prob_grad, data, samples)`: the gradient of the log-probability
/// output with respect to data. d log p[s] / d p[s] = 1 / p[s], so each sample adds its output
/// gradient divided by its probability at the index drawn, and every other entry stays zero.
struct MultinomialBackward;

impl MultinomialBackward {
    /// (rows, categories, samples per row) of data (rows, k) and samples (rows, m...).
    fn layout(inputs: &[Shape]) -> Result<(usize, usize, usize)> {
        let (grad, data, samples) = (&inputs[0], &inputs[1], &inputs[2]);
        let d = data.dims();
        let leading = d.len().saturating_sub(1);
        let rows_fit = samples.ndim() >= leading && samples.dims()[..leading] == d[..leading];
        if d.is_empty() || grad != samples || !rows_fit {
            crate::bail!(
                Shape,
                "_backward_sample_multinomial: gradient {grad} and samples {samples} must share the shape _sample_multinomial \
                 draws from data {data} (data's leading axes, then the samples per distribution)"
            );
        }
        let k = d[d.len() - 1];
        let rows = data.size() / k.max(1);
        Ok((rows, k, samples.size() / rows.max(1)))
    }
}

impl Operator for MultinomialBackward {
    fn input_names(&self) -> Vec<String> {
        vec!["prob_grad".into(), "data".into(), "samples".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        Self::layout(inputs)?;
        Ok(vec![inputs[1].clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        if inputs[0] != inputs[1] {
            crate::bail!(Type, "_backward_sample_multinomial: gradient dtype {} differs from data dtype {}", inputs[0], inputs[1]);
        }
        Ok(vec![inputs[1]])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let shapes: Vec<Shape> = inputs.iter().map(|t| t.shape.clone()).collect();
        let (_, k, per_row) = Self::layout(&shapes)?;
        let picks: Vec<f64> = crate::dispatch_dtype!(inputs[2].dtype, I => {
            args.input::<I>(2)?.iter().map(|v| v.to_f64()).collect()
        });
        if let Some(bad) = picks.iter().find(|&&p| !(p >= 0.0 && p < k as f64 && p.fract() == 0.0)) {
            crate::bail!(Index, "_backward_sample_multinomial: sample {bad} is not a category index of a distribution over {k} categories");
        }
        crate::dispatch_dtype!(outputs[0].dtype, T => {
            let (grad, data, out) = (args.input::<T>(0)?, args.input::<T>(1)?, args.output::<T>(0)?);
            out.iter_mut().for_each(|v| *v = T::from_f64(0.0));
            for (i, (&pick, g)) in picks.iter().zip(grad).enumerate() {
                let at = (i / per_row.max(1)) * k + pick as usize;
                out[at] = T::from_f64(out[at].to_f64() + g.to_f64() / data[at].to_f64());
            }
        });
        Ok(())
    }
}

/// `_shuffle(data)`: a random permutation of the first axis (Fisher-Yates).
struct Shuffle;

impl Operator for Shuffle {
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        Ok(vec![inputs[0].clone()])
    }
    fn needs_rng(&self) -> bool {
        true
    }
    fn forward(&self, ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let (x, out) = (&inputs[0], &outputs[0]);
        let rows = x.shape.dims().first().copied().unwrap_or(1);
        let mut order: Vec<usize> = (0..rows).collect();
        for i in (1..rows).rev() {
            let j = (random::uniform(ctx.seed, i as u64) * (i + 1) as f64) as usize;
            order.swap(i, j.min(i));
        }
        let row_bytes = x.size() / rows.max(1) * x.dtype.size();
        let (xp, op) = (SendPtr(x.raw()), SendPtr(out.raw()));
        parallel_chunks(rows, ((1usize << 16) / row_bytes.max(1)).max(1), |range| {
            for r in range {
                // SAFETY: order[r] < rows; output row r is this task's alone and does not overlap
                // the input (the engine gives shuffle distinct input and output buffers).
                unsafe { std::ptr::copy_nonoverlapping(xp.get().add(order[r] * row_bytes), op.get().add(r * row_bytes), row_bytes) };
            }
        });
        Ok(())
    }
}

fn sample_shape(op: &str, shape: &[i64]) -> Result<Vec<usize>> {
    shape.iter().map(|&d| usize::try_from(d).map_err(|_| crate::err!(Param, "{op}: invalid shape {shape:?}"))).collect()
}

pub(super) fn register(add: &mut dyn FnMut(OpDef)) {
    // Each sampler is also registered under its public MXNet name, the name without the underscore.
    let samplers: [(&'static str, &'static [&'static str], &'static [&'static str], &'static str, Draw); 7] = [
        ("_sample_uniform", &["sample_uniform"], &["low", "high"], "Draws uniform samples in [low, high) per element of low/high.", |s, i, p| {
            p[0] + (p[1] - p[0]) * random::uniform(s, i)
        }),
        (
            "_sample_normal",
            &["sample_normal"],
            &["mu", "sigma"],
            "Draws normal samples with mean mu and standard deviation sigma per element.",
            |s, i, p| p[0] + p[1] * random::normal(s, i),
        ),
        ("_sample_gamma", &["sample_gamma"], &["alpha", "beta"], "Draws gamma samples with shape alpha and scale beta per element.", |s, i, p| {
            p[1] * random::gamma(s, i, p[0])
        }),
        ("_sample_exponential", &["sample_exponential"], &["lam"], "Draws exponential samples with rate lam per element.", |s, i, p| {
            -(1.0 - random::uniform(s, i)).ln() / p[0]
        }),
        ("_sample_poisson", &["sample_poisson"], &["lam"], "Draws Poisson samples with mean lam per element.", |s, i, p| random::poisson(s, i, p[0])),
        (
            "_sample_negative_binomial",
            &["sample_negative_binomial"],
            &["k", "p"],
            "Draws negative binomial samples (failures before k successes) per element.",
            |s, i, p| negative_binomial(s, i, p[0], p[1]),
        ),
        (
            "_sample_generalized_negative_binomial",
            &["sample_generalized_negative_binomial"],
            &["mu", "alpha"],
            "Draws generalized negative binomial samples with mean mu and dispersion alpha per element.",
            |s, i, p| {
                let (mu, alpha) = (p[0], p[1]);
                if alpha == 0.0 {
                    random::poisson(s, i, mu)
                } else {
                    negative_binomial(s, i, 1.0 / alpha, 1.0 / (1.0 + alpha * mu))
                }
            },
        ),
    ];
    for (name, aliases, inputs, doc, draw) in samplers {
        add(OpDef::new(name, aliases, doc, move |p: SampleParams| Ok(Sample { inputs, shape: sample_shape(name, &p.shape)?, dtype: p.dtype, draw })));
    }
    add(OpDef::new(
        "_sample_multinomial",
        &["sample_multinomial"],
        "Draws category indices from the probability distributions in the last axis of data.",
        |p: MultinomialParams| Ok(Multinomial { shape: sample_shape("_sample_multinomial", &p.shape)?, get_prob: p.get_prob, dtype: p.dtype }),
    ));
    add(OpDef::new(
        "_backward_sample_multinomial",
        &[],
        "Gradient of _sample_multinomial's log-probabilities: prob_grad / data added at each sampled index.",
        |_: super::params::NoParams| Ok(MultinomialBackward),
    ));
    add(OpDef::new("_shuffle", &["shuffle"], "Randomly permutes the elements along the first axis.", |_: super::params::NoParams| Ok(Shuffle)));
}
