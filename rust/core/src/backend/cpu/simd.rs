//! Runs a kernel's loops compiled for the widest vector instructions the CPU has.
//!
//! The crate targets baseline x86-64 (SSE2) so that one wheel runs everywhere. A kernel written
//! as plain slice loops passes its body as an `#[inline(always)]` closure to [`vectorized`],
//! which inlines it into a function compiled for AVX-512 (or AVX2 + FMA), so LLVM vectorizes the
//! loops at that width and turns `mul_add` into FMA instructions. Without the attribute a large
//! body may stay a call into baseline code, where `mul_add` is a libm call. The CPU is asked on
//! every call; the standard library caches the answer.

/// Run `body` compiled for AVX-512 (F, VL, DQ, BW) where the CPU has it, else for AVX2 + FMA,
/// else as it is.
#[inline(always)]
pub fn vectorized<R>(body: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    match f32_lanes() {
        // SAFETY: the CPU supports every feature `on_avx512` is compiled for.
        16 => return unsafe { on_avx512(body) },
        // SAFETY: the CPU supports every feature `on_avx2` is compiled for.
        8 => return unsafe { on_avx2(body) },
        _ => {}
    }
    body()
}

/// float32 lanes of the vectors [`vectorized`] compiles for on this CPU: 16 with AVX-512, 8 with
/// AVX2 + FMA, else 4 (SSE2, no FMA). Register-tiled kernels size their tiles by it.
#[inline(always)]
pub fn f32_lanes() -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512dq")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("fma")
        {
            return 16;
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            return 8;
        }
    }
    4
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx512dq,avx512bw,avx2,fma")]
unsafe fn on_avx512<R>(body: impl FnOnce() -> R) -> R {
    body()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn on_avx2<R>(body: impl FnOnce() -> R) -> R {
    body()
}
