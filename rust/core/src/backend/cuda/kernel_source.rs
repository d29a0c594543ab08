//! CUDA C++ source of the kernels generated from the op table for one storage dtype: element-wise
//! operators (from [`Elementwise::cuda_expr`]; flat, and strided for broadcasting), reductions
//! (from [`Reduction`]) and fused chains. NVRTC compiles the
//! text alone: the prelude defines the 16-bit float and bool storage types and their conversions
//! itself, so no CUDA header has to be found at run time.

use crate::base::DType;
use crate::op::{Elementwise, Reduction};

/// Device code every generated kernel may use: storage types and their loads (to the compute
/// type) and stores (from any arithmetic value), and the math whose MXNet meaning differs from
/// C++'s: integer division by zero gives 0, `mod` takes the divisor's sign, `maximum` and
/// `minimum` keep NaN from the left operand, integer `power` wraps.
pub const PRELUDE: &str = r#"
struct ox_half { unsigned short bits; };
struct ox_bf16 { unsigned short bits; };
struct ox_bool { unsigned char value; };

__device__ __forceinline__ float ox_load(float v) { return v; }
__device__ __forceinline__ double ox_load(double v) { return v; }
__device__ __forceinline__ float ox_load(ox_half v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
    return f;
}
__device__ __forceinline__ float ox_load(ox_bf16 v) { return __uint_as_float(((unsigned int)v.bits) << 16); }
__device__ __forceinline__ long long ox_load(unsigned char v) { return v; }
__device__ __forceinline__ long long ox_load(signed char v) { return v; }
__device__ __forceinline__ long long ox_load(int v) { return v; }
__device__ __forceinline__ long long ox_load(long long v) { return v; }
__device__ __forceinline__ long long ox_load(ox_bool v) { return v.value; }

template <typename V> __device__ __forceinline__ void ox_store(float* p, V v) { *p = (float)v; }
template <typename V> __device__ __forceinline__ void ox_store(double* p, V v) { *p = (double)v; }
template <typename V> __device__ __forceinline__ void ox_store(ox_half* p, V v) {
    float f = (float)v;
    unsigned short bits;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(f));
    p->bits = bits;
}
/* Round to nearest even on the bits; NaN stays a quiet NaN (rounding could carry it to inf). */
template <typename V> __device__ __forceinline__ void ox_store(ox_bf16* p, V v) {
    unsigned int u = __float_as_uint((float)v);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        p->bits = (unsigned short)((u >> 16) | 0x40u);
    } else {
        p->bits = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
}
template <typename V> __device__ __forceinline__ void ox_store(unsigned char* p, V v) { *p = (unsigned char)v; }
template <typename V> __device__ __forceinline__ void ox_store(signed char* p, V v) { *p = (signed char)v; }
template <typename V> __device__ __forceinline__ void ox_store(int* p, V v) { *p = (int)v; }
template <typename V> __device__ __forceinline__ void ox_store(long long* p, V v) { *p = (long long)v; }
template <typename V> __device__ __forceinline__ void ox_store(ox_bool* p, V v) { p->value = v != 0; }

