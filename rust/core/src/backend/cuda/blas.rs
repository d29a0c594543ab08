//! Matrix products through cuBLAS (`cublasGemmStridedBatchedEx`), for row-major operands.
//!
//! float32 products compute in full float32 precision, as MXNet 1.9.1's do by default;
//! `OXNET_CUDA_ALLOW_TF32=1` lets cuBLAS use TF32 tensor cores for them (about 8x faster on a
//! Hopper GPU, with a 10-bit mantissa on the inputs). float16 and bfloat16 products accumulate in
//! float32 on tensor cores; float64 ones in float64.

use std::ffi::c_void;
use std::sync::{Mutex, MutexGuard, PoisonError};

use cudarc::cublas::{result as cublas, sys};

use super::device::Gpu;
use crate::base::DType;
use crate::error::{Error, Result};
use crate::op::Tensor;

/// A cuBLAS handle bound to its device's stream.
pub struct Blas {
    handle: sys::cublasHandle_t,
}

// SAFETY: a cuBLAS handle may move between threads; concurrent use is what it forbids, and the
// device keeps it behind a mutex.
unsafe impl Send for Blas {}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: the handle came from cublasCreate and is destroyed once; a failure to destroy
        // at exit only leaks it.
        let _ = unsafe { cublas::destroy_handle(self.handle) };
    }
}

fn blas_error(e: cublas::CublasError, doing: &str) -> Error {
    crate::err!(Device, "{doing}: cuBLAS error {:?}", e.0)
}

/// The device's cuBLAS handle, created on first use (the library is loaded then; its absence is
/// an error naming it, not a panic).
fn handle(gpu: &Gpu) -> Result<MutexGuard<'_, Blas>> {
    let created = gpu.blas.get_or_init(|| {
        // SAFETY: is_culib_present only attempts to dlopen the library.
        if !unsafe { sys::is_culib_present() } {
            return Err(crate::err!(
                Device,
                "the cuBLAS library libcublas could not be loaded: install it with `pip install nvidia-cublas` or add its folder to LD_LIBRARY_PATH"
            ));
        }
        gpu.bind()?;
        let handle = cublas::create_handle().map_err(|e| blas_error(e, "creating a cuBLAS handle"))?;
        let blas = Blas { handle };
        // SAFETY: the handle is valid and the stream belongs to its device's (current) context.
        unsafe { cublas::set_stream(blas.handle, gpu.raw_stream() as _) }.map_err(|e| blas_error(e, "binding cuBLAS to the stream"))?;
        Ok(Mutex::new(blas))
    });
    match created {
        Ok(blas) => Ok(blas.lock().unwrap_or_else(PoisonError::into_inner)),
        Err(e) => Err(e.clone()),
    }
}

/// `c[b] = alpha * op(a[b]) * op(b[b]) + beta * c[b]` for `batch` row-major matrices: `op(a)` is
/// `m x k`, `op(b)` is `k x n`, `c` is `m x n`.
#[derive(Clone, Copy, Debug)]
pub struct Gemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
    pub transpose_a: bool,
    pub transpose_b: bool,
    pub alpha: f64,
    pub beta: f64,
    /// Elements between consecutive matrices of a, b and c (None: packed one after another; a
    /// stride of 0 uses one matrix for the whole batch).
    pub strides: Option<[usize; 3]>,
}

fn allow_tf32() -> bool {
    static ALLOW: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ALLOW.get_or_init(|| std::env::var("OXNET_CUDA_ALLOW_TF32").is_ok_and(|v| v.trim() == "1"))
}

