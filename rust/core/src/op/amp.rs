//! The operators of automatic mixed precision (MXNet's `mx.contrib.amp`): `amp_cast` and
//! `amp_multicast`, the casts AMP puts in front of operators, and `all_finite` /
//! `multi_all_finite`, the overflow check of its dynamic loss scaling.
//!
//! The casts convert only between the floating-point types AMP mixes (float32, float16,
//! bfloat16); every other dtype (float64 included) passes through unchanged, so a cast placed in
//! front of an operator never touches its integer inputs (indices, labels). The gradient of a
//! cast is the output gradient cast back to the input's dtype.

use super::grad::{Grad, InputGrads};
use super::shape_ops::cast_args;
use super::{exactly, ExecContext, OpDef, Operator, PARALLEL_GRAIN};
use crate::base::{merge_partial, unify_partial, DType, Elem, PartialShape, Shape};
use crate::error::Result;
use crate::op::KernelArgs;

/// Whether AMP casts values of this dtype.
fn amp_float(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
}

crate::op_params! {
    pub struct AmpCastParams {
        /// Output data type.
        dtype: DType,
    }
}

/// `amp_cast(data)`: `data` in `dtype` when it is float32, float16 or bfloat16, else unchanged.
struct AmpCast {
    dtype: DType,
}

impl Operator for AmpCast {
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [x] = exactly("amp_cast", "input", inputs)?;
        Ok(vec![x.clone()])
    }
    fn infer_partial_shapes(&self, inputs: &mut [Option<PartialShape>], outputs: &mut [Option<PartialShape>]) -> Result<()> {
        unify_partial(inputs, outputs)
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[x] = exactly("amp_cast", "input", inputs)?;
        Ok(vec![if amp_float(x) { self.dtype } else { x }])
    }
    /// AMP casts floating-point values, and while the input's dtype is unknown it is taken to be
    /// one: the operators after the cast see `dtype` (MXNet infers the same through them).
    fn fixed_output_types(&self) -> Option<Vec<DType>> {
        Some(vec![self.dtype])
    }
    /// The output's dtype tells nothing about the input's: an unknown input stays unknown (AMP's
    /// graph conversion decides it).
    fn complete_input_types(&self, _inputs: &mut [Option<DType>]) {}
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        cast_args(args, 0, 0)
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (x, g) = (d.input(0), d.out_grad(0));
        Ok(vec![Some(d.binary("_cast_like", &g, &x)?)])
    }
}

crate::op_params! {
    pub struct AmpMultiCastParams {
        /// Number of input/output pairs to be casted to the widest type.
        num_outputs: usize,
        /// Whether to cast to the narrowest type.
        cast_narrow: bool = false,
    }
}

/// `amp_multicast(data_0, ..., data_{n-1})`: every float32/float16/bfloat16 input in one dtype,
/// the widest among them (float32 if any is), or with `cast_narrow` the narrowest (float16 or
/// bfloat16 if any is); other inputs pass through unchanged.
struct AmpMultiCast {
    p: AmpMultiCastParams,
}

impl AmpMultiCast {
    /// The dtype the AMP floats among `dtypes` are cast to (`None`: there are none).
    fn common(&self, dtypes: impl Iterator<Item = DType>) -> Option<DType> {
        let floats: Vec<DType> = dtypes.filter(|&d| amp_float(d)).collect();
        let first = *floats.first()?;
        Some(if self.p.cast_narrow {
            floats.into_iter().find(|&d| d != DType::F32).unwrap_or(DType::F32)
        } else if floats.contains(&DType::F32) {
            DType::F32
        } else {
            first
        })
    }
}

impl Operator for AmpMultiCast {
    fn input_names(&self) -> Vec<String> {
        (0..self.p.num_outputs).map(|i| format!("data_{i}")).collect()
    }
    fn num_outputs(&self) -> usize {
        self.p.num_outputs
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        Ok(inputs.to_vec())
    }
    fn infer_partial_shapes(&self, inputs: &mut [Option<PartialShape>], outputs: &mut [Option<PartialShape>]) -> Result<()> {
        for (input, output) in inputs.iter_mut().zip(outputs.iter_mut()) {
            if let Some(shape) = input.clone() {
                merge_partial(output, &shape)?;
            }
            if let Some(shape) = output.clone() {
                merge_partial(input, &shape)?;
            }
        }
        Ok(())
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let common = self.common(inputs.iter().copied());
        Ok(inputs.iter().map(|&d| if amp_float(d) { common.unwrap_or(d) } else { d }).collect())
    }
    /// Which dtype an input should have depends on all of them: unknown inputs stay unknown.
    fn complete_input_types(&self, _inputs: &mut [Option<DType>]) {}
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        (0..args.outputs().len()).try_for_each(|i| cast_args(args, i, i))
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        (0..self.p.num_outputs)
            .map(|i| {
                let (x, g) = (d.input(i), d.out_grad(i));
                Ok(Some(d.binary("_cast_like", &g, &x)?))
            })
            .collect()
    }
}

crate::op_params! {
    pub struct AllFiniteParams {
        /// Initialize output to 1.
        init_output: bool = true,
    }
}

crate::op_params! {
    pub struct MultiAllFiniteParams {
        /// Number of arrays.
        num_arrays: usize = 1,
        /// Initialize output to 1.
        init_output: bool = true,
    }
}