template <typename T> __device__ __forceinline__ T ox_div(T a, T b) { return a / b; }
__device__ __forceinline__ long long ox_div(long long a, long long b) {
    return b == 0 ? 0 : (b == -1 ? (long long)(0ull - (unsigned long long)a) : a / b);
}
template <typename T> __device__ __forceinline__ T ox_mod(T a, T b) {
    if (b == 0) return 0;
    T r = fmod(a, b);
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
__device__ __forceinline__ long long ox_mod(long long a, long long b) {
    if (b == 0 || b == -1) return 0;
    long long r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
template <typename T> __device__ __forceinline__ T ox_power(T a, T b) { return pow(a, b); }
__device__ __forceinline__ long long ox_power(long long a, long long b) {
    if (b < 0) return (long long)pow((double)a, (double)b);
    unsigned long long result = 1, base = (unsigned long long)a;
    for (unsigned long long e = b > 0xffffffffll ? 0xffffffffull : (unsigned long long)b; e != 0; e >>= 1) {
        if (e & 1) result *= base;
        base *= base;
    }
    return (long long)result;
}
template <typename T> __device__ __forceinline__ T ox_maximum(T a, T b) { return (isnan(a) || a > b) ? a : b; }
__device__ __forceinline__ long long ox_maximum(long long a, long long b) { return a > b ? a : b; }
template <typename T> __device__ __forceinline__ T ox_minimum(T a, T b) { return (isnan(a) || a < b) ? a : b; }
__device__ __forceinline__ long long ox_minimum(long long a, long long b) { return a < b ? a : b; }
template <typename T> __device__ __forceinline__ T ox_hypot(T a, T b) { return hypot(a, b); }
__device__ __forceinline__ long long ox_hypot(long long a, long long b) { return (long long)hypot((double)a, (double)b); }

/* The CPU kernel's algorithm (recurrence up to 6, then the asymptotic series), in double. */
__device__ double ox_digamma_f64(double x) {
    if (isnan(x) || x == -__longlong_as_double(0x7ff0000000000000LL)) return x - x;
    if (x <= 0 && x == floor(x)) return __longlong_as_double(0x7ff8000000000000LL);
    double result = 0;
    if (x < 0) {
        const double pi = 3.141592653589793;
        result = -pi / tan(pi * x);
        x = 1 - x;
    }
    while (x < 6) {
        result -= 1 / x;
        x += 1;
    }
    double inv2 = 1 / (x * x);
    return result + log(x) - 0.5 / x
        - inv2 * (1.0 / 12 - inv2 * (1.0 / 120 - inv2 * (1.0 / 252 - inv2 * (1.0 / 240 - inv2 / 132))));
}
template <typename T> __device__ __forceinline__ T ox_digamma(T x) { return (T)ox_digamma_f64((double)x); }

/* Four consecutive elements moved as one aligned access (128 bits for 32-bit types). */
template <typename T> struct __align__(sizeof(T) * 4) ox_vec4 { T v[4]; };

/* The host's counter-based generator (crate::random): element `index` of the op seeded with
   `seed` draws the same bits on every device. */
__device__ __forceinline__ unsigned long long ox_mix(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
__device__ __forceinline__ double ox_uniform(unsigned long long seed, unsigned long long index) {
    const unsigned long long bits = ox_mix(seed ^ ox_mix(index * 0x9E3779B97F4A7C15ull + seed));
    return (double)(bits >> 11) * (1.0 / 9007199254740992.0);
}

/* Where a broadcast binary kernel reads: the output's dims (collapsed as on the CPU) and each
   operand's element strides along them, 0 where the operand is broadcast. */
#define OX_MAX_DIMS 8
struct ox_broadcast {
    long long dims[OX_MAX_DIMS];
    long long lhs_strides[OX_MAX_DIMS];
    long long rhs_strides[OX_MAX_DIMS];
    int ndim;
};

/* What a reduction kernel reads: the kept dims with the input's strides along them (output
   element o starts at their offset), the reduced dims with theirs, and how many elements each
   output combines. */
struct ox_reduce {
    long long kept_dims[OX_MAX_DIMS];
    long long kept_strides[OX_MAX_DIMS];
    long long reduced_dims[OX_MAX_DIMS];
    long long reduced_strides[OX_MAX_DIMS];
    int kept_ndim;
    int reduced_ndim;
    unsigned long long count;
};

/* The input offset of linear index `index` over `ndim` dims with the given strides. */
__device__ __forceinline__ long long ox_offset(unsigned long long index, const long long* dims, const long long* strides, int ndim) {
    long long offset = 0;
    for (int d = ndim - 1; d >= 0; --d) {
        offset += (long long)(index % (unsigned long long)dims[d]) * strides[d];
        index /= (unsigned long long)dims[d];
    }
    return offset;
}
"#;

/// The C++ type a dtype is stored as in device memory.
pub fn storage_type(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "float",
        DType::F64 => "double",
        DType::F16 => "ox_half",
        DType::BF16 => "ox_bf16",
        DType::U8 => "unsigned char",
        DType::I8 => "signed char",
        DType::I32 => "int",
        DType::I64 => "long long",
        DType::Bool => "ox_bool",
    }
}

/// The type the math runs in, as on the CPU: float for 16- and 32-bit floats, double for float64
/// and for integers in unary math, long long for integers in binary math.
fn compute_type(dtype: DType, binary_math: bool) -> &'static str {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => "float",
        DType::F64 => "double",
        _ if binary_math => "long long",
        _ => "double",
    }
}

/// The kernel's name: the operator's name and the dtype, prefixed so that it cannot collide with
/// the prelude or a CUDA builtin.
pub fn kernel_name(op_name: &str, dtype: DType) -> String {
    format!("ox_{op_name}_{}", dtype.name())
}

/// Elements each thread of a flat element-wise kernel handles per pass: their loads are all
/// issued before any store, which keeps enough memory requests in flight to come close to the
/// device's bandwidth (one element per thread reached 82% of PyTorch's add on an H200).
pub const ELEMENTS_PER_THREAD: usize = 4;

/// `out[i] = op(in0[i], .., scalar)` over `n` elements: each block covers
/// [`ELEMENTS_PER_THREAD`] blocks' worth of consecutive elements per pass, then strides by the
/// grid. Parameters: the input pointers, the output pointer (which may alias an input:
/// in-place operators; each element is read and written by the same thread), the element count
/// as `unsigned long long` and, for scalar operators, the scalar as `double`, converted to the
/// dtype first as MXNet does.
pub fn elementwise_kernel(name: &str, op: &Elementwise, num_inputs: usize, dtype: DType) -> String {
    let (params, setup, compute) = kernel_signature(op, dtype, num_inputs, false);
    let mut body = String::new();
    for u in 0..ELEMENTS_PER_THREAD {
        body.push_str(&format!("        const unsigned long long i{u} = start + {u} * (unsigned long long)blockDim.x + threadIdx.x;\n"));
    }
    for u in 0..ELEMENTS_PER_THREAD {
        for k in 0..num_inputs {
            body.push_str(&format!("        const {compute} v{k}_{u} = i{u} < n ? ({compute})ox_load(in{k}_ptr[i{u}]) : ({compute})0;\n"));
        }
    }
    for u in 0..ELEMENTS_PER_THREAD {
        let operands: Vec<String> = (0..num_inputs).map(|k| format!("v{k}_{u}")).collect();
        let operands: Vec<&str> = operands.iter().map(String::as_str).collect();
        body.push_str(&format!("        if (i{u} < n) ox_store(out_ptr + i{u}, {});\n", op.cuda_expr_of(&operands, "s")));
    }
    format!(
        "extern \"C\" __global__ void {name}({}) {{\n{setup}    const unsigned long long span = (unsigned long long)blockDim.x * {ELEMENTS_PER_THREAD};\n    \
         for (unsigned long long start = (unsigned long long)blockIdx.x * span; start < n; start += (unsigned long long)gridDim.x * span) {{\n{body}    }}\n}}\n",
        params.join(", ")
    )
}

