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
use super::{exactly, first_input, parallel_units, zero_gradient, ExecContext, OpDef, Operator, PARALLEL_GRAIN};
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

/// Draws sample `index` (a counter under `seed`) given one element of each parameter array; a
/// one-parameter distribution gets 0 as the second.
type Draw = fn(u64, u64, [f64; 2]) -> f64;

struct Sample {
    name: &'static str,
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
        let first = first_input(self.name, inputs)?;
        if let Some(bad) = inputs.iter().find(|s| *s != first) {
            crate::bail!(Shape, "{}: parameter arrays must share one shape, got {first} and {bad}", self.name);
        }
        let mut dims = first.dims().to_vec();
        dims.extend_from_slice(&self.shape);
        Ok(vec![Shape::new(dims)])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let Some(&first) = inputs.first() else {
            crate::bail!(Type, "{}: at least one parameter array is needed, got none", self.name);
        };
        Ok(vec![self.dtype.unwrap_or(first)])
    }
    fn needs_rng(&self) -> bool {
        true
    }
    fn forward(&self, ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let params = (0..args.inputs().len()).map(|i| args.input_f64(i)).collect::<Result<Vec<_>>>()?;
        let per_param = self.shape.iter().product::<usize>().max(1);
        let (seed, draw, name) = (ctx.seed, self.draw, self.name);
        crate::dispatch_dtype!(args.output_dtype(0)?, T => {
            // Split by element, not by parameter, so that a few parameters with many samples each
            // still spread over the threads.
            parallel_units(args.output::<T>(0)?, 1, PARALLEL_GRAIN / 8, |first, piece| {
                let (mut values, mut loaded) = ([0.0; 2], None);
                for (i, y) in (first..).zip(piece.iter_mut()) {
                    let p = i / per_param;
                    if loaded != Some(p) {
                        for (value, param) in values.iter_mut().zip(&params) {
                            *value = *param.get(p).ok_or_else(|| crate::err!(Runtime, "{name}: output element {i} has no parameter element {p}"))?;
                        }
                        loaded = Some(p);
                    }
                    *y = T::from_f64(draw(seed, i as u64, values));
                }
                Ok(())
            })
        })
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
        let [data] = exactly("_sample_multinomial", "input", inputs)?;
        let Some((_, leading)) = data.dims().split_last().filter(|&(&k, _)| k > 0) else {
            crate::bail!(Shape, "_sample_multinomial: data {data} must have a non-empty last axis of probabilities");
        };
        let mut dims = leading.to_vec();
        dims.extend_from_slice(&self.shape);
        let out = Shape::new(if dims.is_empty() { vec![1] } else { dims });
        Ok(vec![out; self.num_outputs()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[data] = exactly("_sample_multinomial", "input", inputs)?;
        Ok(if self.get_prob { vec![self.dtype, data] } else { vec![self.dtype] })
    }
    fn needs_rng(&self) -> bool {
        true
    }
    fn forward(&self, ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let k = args.input_shape(0)?.dims().last().copied().unwrap_or(1).max(1);
        let probs = args.input_f64(0)?;
        let per_row = self.shape.iter().product::<usize>().max(1);
        // Each sample's category and its probability.
        let mut picks = vec![(0usize, 0.0f64); args.output_shape(0)?.size()];
        for ((r, row_picks), (&last, rest)) in picks.chunks_mut(per_row).enumerate().zip(probs.chunks_exact(k).filter_map(<[f64]>::split_last)) {
            let total = rest.iter().sum::<f64>() + last;
            for (j, pick) in row_picks.iter_mut().enumerate() {
                let u = random::uniform(ctx.seed, (r * per_row + j) as u64) * total;
                let mut acc = 0.0;
                // Past every other category's share (rounding included) is the last category.
                let (index, &p) = rest
                    .iter()
                    .enumerate()
                    .find(|&(_, &p)| {
                        acc += p;
                        u < acc
                    })
                    .unwrap_or((rest.len(), &last));
                *pick = (index, p);
            }
        }
        crate::dispatch_dtype!(args.output_dtype(0)?, T => {
            let y = args.output::<T>(0)?;
            y.iter_mut().zip(&picks).for_each(|(v, &(index, _))| *v = T::from_f64(index as f64));
        });
        if self.get_prob {
            crate::dispatch_dtype!(args.output_dtype(1)?, T => {
                let y = args.output::<T>(1)?;
                y.iter_mut().zip(&picks).for_each(|(v, &(_, p))| *v = T::from_f64(p.ln()));
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
        let [grad, data, samples] = exactly("_backward_sample_multinomial", "input", inputs)?;
        let split = data.dims().split_last().filter(|(_, leading)| samples.dims().get(..leading.len()) == Some(*leading));
        let (Some((&k, _)), true) = (split, grad == samples) else {
            crate::bail!(
                Shape,
                "_backward_sample_multinomial: gradient {grad} and samples {samples} must share the shape _sample_multinomial \
                 draws from data {data} (data's leading axes, then the samples per distribution)"
            );
        };
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
        let [_, data, _] = exactly("_backward_sample_multinomial", "input", inputs)?;
        Ok(vec![data.clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[grad, data, _] = exactly("_backward_sample_multinomial", "input", inputs)?;
        if grad != data {
            crate::bail!(Type, "_backward_sample_multinomial: gradient dtype {grad} differs from data dtype {data}");
        }
        Ok(vec![data])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let shapes = [args.input_shape(0)?.clone(), args.input_shape(1)?.clone(), args.input_shape(2)?.clone()];
        let (_, k, per_row) = Self::layout(&shapes)?;
        let picks = args.input_f64(2)?;
        if let Some(bad) = picks.iter().find(|&&p| !(p >= 0.0 && p < k as f64 && p.fract() == 0.0)) {
            crate::bail!(Index, "_backward_sample_multinomial: sample {bad} is not a category index of a distribution over {k} categories");
        }
        crate::dispatch_dtype!(args.output_dtype(0)?, T => {
            let (grad, data, out) = (args.input::<T>(0)?, args.input::<T>(1)?, args.output::<T>(0)?);
            out.iter_mut().for_each(|v| *v = T::from_f64(0.0));
            let (k, per_row) = (k.max(1), per_row.max(1));
            let rows = out.chunks_exact_mut(k).zip(data.chunks_exact(k)).zip(picks.chunks(per_row).zip(grad.chunks(per_row)));
            for ((out_row, data_row), (row_picks, row_grad)) in rows {
                for (&pick, g) in row_picks.iter().zip(row_grad) {
                    let category = pick as usize;
                    let (Some(y), Some(p)) = (out_row.get_mut(category), data_row.get(category)) else {
                        crate::bail!(Index, "_backward_sample_multinomial: sample {pick} is past the {k} categories of its distribution");
                    };
                    *y = T::from_f64(y.to_f64() + g.to_f64() / p.to_f64());
                }
            }
        });
        Ok(())
    }
}

/// `_shuffle(data)`: a random permutation of the first axis (Fisher-Yates).
struct Shuffle;

impl Operator for Shuffle {
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [data] = exactly("_shuffle", "input", inputs)?;
        Ok(vec![data.clone()])
    }
    fn needs_rng(&self) -> bool {
        true
    }
    fn forward(&self, ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let rows = args.input_shape(0)?.dims().first().copied().unwrap_or(1);
        let mut order: Vec<usize> = (0..rows).collect();
        for i in (1..rows).rev() {
            let j = (random::uniform(ctx.seed, i as u64) * (i + 1) as f64) as usize;
            order.swap(i, j.min(i));
        }
        crate::dispatch_dtype!(args.input_dtype(0)?, T => {
            let (x, out) = (args.input::<T>(0)?, args.output::<T>(0)?);
            // An empty row has nothing to copy; one element keeps the chunk size non-zero.
            let row_len = (x.len() / rows.max(1)).max(1);
            let row_bytes = row_len * std::mem::size_of::<T>();
            parallel_units(out, row_len, ((1usize << 16) / row_bytes).max(1), |first, piece| {
                for (&from, row) in order.iter().skip(first).zip(piece.chunks_exact_mut(row_len)) {
                    let source = x.get(from * row_len..(from + 1) * row_len).ok_or_else(|| crate::err!(Runtime, "_shuffle: input row {from} is past the input's {} elements", x.len()))?;
                    row.copy_from_slice(source);
                }
                Ok(())
            })
        })
    }
}

fn sample_shape(op: &str, shape: &[i64]) -> Result<Vec<usize>> {
    shape.iter().map(|&d| usize::try_from(d).map_err(|_| crate::err!(Param, "{op}: invalid shape {shape:?}"))).collect()
}

pub(super) fn register(add: &mut dyn FnMut(OpDef)) {
    // Each sampler is also registered under its public MXNet name, the name without the underscore.
    let samplers: [(&'static str, &'static [&'static str], &'static [&'static str], &'static str, Draw); 7] = [
        (
            "_sample_uniform",
            &["sample_uniform"],
            &["low", "high"],
            "Draws uniform samples in [low, high) per element of low/high.",
            |s, i, [low, high]| low + (high - low) * random::uniform(s, i),
        ),
        (
            "_sample_normal",
            &["sample_normal"],
            &["mu", "sigma"],
            "Draws normal samples with mean mu and standard deviation sigma per element.",
            |s, i, [mu, sigma]| mu + sigma * random::normal(s, i),
        ),
        (
            "_sample_gamma",
            &["sample_gamma"],
            &["alpha", "beta"],
            "Draws gamma samples with shape alpha and scale beta per element.",
            |s, i, [alpha, beta]| beta * random::gamma(s, i, alpha),
        ),
        ("_sample_exponential", &["sample_exponential"], &["lam"], "Draws exponential samples with rate lam per element.", |s, i, [lam, _]| {
            -(1.0 - random::uniform(s, i)).ln() / lam
        }),
        ("_sample_poisson", &["sample_poisson"], &["lam"], "Draws Poisson samples with mean lam per element.", |s, i, [lam, _]| {
            random::poisson(s, i, lam)
        }),
        (
            "_sample_negative_binomial",
            &["sample_negative_binomial"],
            &["k", "p"],
            "Draws negative binomial samples (failures before k successes) per element.",
            |s, i, [k, p]| negative_binomial(s, i, k, p),
        ),
        (
            "_sample_generalized_negative_binomial",
            &["sample_generalized_negative_binomial"],
            &["mu", "alpha"],
            "Draws generalized negative binomial samples with mean mu and dispersion alpha per element.",
            |s, i, [mu, alpha]| {
                if alpha == 0.0 {
                    random::poisson(s, i, mu)
                } else {
                    negative_binomial(s, i, 1.0 / alpha, 1.0 / (1.0 + alpha * mu))
                }
            },
        ),
    ];
    for (name, aliases, inputs, doc, draw) in samplers {
        add(OpDef::new(name, aliases, doc, move |p: SampleParams| {
            Ok(Sample { name, inputs, shape: sample_shape(name, &p.shape)?, dtype: p.dtype, draw })
        }));
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