/// Whether every element of input `i` is finite once converted to float32 (as MXNet checks: a
/// float64 beyond float32's range counts as an overflow).
fn finite(op: &str, args: &KernelArgs, i: usize) -> Result<bool> {
    use half::{bf16, f16};
    // The 32- and 16-bit floats by their bits: an all-ones exponent is an infinity or NaN. A
    // branch-free count over each chunk vectorizes, where a short-circuiting test per value did
    // not (the loss scaler checks every gradient each step: 3.8M float32 values took 0.68 ms).
    match args.input_dtype(i)? {
        DType::F32 => return Ok(none_all_ones(args.input::<f32>(i)?, f32::to_bits, 0x7f80_0000)),
        DType::BF16 => return Ok(none_all_ones(args.input::<bf16>(i)?, bf16::to_bits, 0x7f80)),
        DType::F16 => return Ok(none_all_ones(args.input::<f16>(i)?, f16::to_bits, 0x7c00)),
        _ => {}
    }
    crate::dispatch_dtype!(args.input_dtype(i)?, [F64], T => {
        let values = args.input::<T>(i)?;
        let parts = crate::engine::parallel::map(values.len().div_ceil(PARALLEL_GRAIN), |p| {
            values.chunks(PARALLEL_GRAIN).nth(p).unwrap_or_default().iter().all(|v| (v.to_f64() as f32).is_finite())
        });
        Ok(parts.into_iter().all(|part| part))
    }, other => crate::bail!(Type, "{op}: arrays must be floating point, got {other}"))
}

/// Whether no value of `values` has all the bits of `mask` set in its `bits`, counted chunk by
/// chunk on the thread pool.
fn none_all_ones<T: Copy + Sync, B: Copy + Sync + PartialEq + std::ops::BitAnd<Output = B>>(
    values: &[T],
    bits: impl Fn(T) -> B + Sync,
    mask: B,
) -> bool {
    let parts = crate::engine::parallel::map(values.len().div_ceil(PARALLEL_GRAIN), |p| {
        let chunk = values.chunks(PARALLEL_GRAIN).nth(p).unwrap_or_default();
        crate::backend::cpu::simd::vectorized(
            #[inline(always)]
            || chunk.iter().filter(|&&v| bits(v) & mask == mask).count(),
        )
    });
    parts.into_iter().all(|bad| bad == 0)
}

/// `all_finite` / `multi_all_finite`: a float32 array of one value, 0 when some input holds an
/// infinity or NaN. With `init_output` the value starts at 1; without it an all-finite check
/// leaves the output as it was, so several calls into one output accumulate their verdicts.
struct AllFinite {
    name: &'static str,
    num_arrays: usize,
    init_output: bool,
}

impl Operator for AllFinite {
    fn input_names(&self) -> Vec<String> {
        if self.name == "all_finite" {
            vec!["data".into()]
        } else {
            (0..self.num_arrays).map(|i| format!("array_{i}")).collect()
        }
    }
    fn infer_shape(&self, _inputs: &[Shape]) -> Result<Vec<Shape>> {
        Ok(vec![Shape::new(vec![1])])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        if let Some(bad) = inputs.iter().find(|d| !d.is_float()) {
            crate::bail!(Type, "{}: arrays must be floating point, got {bad}", self.name);
        }
        Ok(vec![DType::F32])
    }
    fn fixed_output_types(&self) -> Option<Vec<DType>> {
        Some(vec![DType::F32])
    }
    fn complete_input_types(&self, _inputs: &mut [Option<DType>]) {}
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let mut all_finite = true;
        for i in 0..args.inputs().len() {
            all_finite = all_finite && finite(self.name, args, i)?;
        }
        let [verdict] = args.output::<f32>(0)? else {
            crate::bail!(Runtime, "{}: the output must hold one value", self.name);
        };
        if !all_finite {
            *verdict = 0.0;
        } else if self.init_output {
            *verdict = 1.0;
        }
        Ok(())
    }
}

pub(super) fn register(add: &mut dyn FnMut(OpDef)) {
    add(OpDef::new(
        "amp_cast",
        &[],
        "Cast function between low precision float/FP32 used by AMP: float32, float16 and bfloat16 inputs are cast to dtype, others \
         pass through.",
        |p: AmpCastParams| Ok(AmpCast { dtype: p.dtype }),
    ));
    add(OpDef::new(
        "amp_multicast",
        &[],
        "Cast function used by AMP, that casts its inputs to the common widest type (or, with cast_narrow, the narrowest); only \
         float32, float16 and bfloat16 inputs are cast.",
        |p: AmpMultiCastParams| {
            if p.num_outputs == 0 {
                crate::bail!(Param, "amp_multicast: num_outputs must be at least 1");
            }
            Ok(AmpMultiCast { p })
        },
    ));
    add(OpDef::new(
        "all_finite",
        &[],
        "Check if all the float numbers in the array are finite (used for AMP): a float32 array of one value, 1 or 0.",
        |p: AllFiniteParams| Ok(AllFinite { name: "all_finite", num_arrays: 1, init_output: p.init_output }),
    ));
    add(OpDef::new(
        "multi_all_finite",
        &[],
        "Check if all the float numbers in all the arrays are finite (used for AMP): a float32 array of one value, 1 or 0.",
        |p: MultiAllFiniteParams| {
            if p.num_arrays == 0 {
                crate::bail!(Param, "multi_all_finite: num_arrays must be at least 1");
            }
            Ok(AllFinite { name: "multi_all_finite", num_arrays: p.num_arrays, init_output: p.init_output })
        },
    ));
}