/// [`elementwise_kernel`] for operands whose addresses are all aligned to four elements: each
/// thread moves four consecutive elements per access (one 128-bit load per float32 operand),
/// then a scalar loop finishes the last `n % 4`. Same parameters.
pub fn elementwise_vector_kernel(name: &str, op: &Elementwise, num_inputs: usize, dtype: DType) -> String {
    let (params, setup, compute) = kernel_signature(op, dtype, num_inputs, false);
    let storage = storage_type(dtype);
    let mut vector_body = String::new();
    for k in 0..num_inputs {
        vector_body.push_str(&format!("        const ox_vec4<{storage}> a{k} = ((const ox_vec4<{storage}>*)in{k}_ptr)[g];\n"));
    }
    vector_body.push_str(&format!("        ox_vec4<{storage}> r;\n        #pragma unroll\n        for (int u = 0; u < 4; ++u) {{\n"));
    for k in 0..num_inputs {
        vector_body.push_str(&format!("            const {compute} v{k} = ({compute})ox_load(a{k}.v[u]);\n"));
    }
    let operands: Vec<String> = (0..num_inputs).map(|k| format!("v{k}")).collect();
    let operands: Vec<&str> = operands.iter().map(String::as_str).collect();
    let expr = op.cuda_expr_of(&operands, "s");
    vector_body.push_str(&format!("            ox_store(&r.v[u], {expr});\n        }}\n        ((ox_vec4<{storage}>*)out_ptr)[g] = r;\n"));
    let tail_loads: String = (0..num_inputs).map(|k| format!("        const {compute} v{k} = ({compute})ox_load(in{k}_ptr[i]);\n")).collect();
    format!(
        "extern \"C\" __global__ void {name}({}) {{\n{setup}    const unsigned long long stride = (unsigned long long)blockDim.x * gridDim.x;\n    \
         const unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;\n    \
         for (unsigned long long g = first; g < n / 4; g += stride) {{\n{vector_body}    }}\n    \
         for (unsigned long long i = n / 4 * 4 + first; i < n; i += stride) {{\n{tail_loads}        ox_store(out_ptr + i, {expr});\n    }}\n}}\n",
        params.join(", ")
    )
}

/// A binary operator over NumPy-broadcast operands: output element `i` reads the operands at
/// the offsets that `ox_broadcast` (the last parameter, by value) maps it to.
pub fn broadcast_kernel(name: &str, op: &Elementwise, dtype: DType) -> String {
    let (params, setup, compute) = kernel_signature(op, dtype, 2, true);
    let mut body = "        const long long lhs = ox_offset(i, shape.dims, shape.lhs_strides, shape.ndim);\n        \
                    const long long rhs = ox_offset(i, shape.dims, shape.rhs_strides, shape.ndim);\n"
        .to_string();
    body.push_str(&format!("        const {compute} v0 = ({compute})ox_load(in0_ptr[lhs]);\n"));
    body.push_str(&format!("        const {compute} v1 = ({compute})ox_load(in1_ptr[rhs]);\n"));
    grid_stride_kernel(name, &params, &setup, &body, &op.cuda_expr_of(&["v0", "v1"], "s"))
}

/// The parameters of an element-wise kernel (inputs, output, count, [scalar], [broadcast
/// shape]), the code that converts the scalar to the dtype and back (as MXNet does), and the
/// type the math runs in.
fn kernel_signature(op: &Elementwise, dtype: DType, num_inputs: usize, broadcast: bool) -> (Vec<String>, String, &'static str) {
    let storage = storage_type(dtype);
    let compute = compute_type(dtype, num_inputs > 1 || op.scalar.is_some());
    let mut params: Vec<String> = (0..num_inputs).map(|k| format!("const {storage}* in{k}_ptr")).collect();
    params.push(format!("{storage}* out_ptr"));
    params.push("unsigned long long n".to_string());
    let mut setup = String::new();
    if op.scalar.is_some() {
        params.push("double scalar".to_string());
        setup = format!(
            "    {storage} scalar_stored;\n    ox_store(&scalar_stored, scalar);\n    const {compute} s = ({compute})ox_load(scalar_stored);\n"
        );
    }
    if broadcast {
        params.push("ox_broadcast shape".to_string());
    }
    (params, setup, compute)
}

/// Threads per block of a reduction kernel (its shared-memory tree assumes exactly this many).
pub const REDUCE_THREADS: usize = 256;

/// A reduction: one block per output element (grid-stride over outputs), its threads striding
/// over the reduced elements, then a shared-memory tree merging their partial results.
/// Parameters: input, output, output count, `ox_reduce` by value; launch with
/// [`REDUCE_THREADS`] threads per block.
pub fn reduce_kernel(name: &str, reduction: &Reduction, dtype: DType) -> String {
    let storage = storage_type(dtype);
    let acc = match dtype {
        DType::F32 | DType::F16 | DType::BF16 => "float",
        _ => "double",
    };
    let Reduction { init, step, merge, finish } = reduction;
    format!(
        r#"extern "C" __global__ void {name}(const {storage}* in0_ptr, {storage}* out_ptr, unsigned long long n, ox_reduce shape) {{
    __shared__ {acc} partial[{REDUCE_THREADS}];
    for (unsigned long long o = blockIdx.x; o < n; o += gridDim.x) {{
        const long long base = ox_offset(o, shape.kept_dims, shape.kept_strides, shape.kept_ndim);
        {acc} acc = ({acc})({init});
        for (unsigned long long r = threadIdx.x; r < shape.count; r += blockDim.x) {{
            const {acc} x = ({acc})ox_load(in0_ptr[base + ox_offset(r, shape.reduced_dims, shape.reduced_strides, shape.reduced_ndim)]);
            acc = {step};
        }}
        partial[threadIdx.x] = acc;
        __syncthreads();
        for (unsigned int half = blockDim.x / 2; half > 0; half >>= 1) {{
            if (threadIdx.x < half) {{
                const {acc} a = partial[threadIdx.x];
                const {acc} b = partial[threadIdx.x + half];
                partial[threadIdx.x] = {merge};
            }}
            __syncthreads();
        }}
        if (threadIdx.x == 0) {{
            const {acc} acc = partial[0];
            const {acc} count = ({acc})shape.count;
            ox_store(out_ptr + o, {finish});
        }}
        __syncthreads();
    }}
}}
"#
    )
}

