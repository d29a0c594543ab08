//! CPU micro-kernels that operators build on: the packed AVX-512 GEMM with its float32,
//! AVX512-BF16 and AMX precisions (`packed_gemm`, `amx`), dot products of rows for skinny
//! products (`row_dots`), the vectorization wrapper every element-wise loop runs in (`simd`)
//! and float32 exp/tanh/sigmoid that vectorize (`fast_math`). They take pointers or slices and
//! know nothing of operators, arrays or the engine, only of the thread pool.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::indexing_slicing))]

#[cfg(target_arch = "x86_64")]
pub(crate) mod amx;
pub(crate) mod fast_math;
#[cfg(target_arch = "x86_64")]
pub(crate) mod packed_gemm;
pub(crate) mod row_dots;
pub(crate) mod simd;