/// Enqueue `gemm` over device tensors of one dtype.
pub fn gemm(gpu: &Gpu, gemm: &Gemm, a: &Tensor, b: &Tensor, c: &Tensor) -> Result<()> {
    let dtype = c.dtype;
    if a.dtype != dtype || b.dtype != dtype {
        crate::bail!(Type, "a GPU matrix product needs operands of one dtype, got {}, {} and {}", a.dtype, b.dtype, dtype);
    }
    let Gemm { m, n, k, batch, .. } = *gemm;
    let [stride_a, stride_b, stride_c] = gemm.strides.unwrap_or([m * k, k * n, m * n]);
    let needed = |stride: usize, matrix: usize| if batch == 0 { 0 } else { stride * (batch - 1) + matrix };
    if a.size() < needed(stride_a, m * k) || b.size() < needed(stride_b, k * n) || c.size() < needed(stride_c, m * n) {
        crate::bail!(
            Shape,
            "GPU matrix product of {batch} x ({m} x {k}) by ({k} x {n}): operands of {}, {} and {} elements are too small",
            a.size(),
            b.size(),
            c.size()
        );
    }
    if m == 0 || n == 0 || batch == 0 {
        return Ok(());
    }
    let int = |v: usize| i32::try_from(v).map_err(|_| crate::err!(Shape, "GPU matrix product: dimension {v} exceeds cuBLAS's 32-bit range"));
    let (data_type, compute) = match dtype {
        DType::F32 if allow_tf32() => (sys::cudaDataType::CUDA_R_32F, sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32),
        DType::F32 => (sys::cudaDataType::CUDA_R_32F, sys::cublasComputeType_t::CUBLAS_COMPUTE_32F),
        DType::F16 => (sys::cudaDataType::CUDA_R_16F, sys::cublasComputeType_t::CUBLAS_COMPUTE_32F),
        DType::BF16 => (sys::cudaDataType::CUDA_R_16BF, sys::cublasComputeType_t::CUBLAS_COMPUTE_32F),
        DType::F64 => (sys::cudaDataType::CUDA_R_64F, sys::cublasComputeType_t::CUBLAS_COMPUTE_64F),
        other => crate::bail!(Type, "GPU matrix products support float16, bfloat16, float32 and float64, got {other}"),
    };
    // Scalars in the compute type (float for every type but float64).
    let (alpha32, beta32) = (gemm.alpha as f32, gemm.beta as f32);
    let (alpha_ptr, beta_ptr): (*const c_void, *const c_void) = if dtype == DType::F64 {
        (&gemm.alpha as *const f64 as *const c_void, &gemm.beta as *const f64 as *const c_void)
    } else {
        (&alpha32 as *const f32 as *const c_void, &beta32 as *const f32 as *const c_void)
    };
    let op = |t: bool| if t { sys::cublasOperation_t::CUBLAS_OP_T } else { sys::cublasOperation_t::CUBLAS_OP_N };
    // cuBLAS is column-major: the row-major product C = A B is the column-major C^T = B^T A^T,
    // and a row-major matrix read column-major is its transpose, so the operands swap places.
    let ld_a = if gemm.transpose_a { m } else { k };
    let ld_b = if gemm.transpose_b { k } else { n };
    let blas = handle(gpu)?;
    gpu.bind()?;
    // SAFETY: the three addresses are device arrays that hold every matrix of the batch at
    // its stride, of `dtype` (checked above), held by the calling engine op until the stream has
    // run the product; the scalars outlive the call, which reads them before returning (host
    // pointer mode).
    unsafe {
        cublas::gemm_strided_batched_ex(
            blas.handle,
            op(gemm.transpose_b),
            op(gemm.transpose_a),
            int(n)?,
            int(m)?,
            int(k)?,
            alpha_ptr,
            b.raw() as *const c_void,
            data_type,
            int(ld_b)?,
            stride_b as i64,
            a.raw() as *const c_void,
            data_type,
            int(ld_a)?,
            stride_a as i64,
            beta_ptr,
            c.raw() as *mut c_void,
            data_type,
            int(n)?,
            stride_c as i64,
            int(batch)?,
            compute,
            sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|e| blas_error(e, &format!("GPU matrix product {batch} x ({m} x {k}) by ({k} x {n}) in {dtype}")))
}