/// `out[i] = value` over `n` elements, the value (a `double`) converted to the dtype once.
pub fn fill_kernel(name: &str, dtype: DType) -> String {
    let storage = storage_type(dtype);
    let params = [format!("{storage}* out_ptr"), "unsigned long long n".to_string(), "double value".to_string()];
    let setup = format!("    {storage} stored;\n    ox_store(&stored, value);\n");
    grid_stride_kernel_storing(name, &params, &setup, "", "out_ptr[i] = stored;")
}

/// `out[i] = in[i]` converted from one storage dtype to another (through the source's compute
/// type, as the CPU's cast does).
pub fn cast_kernel(name: &str, from: DType, to: DType) -> String {
    let params = [format!("const {}* in0_ptr", storage_type(from)), format!("{}* out_ptr", storage_type(to)), "unsigned long long n".to_string()];
    grid_stride_kernel(name, &params, "", "", "ox_load(in0_ptr[i])")
}

/// `out[i] += bias[(i / inner) % channels]` over `n` elements: a bias per channel, for outputs
/// laid out (..., channels, inner) (FullyConnected: inner = 1; convolution: the spatial size).
pub fn add_bias_kernel(name: &str, dtype: DType) -> String {
    let storage = storage_type(dtype);
    let compute = compute_type(dtype, true);
    let params = [
        format!("const {storage}* bias_ptr"),
        format!("{storage}* out_ptr"),
        "unsigned long long n".to_string(),
        "unsigned long long channels".to_string(),
        "unsigned long long inner".to_string(),
    ];
    grid_stride_kernel(name, &params, "", "", &format!("({compute})ox_load(out_ptr[i]) + ({compute})ox_load(bias_ptr[(i / inner) % channels])"))
}

/// A strided copy over an index space of up to `OX_MAX_DIMS` dims (`ox_strided`, by value):
/// element `i` of the space goes from `src_base + sum(idx * src_strides)` to
/// `dst_base + sum(idx * dst_strides)`. Elements move as unsigned integers of their width, so one
/// kernel per element size serves every dtype.
pub fn strided_copy_kernel(name: &str, element_bytes: usize) -> String {
    let word = match element_bytes {
        1 => "unsigned char",
        2 => "unsigned short",
        4 => "unsigned int",
        _ => "unsigned long long",
    };
    format!(
        r#"struct ox_strided {{
    long long dims[OX_MAX_DIMS];
    long long src_strides[OX_MAX_DIMS];
    long long dst_strides[OX_MAX_DIMS];
    long long src_base;
    long long dst_base;
    int ndim;
}};
extern "C" __global__ void {name}(const {word}* src, {word}* dst, unsigned long long n, ox_strided s) {{
    const unsigned long long stride = (unsigned long long)blockDim.x * gridDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {{
        dst[s.dst_base + ox_offset(i, s.dims, s.dst_strides, s.ndim)] = src[s.src_base + ox_offset(i, s.dims, s.src_strides, s.ndim)];
    }}
}}
"#
    )
}

/// The storage types of an optimizer update: weight (and gradient), states (and master copy), output.
#[derive(Clone, Copy, Debug)]
pub struct UpdateTypes {
    pub weight: DType,
    pub state: DType,
    pub out: DType,
}

/// An optimizer update over `n` elements: `rule` is CUDA C over doubles that reads the weight `w`
/// (from the master copy when there is one), the raw gradient `g`, states `s0..s2` (which it may
/// update), `lr`, `wd`, `rescale` and the rule's constants `c0..c3`, and assigns `w_new`.
/// Parameters: weight, grad, the three state pointers (unused ones may be null), master, out,
/// `n`, `lr`, `wd`, `rescale`, `c0..c3`.
pub fn update_kernel(name: &str, rule: &str, types: UpdateTypes, num_states: usize, master: bool, write_master: bool) -> String {
    let (w, s, o) = (storage_type(types.weight), storage_type(types.state), storage_type(types.out));
    let load_weight = if master { "ox_load(master_ptr[i])" } else { "ox_load(weight_ptr[i])" };
    let mut loads = String::new();
    let mut stores = String::new();
    for k in 0..3 {
        if k < num_states {
            loads.push_str(&format!("        double s{k} = (double)ox_load(s{k}_ptr[i]);\n"));
            stores.push_str(&format!("        ox_store(s{k}_ptr + i, s{k});\n"));
        } else {
            loads.push_str(&format!("        double s{k} = 0;\n"));
        }
    }
    if master && write_master {
        stores.push_str("        ox_store(master_ptr + i, w_new);\n");
    }
    format!(
        r#"__device__ __forceinline__ double ox_rescaled(double g, double rescale, double clip) {{
    g *= rescale;
    return clip >= 0 ? fmin(fmax(g, -clip), clip) : g;
}}
extern "C" __global__ void {name}(const {w}* weight_ptr, const {w}* grad_ptr, {s}* s0_ptr, {s}* s1_ptr, {s}* s2_ptr, {s}* master_ptr, {o}* out_ptr,
        unsigned long long n, double lr, double wd, double rescale, double c0, double c1, double c2, double c3) {{
    const unsigned long long stride = (unsigned long long)blockDim.x * gridDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {{
        const double w = (double){load_weight};
        const double g = (double)ox_load(grad_ptr[i]);
{loads}        double w_new;
        {{ {rule} }}
{stores}        ox_store(out_ptr + i, w_new);
    }}
}}
"#
    )
}

/// `out[i] *= factor` over `n` elements, in double as the CPU kernel does (an integer scaled by
/// 1/count must not see the factor truncated to 0).
pub fn scale_kernel(name: &str, dtype: DType) -> String {
    let params = [format!("{}* out_ptr", storage_type(dtype)), "unsigned long long n".to_string(), "double factor".to_string()];
    grid_stride_kernel(name, &params, "", "", "(double)ox_load(out_ptr[i]) * factor")
}

/// The accumulator type of row kernels (softmax): float for 16- and 32-bit floats, double else.
fn accumulator(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => "float",
        _ => "double",
    }
}

/// Softmax (or log-softmax) along lanes: lane `l` of `lanes` holds `n` elements at stride
/// `inner`, starting at `(l / inner) * n * inner + l % inner`. One block of [`REDUCE_THREADS`]
/// threads per lane (grid-stride over lanes): a max, a sum of exponentials, one write pass, in
/// the accumulator type, with the input scaled by `scale` (1/temperature, negated for softmin).
/// Parameters: input, output, lanes, n, inner, scale.
pub fn softmax_kernel(name: &str, dtype: DType, log: bool) -> String {
    let (storage, acc) = (storage_type(dtype), accumulator(dtype));
    let write = if log { "x - log_sum" } else { "exp(x - max) / sum" };
    format!(
        r#"extern "C" __global__ void {name}(const {storage}* in_ptr, {storage}* out_ptr, unsigned long long lanes, unsigned long long n,
        unsigned long long inner, double scale) {{
    __shared__ {acc} partial[{REDUCE_THREADS}];
    for (unsigned long long lane = blockIdx.x; lane < lanes; lane += gridDim.x) {{
        const unsigned long long base = (lane / inner) * n * inner + lane % inner;
        {acc} m = ({acc})(-__longlong_as_double(0x7ff0000000000000LL));
        for (unsigned long long k = threadIdx.x; k < n; k += blockDim.x) {{
            const {acc} x = ({acc})ox_load(in_ptr[base + k * inner]) * ({acc})scale;
            m = x > m ? x : m;
        }}
        partial[threadIdx.x] = m;
        __syncthreads();
        for (unsigned int half = blockDim.x / 2; half > 0; half >>= 1) {{
            if (threadIdx.x < half && partial[threadIdx.x + half] > partial[threadIdx.x]) partial[threadIdx.x] = partial[threadIdx.x + half];
            __syncthreads();
        }}
        const {acc} max = partial[0];
        __syncthreads();
        {acc} s = 0;
        for (unsigned long long k = threadIdx.x; k < n; k += blockDim.x) {{
            s += exp(({acc})ox_load(in_ptr[base + k * inner]) * ({acc})scale - max);
        }}
        partial[threadIdx.x] = s;
        __syncthreads();
        for (unsigned int half = blockDim.x / 2; half > 0; half >>= 1) {{
            if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
            __syncthreads();
        }}
        const {acc} sum = partial[0];
        const {acc} log_sum = log(sum) + max;
        for (unsigned long long k = threadIdx.x; k < n; k += blockDim.x) {{
            const {acc} x = ({acc})ox_load(in_ptr[base + k * inner]) * ({acc})scale;
            ox_store(out_ptr + base + k * inner, {write});
        }}
        __syncthreads();
    }}
}}
"#
    )
}

/// The softmax gradient along lanes (laid out as in [`softmax_kernel`]) from the output
/// gradient `g` and the output `y`: `y * (g - sum(g * y))`, or for log-softmax
/// `g - exp(y) * sum(g)`. Parameters: g, y, dx, lanes, n, inner.
pub fn softmax_backward_kernel(name: &str, dtype: DType, log: bool) -> String {
    let (storage, acc) = (storage_type(dtype), accumulator(dtype));
    let (term, write) = if log { ("gv", "gv - exp(yv) * total") } else { ("gv * yv", "yv * (gv - total)") };
    format!(
        r#"extern "C" __global__ void {name}(const {storage}* g_ptr, const {storage}* y_ptr, {storage}* dx_ptr, unsigned long long lanes,
        unsigned long long n, unsigned long long inner) {{
    __shared__ {acc} partial[{REDUCE_THREADS}];
    for (unsigned long long lane = blockIdx.x; lane < lanes; lane += gridDim.x) {{
        const unsigned long long base = (lane / inner) * n * inner + lane % inner;
        {acc} s = 0;
        for (unsigned long long k = threadIdx.x; k < n; k += blockDim.x) {{
            const {acc} gv = ({acc})ox_load(g_ptr[base + k * inner]);
            const {acc} yv = ({acc})ox_load(y_ptr[base + k * inner]);
            s += {term};
        }}
        partial[threadIdx.x] = s;
        __syncthreads();
        for (unsigned int half = blockDim.x / 2; half > 0; half >>= 1) {{
            if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
            __syncthreads();
        }}
        const {acc} total = partial[0];
        for (unsigned long long k = threadIdx.x; k < n; k += blockDim.x) {{
            const {acc} gv = ({acc})ox_load(g_ptr[base + k * inner]);
            const {acc} yv = ({acc})ox_load(y_ptr[base + k * inner]);
            ox_store(dx_ptr + base + k * inner, {write});
        }}
        __syncthreads();
    }}
}}
"#
    )
}

/// pick along an axis (`backward`: its gradient, scattering into a zeroed output): cell `c` of
/// the picked array is element `((c / inner) * n + pos) * inner + c % inner` of the full one,
/// `pos` its index clipped into [0, n) (`wrap` = 0) or wrapped (`wrap` = 1). Parameters: the
/// source (data, or the gradient), the index, the destination, cells, n, inner, wrap.
pub fn pick_kernel(name: &str, dtype: DType, index: DType, backward: bool) -> String {
    let (storage, index_storage) = (storage_type(dtype), storage_type(index));
    let (from, to) = if backward { ("c", "full") } else { ("full", "c") };
    format!(
        r#"extern "C" __global__ void {name}(const {storage}* src, const {index_storage}* index, {storage}* dst, unsigned long long cells,
        unsigned long long n, unsigned long long inner, int wrap) {{
    const unsigned long long stride = (unsigned long long)blockDim.x * gridDim.x;
    for (unsigned long long c = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; c < cells; c += stride) {{
        long long pos = (long long)ox_load(index[c]);
        const long long len = (long long)n;
        if (wrap) {{
            pos %= len;
            if (pos < 0) pos += len;
        }} else {{
            pos = pos < 0 ? 0 : (pos >= len ? len - 1 : pos);
        }}
        const unsigned long long full = ((c / inner) * n + (unsigned long long)pos) * inner + c % inner;
        dst[{to}] = src[{from}];
    }}
}}
"#
    )
}

/// Dropout while active: element `i` keeps (scaled by `scale`) unless the uniform draw of its
/// mask element (`ox_offset` of `i` through the mask strides of `shape.lhs_strides`, 0 along
/// shared axes) falls below `p`; the mask (stored in the dtype) multiplies the input, as on the
/// host. Parameters: x, out, mask, n, seed, p, scale, `ox_broadcast` shape.
pub fn dropout_kernel(name: &str, dtype: DType) -> String {
    let storage = storage_type(dtype);
    format!(
        r#"extern "C" __global__ void {name}(const {storage}* x, {storage}* out, {storage}* mask, unsigned long long n, unsigned long long seed,
        double p, double scale, ox_broadcast shape) {{
    const unsigned long long stride = (unsigned long long)blockDim.x * gridDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {{
        const unsigned long long draw = (unsigned long long)ox_offset(i, shape.dims, shape.lhs_strides, shape.ndim);
        ox_store(mask + i, ox_uniform(seed, draw) >= p ? scale : 0.0);
        ox_store(out + i, (double)ox_load(x[i]) * (double)ox_load(mask[i]));
    }}
}}
"#
    )
}

/// The prelude of the pooling kernels: the window geometry (three spatial axes, leading ones of
/// size 1 for 1-D and 2-D pooling), the kind (0 max, 1 avg, 2 sum, 3 lp) and the clipped window
/// of an output position along one axis (as the CPU's `span`).
const POOL_PRELUDE: &str = r#"
struct ox_pool {
    long long input[3];
    long long kernel[3];
    long long stride[3];
    long long pad[3];
    long long output[3];
    int kind;
    int include_pad;
    int p;
};
__device__ __forceinline__ void ox_span(long long o, int a, const ox_pool& w, long long* s, long long* e, long long* padded) {
    const long long start = o * w.stride[a] - w.pad[a];
    const long long end = min(start + w.kernel[a], w.input[a] + w.pad[a]);
    *padded = max(end - start, 0LL);
    const long long first = max(start, 0LL);
    *s = first;
    *e = max(min(max(end, 0LL), w.input[a]), first);
}
"#;

/// Pooling forward (NCHW-like layouts): one thread per output element, each reducing its
/// window in double as the CPU does (max keeps NaN, avg divides by the padded or the clipped
/// window size, lp is (sum |x|^p)^(1/p)). Parameters: x, y, outputs, `ox_pool` by value.
pub fn pool_kernel(name: &str, dtype: DType) -> String {
    let storage = storage_type(dtype);
    format!(
        r#"{POOL_PRELUDE}
extern "C" __global__ void {name}(const {storage}* x, {storage}* y, unsigned long long total, ox_pool w) {{
    const long long outs = w.output[0] * w.output[1] * w.output[2];
    const long long plane = w.input[0] * w.input[1] * w.input[2];
    const unsigned long long stride = (unsigned long long)blockDim.x * gridDim.x;
    for (unsigned long long idx = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {{
        const long long pl = (long long)idx / outs, o = (long long)idx % outs;
        const long long ow = o % w.output[2], oh = (o / w.output[2]) % w.output[1], od = o / (w.output[2] * w.output[1]);
        long long d0, d1, dn, h0, h1, hn, w0, w1, wn;
        ox_span(od, 0, w, &d0, &d1, &dn);
        ox_span(oh, 1, w, &h0, &h1, &hn);
        ox_span(ow, 2, w, &w0, &w1, &wn);
        const {storage}* xp = x + pl * plane;
        double acc = w.kind == 0 ? -__longlong_as_double(0x7ff0000000000000LL) : 0.0;
        for (long long d = d0; d < d1; ++d)
            for (long long h = h0; h < h1; ++h)
                for (long long c = w0; c < w1; ++c) {{
                    const double v = (double)ox_load(xp[(d * w.input[1] + h) * w.input[2] + c]);
                    if (w.kind == 0) {{
                        if (v > acc || isnan(v)) acc = v;
                    }} else if (w.kind == 3) {{
                        acc += pow(fabs(v), (double)w.p);
                    }} else {{
                        acc += v;
                    }}
                }}
        if (w.kind == 1) {{
            const long long count = w.include_pad ? dn * hn * wn : (d1 - d0) * (h1 - h0) * (w1 - w0);
            acc /= (double)max(count, 1LL);
        }} else if (w.kind == 3) {{
            acc = pow(acc, 1.0 / w.p);
        }}
        ox_store(y + idx, acc);
    }}
}}
"#
    )
}

/// Pooling backward without atomics: one thread per input element gathers the gradient of
/// every window that covers it (max: only where it is the window's first maximum, as on the
/// CPU). Parameters: g, x, y, dx, inputs, `ox_pool` by value.
pub fn pool_backward_kernel(name: &str, dtype: DType) -> String {
    let storage = storage_type(dtype);
    format!(
        r#"{POOL_PRELUDE}
__device__ __forceinline__ void ox_covering(long long c, int a, const ox_pool& w, long long* lo, long long* hi) {{
    const long long low = c + w.pad[a] - w.kernel[a];
    *lo = low < 0 ? 0 : low / w.stride[a] + 1;
    *hi = min((c + w.pad[a]) / w.stride[a], w.output[a] - 1);
}}
extern "C" __global__ void {name}(const {storage}* g, const {storage}* x, const {storage}* y, {storage}* dx, unsigned long long total, ox_pool w) {{
    const long long outs = w.output[0] * w.output[1] * w.output[2];
    const long long plane = w.input[0] * w.input[1] * w.input[2];
    const unsigned long long stride = (unsigned long long)blockDim.x * gridDim.x;
    for (unsigned long long idx = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {{
        const long long pl = (long long)idx / plane, i = (long long)idx % plane;
        const long long xw = i % w.input[2], xh = (i / w.input[2]) % w.input[1], xd = i / (w.input[2] * w.input[1]);
        const {storage}* xp = x + pl * plane;
        const double xi = (double)ox_load(xp[i]);
        long long od0, od1, oh0, oh1, ow0, ow1;
        ox_covering(xd, 0, w, &od0, &od1);
        ox_covering(xh, 1, w, &oh0, &oh1);
        ox_covering(xw, 2, w, &ow0, &ow1);
        double acc = 0.0;
        for (long long od = od0; od <= od1; ++od)
            for (long long oh = oh0; oh <= oh1; ++oh)
                for (long long ow = ow0; ow <= ow1; ++ow) {{
                    const long long o = pl * outs + (od * w.output[1] + oh) * w.output[2] + ow;
                    const double go = (double)ox_load(g[o]), yo = (double)ox_load(y[o]);
                    long long d0, d1, dn, h0, h1, hn, w0, w1, wn;
                    ox_span(od, 0, w, &d0, &d1, &dn);
                    ox_span(oh, 1, w, &h0, &h1, &hn);
                    ox_span(ow, 2, w, &w0, &w1, &wn);
                    if (w.kind == 0) {{
                        long long first = -1;
                        for (long long d = d0; d < d1 && first < 0; ++d)
                            for (long long h = h0; h < h1 && first < 0; ++h)
                                for (long long c = w0; c < w1; ++c) {{
                                    const long long at = (d * w.input[1] + h) * w.input[2] + c;
                                    const double v = (double)ox_load(xp[at]);
                                    if (v == yo || (isnan(v) && isnan(yo))) {{
                                        first = at;
                                        break;
                                    }}
                                }}
                        if (first == i) acc += go;
                    }} else if (w.kind == 2) {{
                        acc += go;
                    }} else if (w.kind == 1) {{
                        const long long count = w.include_pad ? dn * hn * wn : (d1 - d0) * (h1 - h0) * (w1 - w0);
                        acc += go / (double)max(count, 1LL);
                    }} else if (yo != 0.0) {{
                        acc += go * pow(fabs(xi) / yo, (double)(w.p - 1)) * copysign(1.0, xi);
                    }}
                }}
        ox_store(dx + idx, acc);
    }}
}}
"#
    )
}

/// The prelude of the convolution kernels: the geometry over three spatial axes (leading ones of
/// size 1 for 1-D and 2-D convolution), the input's channel count, the channels of one group and
/// the group's first channel.
const CONV_PRELUDE: &str = r#"
struct ox_conv {
    long long input[3];
    long long kernel[3];
    long long stride[3];
    long long dilate[3];
    long long pad[3];
    long long output[3];
    long long channels;
    long long group_channels;
    long long first_channel;
};
"#;

/// im2col of one group for `images` consecutive images: column matrix row `c * K + k` (channel
/// `c` of the group, kernel offset `k`), column `o` (output position) holds the input element
/// that offset `k` of output `o`'s window reads, 0 in the padding. The images' matrices follow
/// one another. Parameters: x (the first image), col, images, `ox_conv` by value.
pub fn im2col_kernel(name: &str, dtype: DType) -> String {
    let storage = storage_type(dtype);
    format!(
        r#"{CONV_PRELUDE}
extern "C" __global__ void {name}(const {storage}* x, {storage}* col, unsigned long long images, ox_conv g) {{
    const long long K = g.kernel[0] * g.kernel[1] * g.kernel[2];
    const long long outs = g.output[0] * g.output[1] * g.output[2];
    const long long plane = g.input[0] * g.input[1] * g.input[2];
    const unsigned long long total = images * (unsigned long long)(g.group_channels * K * outs);
    const unsigned long long stride = (unsigned long long)blockDim.x * gridDim.x;
    for (unsigned long long idx = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {{
        const long long o = (long long)(idx % (unsigned long long)outs);
        const long long row = (long long)((idx / (unsigned long long)outs) % (unsigned long long)(g.group_channels * K));
        const long long b = (long long)(idx / (unsigned long long)(g.group_channels * K * outs));
        const long long c = row / K, k = row % K;
        const long long kw = k % g.kernel[2], kh = (k / g.kernel[2]) % g.kernel[1], kd = k / (g.kernel[2] * g.kernel[1]);
        const long long ow = o % g.output[2], oh = (o / g.output[2]) % g.output[1], od = o / (g.output[2] * g.output[1]);
        const long long id = od * g.stride[0] - g.pad[0] + kd * g.dilate[0];
        const long long ih = oh * g.stride[1] - g.pad[1] + kh * g.dilate[1];
        const long long iw = ow * g.stride[2] - g.pad[2] + kw * g.dilate[2];
        const bool inside = id >= 0 && id < g.input[0] && ih >= 0 && ih < g.input[1] && iw >= 0 && iw < g.input[2];
        if (inside) {{
            col[idx] = x[(b * g.channels + g.first_channel + c) * plane + (id * g.input[1] + ih) * g.input[2] + iw];
        }} else {{
            ox_store(col + idx, 0.0);
        }}
    }}
}}
"#
    )
}

/// The adjoint of [`im2col_kernel`] without atomics: each input element of the group sums the
/// column entries that read it, in double, and is written (not accumulated). Parameters: col,
/// dx (the first image), images, `ox_conv` by value.
pub fn col2im_kernel(name: &str, dtype: DType) -> String {
    let storage = storage_type(dtype);
    format!(
        r#"{CONV_PRELUDE}
extern "C" __global__ void {name}(const {storage}* col, {storage}* dx, unsigned long long images, ox_conv g) {{
    const long long K = g.kernel[0] * g.kernel[1] * g.kernel[2];
    const long long outs = g.output[0] * g.output[1] * g.output[2];
    const long long plane = g.input[0] * g.input[1] * g.input[2];
    const unsigned long long total = images * (unsigned long long)(g.group_channels * plane);
    const unsigned long long stride = (unsigned long long)blockDim.x * gridDim.x;
    for (unsigned long long idx = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {{
        const long long i = (long long)(idx % (unsigned long long)plane);
        const long long c = (long long)((idx / (unsigned long long)plane) % (unsigned long long)g.group_channels);
        const long long b = (long long)(idx / (unsigned long long)(g.group_channels * plane));
        const long long iw = i % g.input[2], ih = (i / g.input[2]) % g.input[1], id = i / (g.input[2] * g.input[1]);
        double acc = 0.0;
        for (long long kd = 0; kd < g.kernel[0]; ++kd) {{
            const long long nd = id + g.pad[0] - kd * g.dilate[0];
            if (nd < 0 || nd % g.stride[0] != 0 || nd / g.stride[0] >= g.output[0]) continue;
            for (long long kh = 0; kh < g.kernel[1]; ++kh) {{
                const long long nh = ih + g.pad[1] - kh * g.dilate[1];
                if (nh < 0 || nh % g.stride[1] != 0 || nh / g.stride[1] >= g.output[1]) continue;
                for (long long kw = 0; kw < g.kernel[2]; ++kw) {{
                    const long long nw = iw + g.pad[2] - kw * g.dilate[2];
                    if (nw < 0 || nw % g.stride[2] != 0 || nw / g.stride[2] >= g.output[2]) continue;
                    const long long k = (kd * g.kernel[1] + kh) * g.kernel[2] + kw;
                    const long long o = (nd / g.stride[0] * g.output[1] + nh / g.stride[1]) * g.output[2] + nw / g.stride[2];
                    acc += (double)ox_load(col[((b * g.group_channels + c) * K + k) * outs + o]);
                }}
            }}
        }}
        ox_store(dx + (b * g.channels + g.first_channel + c) * plane + i, acc);
    }}
}}
"#
    )
}

/// A fused chain over float32 inputs `in0..`: the fusion pass's whole expression (`FusedOp`'s
/// `cuda_expr`) in one kernel.
pub fn fused_kernel(name: &str, num_inputs: usize, cuda_expr: &str) -> String {
    let mut params: Vec<String> = (0..num_inputs).map(|k| format!("const float* in{k}_ptr")).collect();
    params.push("float* out_ptr".to_string());
    params.push("unsigned long long n".to_string());
    let loads: String = (0..num_inputs).map(|k| format!("        const float in{k} = in{k}_ptr[i];\n")).collect();
    grid_stride_kernel(name, &params, "", &loads, cuda_expr)
}

fn grid_stride_kernel(name: &str, params: &[String], setup: &str, loads: &str, expr: &str) -> String {
    grid_stride_kernel_storing(name, params, setup, loads, &format!("ox_store(out_ptr + i, {expr});"))
}

fn grid_stride_kernel_storing(name: &str, params: &[String], setup: &str, loads: &str, store: &str) -> String {
    format!(
        "extern \"C\" __global__ void {name}({}) {{\n{setup}    const unsigned long long stride = (unsigned long long)blockDim.x * gridDim.x;\n    \
         for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {{\n{loads}        \
         {store}\n    }}\n}}\n",
        params.join(", ")
    )
}
