//! Operator kernels against plain reference implementations, one table or case per operator
//! family, called through the typed Rust API an embedding program uses. Forward values are
//! checked in float32 against float64 references; gradients in float64 against central finite
//! differences.

use oxnet::params::*;
use oxnet::{nn, ops, optim, Context, DType, NDArray, Result};

fn cpu() -> Context {
    Context::cpu(0)
}

/// Deterministic values in `[low, high)` (xorshift64*), so failures reproduce.
fn values(n: usize, seed: u64, low: f64, high: f64) -> Vec<f64> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            let unit = (state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64;
            low + (high - low) * unit
        })
        .collect()
}

fn array(data: &[f64], shape: &[usize], dtype: DType) -> NDArray {
    let a = NDArray::from_slice(data, shape, cpu()).unwrap();
    if dtype == DType::F64 {
        a
    } else {
        a.astype(dtype).unwrap()
    }
}

fn f32s(data: &[f64], shape: &[usize]) -> NDArray {
    array(data, shape, DType::F32)
}

fn read(a: &NDArray) -> Vec<f64> {
    a.astype(DType::F64).unwrap().to_vec::<f64>().unwrap()
}

fn assert_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: {} values, expected {}", got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = (g - w).abs() <= tol * (1.0 + w.abs()) || (g.is_nan() && w.is_nan());
        assert!(ok, "{what}: element {i} is {g}, expected {w}");
    }
}

fn size(shape: &[usize]) -> usize {
    shape.iter().product()
}

fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut index = vec![0; shape.len()];
    for axis in (0..shape.len()).rev() {
        index[axis] = flat % shape[axis];
        flat /= shape[axis];
    }
    index
}

fn ravel(index: &[usize], shape: &[usize]) -> usize {
    index.iter().zip(shape).fold(0, |flat, (&i, &n)| flat * n + i)
}

/// A row-major array for reference computations.
#[derive(Clone)]
struct Host {
    shape: Vec<usize>,
    data: Vec<f64>,
}

impl Host {
    /// Random values that float32 holds exactly, so data movement compares exactly.
    fn random(shape: &[usize], seed: u64, low: f64, high: f64) -> Host {
        Host { shape: shape.to_vec(), data: values(size(shape), seed, low, high).into_iter().map(|v| v as f32 as f64).collect() }
    }
    fn at(&self, index: &[usize]) -> f64 {
        self.data[ravel(index, &self.shape)]
    }
    fn nd(&self) -> NDArray {
        f32s(&self.data, &self.shape)
    }
    fn nd64(&self) -> NDArray {
        array(&self.data, &self.shape, DType::F64)
    }
}

// ---- element-wise -------------------------------------------------------------------------

type Unary = fn(&NDArray) -> Result<NDArray>;

#[test]
fn unary_math_matches_std() {
    let general = Host::random(&[3, 17], 1, -3.0, 3.0);
    let positive = Host::random(&[3, 17], 2, 0.05, 4.0);
    let small = Host::random(&[3, 17], 3, -1.2, 1.2);
    let table: &[(&str, Unary, fn(f64) -> f64, &Host)] = &[
        ("abs", ops::abs, f64::abs, &general),
        (
            "sign",
            ops::sign,
            |x| {
                if x > 0.0 {
                    1.0
                } else if x < 0.0 {
                    -1.0
                } else {
                    0.0
                }
            },
            &general,
        ),
        ("round", ops::round, f64::round, &general),
        ("ceil", ops::ceil, f64::ceil, &general),
        ("floor", ops::floor, f64::floor, &general),
        ("square", ops::square, |x| x * x, &general),
        ("sqrt", ops::sqrt, f64::sqrt, &positive),
        ("rsqrt", ops::rsqrt, |x| 1.0 / x.sqrt(), &positive),
        ("exp", ops::exp, f64::exp, &general),
        ("expm1", ops::expm1, f64::exp_m1, &general),
        ("log", ops::log, f64::ln, &positive),
        ("log1p", ops::log1p, f64::ln_1p, &positive),
        ("log2", ops::log2, f64::log2, &positive),
        ("log10", ops::log10, f64::log10, &positive),
        ("sin", ops::sin, f64::sin, &general),
        ("cos", ops::cos, f64::cos, &general),
        ("tan", ops::tan, f64::tan, &small),
        ("tanh", ops::tanh, f64::tanh, &general),
        ("sigmoid", ops::sigmoid, |x| 1.0 / (1.0 + (-x).exp()), &general),
        ("relu", ops::relu, |x| x.max(0.0), &general),
        ("softsign", ops::softsign, |x| x / (1.0 + x.abs()), &general),
        ("erf", ops::erf, libm::erf, &general),
        ("reciprocal", ops::reciprocal, |x| 1.0 / x, &positive),
        ("negative", ops::negative, |x| -x, &general),
    ];
    for &(name, op, reference, input) in table {
        let got = read(&op(&input.nd()).unwrap());
        let want: Vec<f64> = input.data.iter().map(|&x| reference(x as f32 as f64)).collect();
        assert_close(name, &got, &want, 2e-6);
    }
}

/// `f` applied with NumPy broadcasting.
fn broadcast_reference(a: &Host, b: &Host, f: fn(f64, f64) -> f64) -> Host {
    let ndim = a.shape.len().max(b.shape.len());
    let pad = |s: &[usize]| [vec![1; ndim - s.len()], s.to_vec()].concat();
    let (sa, sb) = (pad(&a.shape), pad(&b.shape));
    let shape: Vec<usize> = sa.iter().zip(&sb).map(|(&x, &y)| x.max(y)).collect();
    let data = (0..size(&shape))
        .map(|flat| {
            let index = unravel(flat, &shape);
            let pick = |s: &[usize]| index.iter().zip(s).map(|(&i, &n)| if n == 1 { 0 } else { i }).collect::<Vec<_>>();
            f(a.data[ravel(&pick(&sa), &sa)], b.data[ravel(&pick(&sb), &sb)])
        })
        .collect();
    Host { shape, data }
}

type Binary = fn(&NDArray, &NDArray) -> Result<NDArray>;

#[test]
fn broadcasting_binary_math_matches_reference() {
    let table: &[(&str, Binary, fn(f64, f64) -> f64)] = &[
        ("add", ops::add, |a, b| a + b),
        ("sub", ops::sub, |a, b| a - b),
        ("mul", ops::mul, |a, b| a * b),
        ("div", ops::div, |a, b| a / b),
        ("power", ops::power, f64::powf),
        ("maximum", ops::maximum, f64::max),
        ("minimum", ops::minimum, f64::min),
        ("equal", ops::equal, |a, b| if a == b { 1.0 } else { 0.0 }),
        ("not_equal", ops::not_equal, |a, b| if a != b { 1.0 } else { 0.0 }),
        ("greater", ops::greater, |a, b| if a > b { 1.0 } else { 0.0 }),
        ("greater_equal", ops::greater_equal, |a, b| if a >= b { 1.0 } else { 0.0 }),
        ("lesser", ops::lesser, |a, b| if a < b { 1.0 } else { 0.0 }),
        ("lesser_equal", ops::lesser_equal, |a, b| if a <= b { 1.0 } else { 0.0 }),
    ];
    // Small integers, so comparisons see equal values too; positive, so power and div are defined.
    let integers = |shape: &[usize], seed| {
        let h = Host::random(shape, seed, 1.0, 4.0);
        Host { data: h.data.iter().map(|v| v.floor()).collect(), ..h }
    };
    for (sa, sb) in [(vec![2, 3, 4], vec![3, 1]), (vec![1, 4], vec![2, 3, 1]), (vec![5], vec![5]), (vec![2, 1, 3], vec![2, 4, 1])] {
        let (a, b) = (integers(&sa, 3), integers(&sb, 4));
        for &(name, op, f) in table {
            let want = broadcast_reference(&a, &b, f);
            let got = op(&a.nd(), &b.nd()).unwrap();
            assert_eq!(got.shape().dims(), want.shape, "{name} {sa:?} {sb:?}");
            assert_close(&format!("{name} {sa:?} {sb:?}"), &read(&got), &want.data, 1e-6);
        }
    }
}

#[test]
fn arithmetic_operators_with_scalars_on_either_side() {
    let a = Host::random(&[4, 5], 5, 0.5, 3.0);
    let x = a.nd();
    let cases: Vec<(&str, NDArray, fn(f64) -> f64)> = vec![
        ("x + 2", (&x + 2.0).unwrap(), |v| v + 2.0),
        ("2 + x", (2.0 + &x).unwrap(), |v| 2.0 + v),
        ("x - 2", (&x - 2.0).unwrap(), |v| v - 2.0),
        ("2 - x", (2.0 - &x).unwrap(), |v| 2.0 - v),
        ("x * 3", (&x * 3.0).unwrap(), |v| v * 3.0),
        ("3 * x", (3.0 * &x).unwrap(), |v| 3.0 * v),
        ("x / 4", (&x / 4.0).unwrap(), |v| v / 4.0),
        ("4 / x", (4.0 / &x).unwrap(), |v| 4.0 / v),
        ("-x", (-&x).unwrap(), |v| -v),
    ];
    for (what, got, f) in cases {
        let want: Vec<f64> = a.data.iter().map(|&v| f(v as f32 as f64)).collect();
        assert_close(what, &read(&got), &want, 1e-6);
    }
}

// ---- reductions ---------------------------------------------------------------------------

/// `fold` over `axes` of `x` (all when empty), then `finish(acc, count)`.
fn reduce_reference(x: &Host, axes: &[usize], keepdims: bool, init: f64, fold: fn(f64, f64) -> f64, finish: fn(f64, usize) -> f64) -> Host {
    let reduced: Vec<bool> = (0..x.shape.len()).map(|a| axes.is_empty() || axes.contains(&a)).collect();
    let kept: Vec<usize> = x.shape.iter().zip(&reduced).map(|(&n, &r)| if r { 1 } else { n }).collect();
    let mut acc = vec![init; size(&kept)];
    for (flat, &v) in x.data.iter().enumerate() {
        let index: Vec<usize> = unravel(flat, &x.shape).iter().zip(&reduced).map(|(&i, &r)| if r { 0 } else { i }).collect();
        let slot = ravel(&index, &kept);
        acc[slot] = fold(acc[slot], v);
    }
    let count = x.data.len() / acc.len();
    let shape = if keepdims { kept } else { x.shape.iter().zip(&reduced).filter(|(_, &r)| !r).map(|(&n, _)| n).collect() };
    Host { shape, data: acc.into_iter().map(|a| finish(a, count)).collect() }
}

#[test]
fn reductions_over_axes_match_reference() {
    let x = Host::random(&[2, 3, 4], 6, 0.5, 1.5);
    type Reduce = fn(&NDArray, ReduceParams) -> Result<NDArray>;
    let table: &[(&str, Reduce, f64, fn(f64, f64) -> f64, fn(f64, usize) -> f64)] = &[
        ("sum", ops::sum, 0.0, |a, v| a + v, |a, _| a),
        ("mean", ops::mean, 0.0, |a, v| a + v, |a, n| a / n as f64),
        ("max", ops::max, f64::NEG_INFINITY, f64::max, |a, _| a),
        ("min", ops::min, f64::INFINITY, f64::min, |a, _| a),
        ("prod", ops::prod, 1.0, |a, v| a * v, |a, _| a),
    ];
    let axis_sets: &[(Option<Vec<i64>>, Vec<usize>)] =
        &[(None, vec![]), (Some(vec![0]), vec![0]), (Some(vec![1]), vec![1]), (Some(vec![-1]), vec![2]), (Some(vec![0, 2]), vec![0, 2])];
    for &(name, op, init, fold, finish) in table {
        for (axis, axes) in axis_sets {
            for keepdims in [false, true] {
                let what = format!("{name} axis={axis:?} keepdims={keepdims}");
                let want = reduce_reference(&x, axes, keepdims, init, fold, finish);
                let got = op(&x.nd(), ReduceParams::new().axis(axis.clone()).keepdims(keepdims)).unwrap();
                let want_shape = if want.shape.is_empty() { vec![1] } else { want.shape.clone() };
                assert_eq!(got.shape().dims(), want_shape, "{what}");
                assert_close(&what, &read(&got), &want.data, 1e-5);
            }
        }
    }
    // exclude=True reduces every axis but the listed ones.
    let got = ops::sum(&x.nd(), ReduceParams::new().axis(Some(vec![1])).exclude(true)).unwrap();
    assert_close("sum exclude", &read(&got), &reduce_reference(&x, &[0, 2], false, 0.0, |a, v| a + v, |a, _| a).data, 1e-5);
}

#[test]
fn arg_reductions_and_norms_match_reference() {
    let x = Host::random(&[3, 5], 7, -2.0, 2.0);
    let rows: Vec<&[f64]> = x.data.chunks(5).collect();
    let arg = |pick: fn(f64, f64) -> bool| -> Vec<f64> {
        rows.iter().map(|r| (0..5).fold(0, |best, i| if pick(r[i], r[best]) { i } else { best }) as f64).collect()
    };
    assert_close("argmax", &read(&ops::argmax(&x.nd(), ArgReduceParams::new().axis(Some(1))).unwrap()), &arg(|a, b| a > b), 0.0);
    assert_close("argmin", &read(&ops::argmin(&x.nd(), ArgReduceParams::new().axis(Some(1))).unwrap()), &arg(|a, b| a < b), 0.0);
    let l2 = x.data.iter().map(|v| v * v).sum::<f64>().sqrt();
    assert_close("norm", &read(&ops::norm(&x.nd(), NormParams::new()).unwrap()), &[l2], 1e-6);
    let l1_rows: Vec<f64> = rows.iter().map(|r| r.iter().map(|v| v.abs()).sum()).collect();
    assert_close("norm ord=1 axis=1", &read(&ops::norm(&x.nd(), NormParams::new().ord(1).axis(Some(vec![1]))).unwrap()), &l1_rows, 1e-6);
}

// ---- linear algebra -----------------------------------------------------------------------

/// `a (n, k) . b (k, m)`.
fn matmul(a: &[f64], b: &[f64], n: usize, k: usize, m: usize) -> Vec<f64> {
    (0..n * m).map(|o| (0..k).map(|i| a[o / m * k + i] * b[i * m + o % m]).sum()).collect()
}

fn transposed(a: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    (0..rows * cols).map(|o| a[(o % rows) * cols + o / rows]).collect()
}

#[test]
fn dot_products_match_reference() {
    let (n, k, m) = (3, 4, 5);
    let a = Host::random(&[n, k], 8, -1.0, 1.0);
    let b = Host::random(&[k, m], 9, -1.0, 1.0);
    let want = matmul(&a.data, &b.data, n, k, m);
    assert_close("dot", &read(&a.nd().dot(&b.nd()).unwrap()), &want, 1e-5);
    let at = f32s(&transposed(&a.data, n, k), &[k, n]);
    let bt = f32s(&transposed(&b.data, k, m), &[m, k]);
    let got = ops::dot(&at, &bt, DotParams::new().transpose_a(true).transpose_b(true)).unwrap();
    assert_close("dot transposed", &read(&got), &want, 1e-5);

    let batch_a = Host::random(&[2, n, k], 10, -1.0, 1.0);
    let batch_b = Host::random(&[2, k, m], 11, -1.0, 1.0);
    let want: Vec<f64> = (0..2).flat_map(|i| matmul(&batch_a.data[i * n * k..][..n * k], &batch_b.data[i * k * m..][..k * m], n, k, m)).collect();
    assert_close("batch_dot", &read(&ops::batch_dot(&batch_a.nd(), &batch_b.nd(), DotParams::new()).unwrap()), &want, 1e-5);
}

#[test]
fn fully_connected_matches_reference() {
    let x = Host::random(&[2, 3, 2, 2], 12, -1.0, 1.0);
    let w = Host::random(&[5, 12], 13, -1.0, 1.0);
    let b = Host::random(&[5], 14, -1.0, 1.0);
    let mut want = matmul(&x.data, &transposed(&w.data, 5, 12), 2, 12, 5);
    want.iter_mut().enumerate().for_each(|(i, v)| *v += b.data[i % 5]);
    let got = nn::fully_connected(&x.nd(), &w.nd(), Some(&b.nd()), FullyConnectedParams::new(5)).unwrap();
    assert_eq!(got.shape().dims(), [2, 5]);
    assert_close("FullyConnected", &read(&got), &want, 1e-5);

    // flatten=False applies the layer to the last axis; no bias.
    let x = Host::random(&[2, 3, 4], 15, -1.0, 1.0);
    let w = Host::random(&[5, 4], 16, -1.0, 1.0);
    let got = nn::fully_connected(&x.nd(), &w.nd(), None, FullyConnectedParams::new(5).flatten(false)).unwrap();
    assert_eq!(got.shape().dims(), [2, 3, 5]);
    assert_close("FullyConnected flatten=False", &read(&got), &matmul(&x.data, &transposed(&w.data, 5, 4), 6, 4, 5), 1e-5);
}

// ---- convolution and pooling --------------------------------------------------------------

/// Geometry of one convolution along one spatial axis.
#[derive(Clone, Copy)]
struct Axis {
    kernel: usize,
    stride: usize,
    pad: usize,
    dilate: usize,
}

impl Axis {
    fn output(&self, input: usize) -> usize {
        (input + 2 * self.pad - self.dilate * (self.kernel - 1) - 1) / self.stride + 1
    }
    /// The input position tap `k` of output `o` reads, if inside the input.
    fn source(&self, o: usize, k: usize, input: usize) -> Option<usize> {
        (o * self.stride + k * self.dilate).checked_sub(self.pad).filter(|&i| i < input)
    }
}

/// Direct 2-D convolution, NCHW data and (filters, channels / groups, kh, kw) weights.
fn conv2d_reference(x: &Host, w: &Host, bias: &[f64], groups: usize, geometry: [Axis; 2]) -> Host {
    let (n, h, wd) = (x.shape[0], x.shape[2], x.shape[3]);
    let (f, cg) = (w.shape[0], w.shape[1]);
    let (oh, ow) = (geometry[0].output(h), geometry[1].output(wd));
    let shape = vec![n, f, oh, ow];
    let data = (0..size(&shape))
        .map(|flat| {
            let [b, o, y, z] = unravel(flat, &shape)[..] else { unreachable!() };
            let group = o / (f / groups);
            let mut total = bias[o];
            for ci in 0..cg {
                for ky in 0..geometry[0].kernel {
                    for kx in 0..geometry[1].kernel {
                        if let (Some(iy), Some(ix)) = (geometry[0].source(y, ky, h), geometry[1].source(z, kx, wd)) {
                            total += x.at(&[b, group * cg + ci, iy, ix]) * w.at(&[o, ci, ky, kx]);
                        }
                    }
                }
            }
            total
        })
        .collect();
    Host { shape, data }
}

#[test]
fn convolution_matches_direct_reference() {
    let x = Host::random(&[2, 4, 7, 6], 17, -1.0, 1.0);
    let w = Host::random(&[6, 2, 3, 3], 18, -1.0, 1.0);
    let b = Host::random(&[6], 19, -1.0, 1.0);
    let geometry = [Axis { kernel: 3, stride: 2, pad: 1, dilate: 1 }, Axis { kernel: 3, stride: 1, pad: 2, dilate: 2 }];
    let params = ConvolutionParams::new(vec![3, 3], 6).stride(vec![2, 1]).pad(vec![1, 2]).dilate(vec![1, 2]).num_group(2);
    let got = nn::convolution(&x.nd(), &w.nd(), Some(&b.nd()), params).unwrap();
    let want = conv2d_reference(&x, &w, &b.data, 2, geometry);
    assert_eq!(got.shape().dims(), want.shape);
    assert_close("Convolution 2-D grouped", &read(&got), &want.data, 1e-5);

    // 1-D, no bias: a 2-D convolution with a height of one.
    let x1 = Host::random(&[2, 3, 10], 20, -1.0, 1.0);
    let w1 = Host::random(&[4, 3, 3], 21, -1.0, 1.0);
    let got = nn::convolution(&x1.nd(), &w1.nd(), None, ConvolutionParams::new(vec![3], 4)).unwrap();
    let as2d = |h: &Host| Host { shape: [&h.shape[..2], &[1], &h.shape[2..]].concat(), data: h.data.clone() };
    let unit = Axis { kernel: 1, stride: 1, pad: 0, dilate: 1 };
    let want = conv2d_reference(&as2d(&x1), &as2d(&w1), &[0.0; 4], 1, [unit, Axis { kernel: 3, ..unit }]);
    assert_close("Convolution 1-D", &read(&got), &want.data, 1e-5);
}

#[test]
fn deconvolution_is_the_transpose_of_convolution() {
    // out[b, o, y*s - p + ky, x*s - p + kx] += in[b, c, y, x] * w[c, o, ky, kx]
    let x = Host::random(&[2, 4, 3, 3], 22, -1.0, 1.0);
    let w = Host::random(&[4, 3, 3, 3], 23, -1.0, 1.0);
    let b = Host::random(&[3], 24, -1.0, 1.0);
    let (stride, pad, k) = (2usize, 1usize, 3usize);
    let out = (3 - 1) * stride + k - 2 * pad;
    let shape = vec![2, 3, out, out];
    let mut data: Vec<f64> = (0..size(&shape)).map(|flat| b.data[unravel(flat, &shape)[1]]).collect();
    for flat in 0..x.data.len() {
        let [n, c, y, z] = unravel(flat, &x.shape)[..] else { unreachable!() };
        for o in 0..3 {
            for ky in 0..k {
                for kx in 0..k {
                    let (oy, ox) = ((y * stride + ky).checked_sub(pad), (z * stride + kx).checked_sub(pad));
                    if let (Some(oy), Some(ox)) = (oy.filter(|&v| v < out), ox.filter(|&v| v < out)) {
                        data[ravel(&[n, o, oy, ox], &shape)] += x.data[flat] * w.at(&[c, o, ky, kx]);
                    }
                }
            }
        }
    }
    let params = DeconvolutionParams::new(vec![3, 3], 3).stride(vec![2, 2]).pad(vec![1, 1]);
    let got = nn::deconvolution(&x.nd(), &w.nd(), Some(&b.nd()), params).unwrap();
    assert_eq!(got.shape().dims(), shape);
    assert_close("Deconvolution", &read(&got), &data, 1e-5);
}

/// Pooling of NCHW data: `fold` over each window's values inside the input, then `finish` with
/// the count of those values and the full window size.
fn pool_reference(x: &Host, geometry: [Axis; 2], init: f64, fold: fn(f64, f64) -> f64, finish: fn(f64, usize, usize) -> f64) -> Host {
    let (oh, ow) = (geometry[0].output(x.shape[2]), geometry[1].output(x.shape[3]));
    let shape = vec![x.shape[0], x.shape[1], oh, ow];
    let data = (0..size(&shape))
        .map(|flat| {
            let [b, c, y, z] = unravel(flat, &shape)[..] else { unreachable!() };
            let (mut acc, mut inside) = (init, 0);
            for ky in 0..geometry[0].kernel {
                for kx in 0..geometry[1].kernel {
                    if let (Some(iy), Some(ix)) = (geometry[0].source(y, ky, x.shape[2]), geometry[1].source(z, kx, x.shape[3])) {
                        acc = fold(acc, x.at(&[b, c, iy, ix]));
                        inside += 1;
                    }
                }
            }
            finish(acc, inside, geometry[0].kernel * geometry[1].kernel)
        })
        .collect();
    Host { shape, data }
}

#[test]
fn pooling_matches_reference() {
    let x = Host::random(&[2, 3, 6, 7], 25, -1.0, 1.0);
    let two = Axis { kernel: 2, stride: 2, pad: 0, dilate: 1 };
    let three = Axis { kernel: 3, stride: 2, pad: 1, dilate: 1 };
    let cases: Vec<(&str, PoolingParams, NDArray, Host)> = vec![
        (
            "max 2x2/2",
            PoolingParams::new().kernel(vec![2, 2]).stride(vec![2, 2]),
            x.nd(),
            pool_reference(&x, [two, two], f64::NEG_INFINITY, f64::max, |a, _, _| a),
        ),
        (
            "avg 3x3/2 pad 1 (padding counted)",
            PoolingParams::new().kernel(vec![3, 3]).stride(vec![2, 2]).pad(vec![1, 1]).pool_type(PoolingType::Avg),
            x.nd(),
            pool_reference(&x, [three, three], 0.0, |a, v| a + v, |a, _, window| a / window as f64),
        ),
        (
            "avg 3x3/2 pad 1 (padding not counted)",
            PoolingParams::new().kernel(vec![3, 3]).stride(vec![2, 2]).pad(vec![1, 1]).pool_type(PoolingType::Avg).count_include_pad(Some(false)),
            x.nd(),
            pool_reference(&x, [three, three], 0.0, |a, v| a + v, |a, inside, _| a / inside as f64),
        ),
        (
            "sum 2x2/2",
            PoolingParams::new().kernel(vec![2, 2]).stride(vec![2, 2]).pool_type(PoolingType::Sum),
            x.nd(),
            pool_reference(&x, [two, two], 0.0, |a, v| a + v, |a, _, _| a),
        ),
        (
            "global avg",
            PoolingParams::new().global_pool(true).pool_type(PoolingType::Avg),
            x.nd(),
            reduce_reference(&x, &[2, 3], true, 0.0, |a, v| a + v, |a, n| a / n as f64),
        ),
    ];
    for (what, params, input, want) in cases {
        let got = nn::pooling(&input, params).unwrap();
        assert_eq!(got.shape().dims(), want.shape, "{what}");
        assert_close(what, &read(&got), &want.data, 1e-5);
    }
}

// ---- activations and softmax --------------------------------------------------------------

#[test]
fn activations_match_reference() {
    let x = Host::random(&[4, 9], 26, -3.0, 3.0);
    let softrelu = |v: f64| v.exp().ln_1p();
    let table: Vec<(&str, NDArray, Box<dyn Fn(f64) -> f64>)> = vec![
        ("relu", nn::activation(&x.nd(), ActivationParams::new(ActivationType::Relu)).unwrap(), Box::new(|v: f64| v.max(0.0))),
        ("sigmoid", nn::activation(&x.nd(), ActivationParams::new(ActivationType::Sigmoid)).unwrap(), Box::new(|v: f64| 1.0 / (1.0 + (-v).exp()))),
        ("tanh", nn::activation(&x.nd(), ActivationParams::new(ActivationType::Tanh)).unwrap(), Box::new(f64::tanh)),
        ("softrelu", nn::activation(&x.nd(), ActivationParams::new(ActivationType::Softrelu)).unwrap(), Box::new(softrelu)),
        ("softsign", nn::activation(&x.nd(), ActivationParams::new(ActivationType::Softsign)).unwrap(), Box::new(|v: f64| v / (1.0 + v.abs()))),
        (
            "leaky 0.1",
            nn::leaky_relu(&x.nd(), None, LeakyReLUParams::new().slope(0.1)).unwrap(),
            Box::new(|v: f64| if v > 0.0 { v } else { 0.1 * v }),
        ),
        (
            "elu 1.0",
            nn::leaky_relu(&x.nd(), None, LeakyReLUParams::new().act_type(LeakyType::Elu).slope(1.0)).unwrap(),
            Box::new(|v: f64| if v > 0.0 { v } else { v.exp_m1() }),
        ),
    ];
    for (what, got, reference) in table {
        let want: Vec<f64> = x.data.iter().map(|&v| reference(v as f32 as f64)).collect();
        assert_close(what, &read(&got), &want, 2e-6);
    }
}

/// Softmax (or its log) of `x` along `axis`, with a temperature.
fn softmax_reference(x: &Host, axis: usize, temperature: f64, log: bool) -> Vec<f64> {
    let mut out = vec![0.0; x.data.len()];
    for flat in 0..x.data.len() {
        let index = unravel(flat, &x.shape);
        let row: Vec<f64> = (0..x.shape[axis])
            .map(|i| {
                let mut at = index.clone();
                at[axis] = i;
                x.at(&at) / temperature
            })
            .collect();
        let top = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let log_total = row.iter().map(|v| (v - top).exp()).sum::<f64>().ln() + top;
        let own = x.data[flat] / temperature - log_total;
        out[flat] = if log { own } else { own.exp() };
    }
    out
}

#[test]
fn softmax_family_matches_reference() {
    let x = Host::random(&[2, 3, 4], 27, -3.0, 3.0);
    for (axis, axis_index) in [(-1i64, 2usize), (1, 1), (0, 0)] {
        let params = SoftmaxParams::new().axis(axis);
        assert_close(
            &format!("softmax axis {axis}"),
            &read(&nn::softmax(&x.nd(), params.clone()).unwrap()),
            &softmax_reference(&x, axis_index, 1.0, false),
            1e-5,
        );
        assert_close(
            &format!("log_softmax axis {axis}"),
            &read(&nn::log_softmax(&x.nd(), params).unwrap()),
            &softmax_reference(&x, axis_index, 1.0, true),
            1e-5,
        );
    }
    let hot = nn::softmax(&x.nd(), SoftmaxParams::new().temperature(Some(2.0))).unwrap();
    assert_close("softmax temperature 2", &read(&hot), &softmax_reference(&x, 2, 2.0, false), 1e-5);

    // The cross-entropy of softmax against integer labels, summed over the batch.
    let logits = Host::random(&[4, 5], 28, -2.0, 2.0);
    let labels = [0.0, 3.0, 4.0, 1.0];
    let log_p = softmax_reference(&logits, 1, 1.0, true);
    let want: f64 = labels.iter().enumerate().map(|(r, &l)| -log_p[r * 5 + l as usize]).sum();
    let got = nn::softmax_cross_entropy(&logits.nd(), &f32s(&labels, &[4])).unwrap();
    assert_close("softmax_cross_entropy", &read(&got), &[want], 1e-5);
}

// ---- normalization ------------------------------------------------------------------------

#[test]
fn batch_norm_uses_moving_statistics_for_inference_and_batch_statistics_for_training() {
    let x = Host::random(&[4, 3, 2, 2], 29, -2.0, 2.0);
    let gamma = Host::random(&[3], 30, 0.5, 1.5);
    let beta = Host::random(&[3], 31, -0.5, 0.5);
    let moving_mean = Host::random(&[3], 32, -0.2, 0.2);
    let moving_var = Host::random(&[3], 33, 0.5, 1.5);
    let (eps, momentum) = (1e-3, 0.9);
    let normalized = |mean: &[f64], var: &[f64], scale: &[f64]| -> Vec<f64> {
        x.data
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let c = unravel(i, &x.shape)[1];
                (v - mean[c]) / (var[c] + eps).sqrt() * scale[c] + beta.data[c]
            })
            .collect()
    };
    let run = |params: BatchNormParams, mm: &NDArray, mv: &NDArray| nn::batch_norm(&x.nd(), &gamma.nd(), &beta.nd(), mm, mv, params).unwrap();

    let (mm, mv) = (moving_mean.nd(), moving_var.nd());
    let inference = run(BatchNormParams::new().fix_gamma(false), &mm, &mv);
    assert_close("BatchNorm inference", &read(&inference), &normalized(&moving_mean.data, &moving_var.data, &gamma.data), 1e-5);
    let fixed = run(BatchNormParams::new(), &mm, &mv);
    assert_close("BatchNorm fix_gamma", &read(&fixed), &normalized(&moving_mean.data, &moving_var.data, &[1.0; 3]), 1e-5);

    let per_channel = |f: &dyn Fn(f64) -> f64| -> Vec<f64> {
        (0..3).map(|c| x.data.iter().enumerate().filter(|(i, _)| unravel(*i, &x.shape)[1] == c).map(|(_, &v)| f(v)).sum::<f64>() / 16.0).collect()
    };
    let mean = per_channel(&|v| v);
    let var: Vec<f64> = per_channel(&|v| v * v).iter().zip(&mean).map(|(sq, m)| sq - m * m).collect();
    let training = {
        let _training = oxnet::train_mode();
        run(BatchNormParams::new().fix_gamma(false), &mm, &mv)
    };
    assert_close("BatchNorm training", &read(&training), &normalized(&mean, &var, &gamma.data), 1e-4);
    let updated = |old: &[f64], batch: &[f64]| -> Vec<f64> { old.iter().zip(batch).map(|(o, b)| o * momentum + b * (1.0 - momentum)).collect() };
    assert_close("BatchNorm moving_mean update", &read(&mm), &updated(&moving_mean.data, &mean), 1e-5);
    // As MXNet's CPU kernel: the moving variance follows the biased batch variance.
    assert_close("BatchNorm moving_var update", &read(&mv), &updated(&moving_var.data, &var), 1e-5);
}

#[test]
fn layer_norm_matches_reference() {
    let x = Host::random(&[2, 3, 4], 34, -2.0, 2.0);
    let gamma = Host::random(&[4], 35, 0.5, 1.5);
    let beta = Host::random(&[4], 36, -0.5, 0.5);
    let eps = 1e-5;
    let want: Vec<f64> = x
        .data
        .chunks(4)
        .flat_map(|row| {
            let mean = row.iter().sum::<f64>() / 4.0;
            let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 4.0;
            row.iter().map(move |v| (v - mean) / (var + eps).sqrt()).collect::<Vec<_>>()
        })
        .enumerate()
        .map(|(i, v)| v * gamma.data[i % 4] + beta.data[i % 4])
        .collect();
    let got = nn::layer_norm(&x.nd(), &gamma.nd(), &beta.nd(), LayerNormParams::new()).unwrap();
    assert_close("LayerNorm", &read(&got), &want, 1e-5);
}

/// The generator is process-wide and tests in this binary run on parallel threads: a test
/// that seeds it and expects reproducible draws holds this lock, as does every test that draws,
/// so that no draw lands between its seed and its samples.
static GLOBAL_GENERATOR: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn hold_generator() -> std::sync::MutexGuard<'static, ()> {
    // A test that failed while holding the lock poisons it; the generator itself is still sound.
    GLOBAL_GENERATOR.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[test]
fn dropout_is_the_identity_for_inference_and_scales_kept_values_in_training() {
    let _generator = hold_generator();
    let x = NDArray::ones([100, 100], DType::F32, cpu()).unwrap();
    assert_close("Dropout inference", &read(&nn::dropout(&x, DropoutParams::new()).unwrap()), &[1.0; 10_000], 0.0);
    let dropped = {
        let _training = oxnet::train_mode();
        read(&nn::dropout(&x, DropoutParams::new().p(0.3)).unwrap())
    };
    let kept = dropped.iter().filter(|&&v| v != 0.0).count();
    assert!(dropped.iter().all(|&v| v == 0.0 || (v - 1.0 / 0.7).abs() < 1e-6), "kept values are scaled by 1 / (1 - p)");
    assert!((6_700..=7_300).contains(&kept), "{kept} of 10000 kept with p = 0.3");
}

// ---- shapes, indexing, sorting ------------------------------------------------------------

#[test]
fn shape_and_indexing_operators_match_reference() {
    let x = Host::random(&[2, 3, 4], 37, -1.0, 1.0);
    let at = |i: usize, j: usize, k: usize| x.at(&[i, j, k]);
    let gather = |shape: &[usize], f: &dyn Fn(&[usize]) -> f64| -> Vec<f64> { (0..size(shape)).map(|flat| f(&unravel(flat, shape))).collect() };
    let check = |what: &str, got: Result<NDArray>, shape: &[usize], want: Vec<f64>| {
        let got = got.unwrap();
        assert_eq!(got.shape().dims(), shape, "{what}");
        assert_close(what, &read(&got), &want, 0.0);
    };
    let nd = x.nd();
    check(
        "transpose (2, 0, 1)",
        ops::transpose(&nd, TransposeParams::new().axes(vec![2, 0, 1])),
        &[4, 2, 3],
        gather(&[4, 2, 3], &|i| at(i[1], i[2], i[0])),
    );
    check("transpose default", ops::transpose(&nd, TransposeParams::new()), &[4, 3, 2], gather(&[4, 3, 2], &|i| at(i[2], i[1], i[0])));
    check("swapaxes 0 2", ops::swapaxes(&nd, SwapAxesParams::new().dim1(0).dim2(2)), &[4, 3, 2], gather(&[4, 3, 2], &|i| at(i[2], i[1], i[0])));
    check("reshape (-1, 4)", ops::reshape(&nd, ReshapeParams::new().shape(vec![-1, 4])), &[6, 4], x.data.clone());
    check("expand_dims 1", ops::expand_dims(&nd, ExpandDimsParams::new(1)), &[2, 1, 3, 4], x.data.clone());
    check("flatten", ops::flatten(&nd), &[2, 12], x.data.clone());
    check("concat dim 1", ops::concat(&[&nd, &nd], 1), &[2, 6, 4], gather(&[2, 6, 4], &|i| at(i[0], i[1] % 3, i[2])));
    check("stack axis 1", ops::stack(&[&nd, &nd], 1), &[2, 2, 3, 4], gather(&[2, 2, 3, 4], &|i| at(i[0], i[2], i[3])));
    check(
        "slice",
        ops::slice(&nd, SliceParams::new(vec![Some(1), None, Some(0)], vec![Some(2), Some(3), None]).step(vec![None, Some(2), Some(3)])),
        &[1, 2, 2],
        gather(&[1, 2, 2], &|i| at(1 + i[0], 2 * i[1], 3 * i[2])),
    );
    check("slice_axis", ops::slice_axis(&nd, SliceAxisParams::new(2, 1, Some(3))), &[2, 3, 2], gather(&[2, 3, 2], &|i| at(i[0], i[1], 1 + i[2])));
    check("flip (0, 2)", ops::flip(&nd, FlipParams::new(vec![0, 2])), &[2, 3, 4], gather(&[2, 3, 4], &|i| at(1 - i[0], i[1], 3 - i[2])));
    check("tile (2, 1, 1)", ops::tile(&nd, TileParams::new(vec![2, 1, 1])), &[4, 3, 4], gather(&[4, 3, 4], &|i| at(i[0] % 2, i[1], i[2])));
    check("repeat 2 axis 1", ops::repeat(&nd, RepeatParams::new(2).axis(Some(1))), &[2, 6, 4], gather(&[2, 6, 4], &|i| at(i[0], i[1] / 2, i[2])));
    let row = f32s(&x.data[..4], &[1, 1, 4]);
    check("broadcast_to", ops::broadcast_to(&row, BroadcastToParams::new(vec![2, 3, 4])), &[2, 3, 4], gather(&[2, 3, 4], &|i| at(0, 0, i[2])));
    check("squeeze", ops::squeeze(&row, SqueezeParams::new()), &[4], x.data[..4].to_vec());
    let halves = ops::split(&nd, SliceChannelParams::new(2).axis(2)).unwrap();
    assert_eq!(halves.len(), 2);
    assert_close("split", &read(&halves[1]), &gather(&[2, 3, 2], &|i| at(i[0], i[1], 2 + i[2])), 0.0);

    let indices = f32s(&[2.0, 0.0, 1.0, 2.0], &[4]);
    check(
        "take axis 1",
        ops::take(&nd, &indices, TakeParams::new().axis(1)),
        &[2, 4, 4],
        gather(&[2, 4, 4], &|i| at(i[0], [2, 0, 1, 2][i[1]], i[2])),
    );
    let picks = f32s(&[3.0, 0.0, 1.0, 2.0, 2.0, 0.0], &[2, 3]);
    check(
        "pick axis 2",
        ops::pick(&nd, &picks, PickParams::new().axis(Some(2))),
        &[2, 3],
        gather(&[2, 3], &|i| at(i[0], i[1], [3, 0, 1, 2, 2, 0][i[0] * 3 + i[1]])),
    );
    check("one_hot", ops::one_hot(&indices, OneHotParams::new(3)), &[4, 3], gather(&[4, 3], &|i| if [2, 0, 1, 2][i[0]] == i[1] { 1.0 } else { 0.0 }));
    let weight = Host::random(&[5, 3], 38, -1.0, 1.0);
    let ids = f32s(&[4.0, 0.0, 2.0, 2.0], &[2, 2]);
    check(
        "Embedding",
        nn::embedding(&ids, &weight.nd(), EmbeddingParams::new(5, 3)),
        &[2, 2, 3],
        gather(&[2, 2, 3], &|i| weight.at(&[[4, 0, 2, 2][i[0] * 2 + i[1]], i[2]])),
    );

    let condition = f32s(&values(24, 39, 0.0, 1.0).iter().map(|v| v.round()).collect::<Vec<_>>(), &[2, 3, 4]);
    let cond_host = read(&condition);
    check(
        "where",
        ops::where_cond(&condition, &nd, &(-&nd).unwrap()),
        &[2, 3, 4],
        x.data.iter().zip(&cond_host).map(|(&v, &c)| if c != 0.0 { v } else { -v }).collect(),
    );
    check("clip", ops::clip(&nd, ClipParams::new(-0.5, 0.25)), &[2, 3, 4], x.data.iter().map(|v| v.clamp(-0.5, 0.25)).collect());
    let total = ops::add_n(&[&nd, &nd, &nd]).unwrap();
    assert_close("add_n", &read(&total), &x.data.iter().map(|v| 3.0 * v).collect::<Vec<_>>(), 1e-6);
}

#[test]
fn sorting_operators_match_reference() {
    let x = Host::random(&[3, 6], 40, -1.0, 1.0);
    let order = |row: &[f64], ascending: bool| -> Vec<usize> {
        let mut idx: Vec<usize> = (0..row.len()).collect();
        idx.sort_by(|&a, &b| if ascending { row[a].total_cmp(&row[b]) } else { row[b].total_cmp(&row[a]) });
        idx
    };
    let rows: Vec<&[f64]> = x.data.chunks(6).collect();
    let sorted: Vec<f64> = rows.iter().flat_map(|r| order(r, true).into_iter().map(|i| r[i])).collect();
    assert_close("sort", &read(&ops::sort(&x.nd(), SortParams::new()).unwrap()), &sorted, 0.0);
    let descending_idx: Vec<f64> = rows.iter().flat_map(|r| order(r, false).into_iter().map(|i| i as f64)).collect();
    assert_close("argsort descending", &read(&ops::argsort(&x.nd(), ArgsortParams::new().is_ascend(false)).unwrap()), &descending_idx, 0.0);
    let both = ops::topk(&x.nd(), TopkParams::new().k(2).ret_typ(TopkReturn::Both)).unwrap();
    let top_values: Vec<f64> = rows.iter().flat_map(|r| order(r, false).into_iter().take(2).map(|i| r[i])).collect();
    let top_indices: Vec<f64> = rows.iter().flat_map(|r| order(r, false).into_iter().take(2).map(|i| i as f64)).collect();
    assert_eq!(both.len(), 2);
    assert_close("topk values", &read(&both[0]), &top_values, 0.0);
    assert_close("topk indices", &read(&both[1]), &top_indices, 0.0);
}

// ---- creation, sampling, optimizer updates ------------------------------------------------

#[test]
fn creation_and_sampling() {
    assert_eq!(NDArray::zeros([2, 3], DType::F64, cpu()).unwrap().to_vec::<f64>().unwrap(), [0.0; 6]);
    assert_eq!(NDArray::ones([4], DType::I32, cpu()).unwrap().to_vec::<i32>().unwrap(), [1; 4]);
    assert_eq!(NDArray::full([2], 2.5, DType::F32, cpu()).unwrap().to_vec::<f32>().unwrap(), [2.5; 2]);
    assert_close("arange", &read(&ops::arange(ArangeParams::new(1.0).stop(Some(3.0)).step(0.5)).unwrap()), &[1.0, 1.5, 2.0, 2.5], 0.0);

    let _generator = hold_generator();
    oxnet::random::seed(3);
    let shape = vec![20_000i64];
    let uniform = read(&ops::random_uniform(UniformParams::new().low(-1.0).high(3.0).shape(shape.clone())).unwrap());
    assert!(uniform.iter().all(|&v| (-1.0..3.0).contains(&v)));
    let mean = uniform.iter().sum::<f64>() / uniform.len() as f64;
    assert!((mean - 1.0).abs() < 0.05, "uniform mean {mean}");
    let normal = read(&ops::random_normal(NormalParams::new().loc(2.0).scale(0.5).shape(shape)).unwrap());
    let mean = normal.iter().sum::<f64>() / normal.len() as f64;
    let std = (normal.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / normal.len() as f64).sqrt();
    assert!((mean - 2.0).abs() < 0.02 && (std - 0.5).abs() < 0.02, "normal mean {mean} std {std}");
    oxnet::random::seed(3);
    let again = read(&ops::random_uniform(UniformParams::new().low(-1.0).high(3.0).shape(vec![20_000])).unwrap());
    assert_eq!(again, uniform, "a seed makes draws reproducible");
}

#[test]
fn optimizer_updates_match_their_formulas() {
    let w0 = Host::random(&[10], 41, -1.0, 1.0);
    let g = Host::random(&[10], 42, -3.0, 3.0);
    let (lr, wd, rescale, clip) = (0.1, 0.01, 0.5, 1.0);
    let clipped = |v: f64| (v * rescale).clamp(-clip, clip);

    let w = w0.nd();
    optim::sgd_update(&w, &g.nd(), SgdParams::new(lr).wd(wd).rescale_grad(rescale).clip_gradient(clip)).unwrap();
    let want: Vec<f64> = w0.data.iter().zip(&g.data).map(|(&w, &g)| w - lr * (clipped(g) + wd * w)).collect();
    assert_close("sgd_update", &read(&w), &want, 1e-6);

    let (w, mom) = (w0.nd(), NDArray::full([10], 0.2, DType::F32, cpu()).unwrap());
    optim::sgd_mom_update(&w, &g.nd(), &mom, SgdMomParams::new(lr).momentum(0.9).wd(wd).rescale_grad(rescale).clip_gradient(clip)).unwrap();
    let new_mom: Vec<f64> = w0.data.iter().zip(&g.data).map(|(&w, &g)| 0.9 * 0.2 - lr * wd * w - lr * clipped(g)).collect();
    assert_close("sgd_mom_update mom", &read(&mom), &new_mom, 1e-6);
    assert_close("sgd_mom_update weight", &read(&w), &w0.data.iter().zip(&new_mom).map(|(w, m)| w + m).collect::<Vec<_>>(), 1e-6);

    let (w, mean, var) = (w0.nd(), ops::zeros_like(&w0.nd()).unwrap(), ops::zeros_like(&w0.nd()).unwrap());
    let (b1, b2, eps) = (0.9, 0.999, 1e-8);
    optim::adam_update(&w, &g.nd(), &mean, &var, AdamParams::new(lr).wd(wd).rescale_grad(rescale)).unwrap();
    let grads: Vec<f64> = w0.data.iter().zip(&g.data).map(|(&w, &g)| g * rescale + wd * w).collect();
    let m: Vec<f64> = grads.iter().map(|g| (1.0 - b1) * g).collect();
    let v: Vec<f64> = grads.iter().map(|g| (1.0 - b2) * g * g).collect();
    assert_close("adam_update mean", &read(&mean), &m, 1e-6);
    assert_close("adam_update var", &read(&var), &v, 1e-6);
    let want: Vec<f64> = w0.data.iter().zip(m.iter().zip(&v)).map(|(w, (m, v))| w - lr * m / (v.sqrt() + eps)).collect();
    assert_close("adam_update weight", &read(&w), &want, 1e-5);
}

// ---- gradients ----------------------------------------------------------------------------

/// Checks the gradient autograd computes for every input of `f` (float64) against central
/// finite differences of `sum(f(inputs) * weights)`.
fn check_gradient(what: &str, inputs: &[Host], f: &dyn Fn(&[NDArray]) -> Result<NDArray>) {
    let arrays: Vec<NDArray> = inputs.iter().map(Host::nd64).collect();
    let probe = f(&arrays).unwrap();
    let weights = array(&values(probe.size(), 99, -1.0, 1.0), probe.shape().dims(), DType::F64);
    let objective = |arrays: &[NDArray]| -> f64 { read(&(&f(arrays).unwrap() * &weights).unwrap().sum_all().unwrap())[0] };

    let mut variables = arrays.clone();
    for v in &mut variables {
        v.attach_grad().unwrap();
    }
    let out = {
        let _recording = oxnet::record();
        f(&variables).unwrap()
    };
    out.backward_with(Some(&weights), false).unwrap();
    let h = 1e-6;
    for (k, (input, variable)) in inputs.iter().zip(&variables).enumerate() {
        let analytic = read(&variable.grad().unwrap());
        let numeric: Vec<f64> = (0..input.data.len())
            .map(|i| {
                let shifted = |delta: f64| {
                    let mut moved = input.clone();
                    moved.data[i] += delta;
                    let mut all = arrays.clone();
                    all[k] = moved.nd64();
                    objective(&all)
                };
                (shifted(h) - shifted(-h)) / (2.0 * h)
            })
            .collect();
        assert_close(&format!("gradient of {what}, input {k}"), &analytic, &numeric, 1e-5);
    }
}

#[test]
fn gradients_match_finite_differences() {
    let x = Host::random(&[2, 3, 4], 50, -1.5, 1.5);
    check_gradient("tanh", std::slice::from_ref(&x), &|a| ops::tanh(&a[0]));
    check_gradient("sigmoid * x", std::slice::from_ref(&x), &|a| &a[0] * ops::sigmoid(&a[0]));
    check_gradient("broadcast mul and div", &[x.clone(), Host::random(&[3, 1], 51, 0.5, 2.0)], &|a| (&a[0] * &a[1])? / &a[1].exp()?);
    check_gradient("sum over axis 1", std::slice::from_ref(&x), &|a| ops::sum(&a[0], ReduceParams::new().axis(Some(vec![1]))));
    check_gradient("transpose and reshape", std::slice::from_ref(&x), &|a| ops::transpose(&a[0].reshape([6, 4])?, TransposeParams::new()));
    check_gradient("softmax", std::slice::from_ref(&x), &|a| nn::softmax(&a[0], SoftmaxParams::new()));
    check_gradient("log_softmax axis 1", std::slice::from_ref(&x), &|a| nn::log_softmax(&a[0], SoftmaxParams::new().axis(1)));
    check_gradient("FullyConnected", &[x.clone(), Host::random(&[5, 12], 52, -1.0, 1.0), Host::random(&[5], 53, -1.0, 1.0)], &|a| {
        nn::fully_connected(&a[0], &a[1], Some(&a[2]), FullyConnectedParams::new(5))
    });
    check_gradient(
        "Convolution",
        &[Host::random(&[2, 2, 5, 5], 54, -1.0, 1.0), Host::random(&[3, 2, 3, 3], 55, -1.0, 1.0), Host::random(&[3], 56, -1.0, 1.0)],
        &|a| nn::convolution(&a[0], &a[1], Some(&a[2]), ConvolutionParams::new(vec![3, 3], 3).stride(vec![2, 2]).pad(vec![1, 1])),
    );
    let image = Host::random(&[2, 2, 6, 6], 57, -1.0, 1.0);
    check_gradient("max pooling", std::slice::from_ref(&image), &|a| nn::pooling(&a[0], PoolingParams::new().kernel(vec![2, 2]).stride(vec![2, 2])));
    check_gradient("avg pooling", &[image], &|a| {
        nn::pooling(&a[0], PoolingParams::new().kernel(vec![3, 3]).stride(vec![2, 2]).pad(vec![1, 1]).pool_type(PoolingType::Avg))
    });
    check_gradient("LayerNorm", &[x.clone(), Host::random(&[4], 58, 0.5, 1.5), Host::random(&[4], 59, -0.5, 0.5)], &|a| {
        nn::layer_norm(&a[0], &a[1], &a[2], LayerNormParams::new())
    });
    let indices = array(&[2.0, 0.0, 2.0], &[3], DType::F64);
    check_gradient("take (repeated indices)", &[x], &|a| ops::take(&a[0], &indices, TakeParams::new().axis(1)));
}

// ---- recurrent layers, sequences, output layers -------------------------------------------

fn sigmoid(v: f64) -> f64 {
    1.0 / (1.0 + (-v).exp())
}

/// `w (rows, cols) * v + b`, row-major.
fn affine(w: &[f64], v: &[f64], b: &[f64]) -> Vec<f64> {
    b.iter().enumerate().map(|(r, &bias)| bias + w[r * v.len()..][..v.len()].iter().zip(v).map(|(a, x)| a * x).sum::<f64>()).collect()
}

/// One layer, one direction, of MXNet's LSTM (gates i, f, g, o) or GRU (gates r, z, n; the reset
/// gate scales W_hn h + b_hn), step by step over (steps, batch, input) data with zero initial
/// states: (outputs, final hidden state, final cell state).
fn recurrent_reference(lstm: bool, x: &Host, params: &[f64], hidden: usize) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (steps, batch, input) = (x.shape[0], x.shape[1], x.shape[2]);
    let gates = if lstm { 4 } else { 3 } * hidden;
    let (w_ih, rest) = params.split_at(gates * input);
    let (w_hh, rest) = rest.split_at(gates * hidden);
    let (b_ih, b_hh) = rest.split_at(gates);
    let (mut h, mut c) = (vec![vec![0.0; hidden]; batch], vec![vec![0.0; hidden]; batch]);
    let mut out = Vec::new();
    for t in 0..steps {
        for b in 0..batch {
            let xt = &x.data[(t * batch + b) * input..][..input];
            let (gi, gh) = (affine(w_ih, xt, b_ih), affine(w_hh, &h[b], b_hh));
            for j in 0..hidden {
                if lstm {
                    let g = |k: usize| gi[k * hidden + j] + gh[k * hidden + j];
                    c[b][j] = sigmoid(g(1)) * c[b][j] + sigmoid(g(0)) * g(2).tanh();
                    h[b][j] = sigmoid(g(3)) * c[b][j].tanh();
                } else {
                    let reset = sigmoid(gi[j] + gh[j]);
                    let update = sigmoid(gi[hidden + j] + gh[hidden + j]);
                    let candidate = (gi[2 * hidden + j] + reset * gh[2 * hidden + j]).tanh();
                    h[b][j] = (1.0 - update) * candidate + update * h[b][j];
                }
            }
            out.extend_from_slice(&h[b]);
        }
    }
    (out, h.concat(), c.concat())
}

#[test]
fn recurrent_layers_match_a_step_by_step_reference() {
    let (steps, batch, input, hidden) = (4, 3, 5, 6);
    let x = Host::random(&[steps, batch, input], 60, -1.0, 1.0);
    for (mode, lstm) in [(RnnMode::Lstm, true), (RnnMode::Gru, false)] {
        let gates = if lstm { 4 } else { 3 } * hidden;
        let params = Host::random(&[gates * (input + hidden + 2)], 61, -0.5, 0.5);
        let zeros = NDArray::zeros([1, batch, hidden], DType::F32, cpu()).unwrap();
        let rnn_params = RnnParams::new(hidden, 1, mode).state_outputs(true);
        let outputs = nn::rnn(&x.nd(), &params.nd(), &zeros, lstm.then_some(&zeros), rnn_params).unwrap();
        let (out, h, c) = recurrent_reference(lstm, &x, &params.data, hidden);
        assert_eq!(outputs[0].shape().dims(), [steps, batch, hidden]);
        assert_close(&format!("{mode} outputs"), &read(&outputs[0]), &out, 1e-5);
        assert_close(&format!("{mode} final state"), &read(&outputs[1]), &h, 1e-5);
        if lstm {
            assert_close("lstm final cell", &read(&outputs[2]), &c, 1e-5);
        }
    }
}

#[test]
fn sequence_operators_follow_each_sequence_length() {
    let (steps, batch, width) = (4, 3, 2);
    let x = Host::random(&[steps, batch, width], 62, -1.0, 1.0);
    let lengths = [2.0, 4.0, 1.0];
    let len = f32s(&lengths, &[batch]);
    let params = SequenceParams::new().use_sequence_length(true);

    let masked = ops::call1("SequenceMask", &[&x.nd(), &len], &params.clone().value(-7.0)).unwrap();
    let want: Vec<f64> = (0..x.data.len())
        .map(|i| {
            let [t, b, _] = unravel(i, &x.shape)[..] else { unreachable!() };
            if (t as f64) < lengths[b] {
                x.data[i]
            } else {
                -7.0
            }
        })
        .collect();
    assert_close("SequenceMask", &read(&masked), &want, 0.0);

    let last = ops::call1("SequenceLast", &[&x.nd(), &len], &params).unwrap();
    let want: Vec<f64> = (0..batch).flat_map(|b| (0..width).map(move |k| (b, k))).map(|(b, k)| x.at(&[lengths[b] as usize - 1, b, k])).collect();
    assert_close("SequenceLast", &read(&last), &want, 0.0);

    // Each sequence's own steps reversed; steps past its length stay where they are.
    let reversed = ops::call1("SequenceReverse", &[&x.nd(), &len], &params).unwrap();
    let want: Vec<f64> = (0..x.data.len())
        .map(|i| {
            let [t, b, k] = unravel(i, &x.shape)[..] else { unreachable!() };
            let n = lengths[b] as usize;
            x.at(&[if t < n { n - 1 - t } else { t }, b, k])
        })
        .collect();
    assert_close("SequenceReverse", &read(&reversed), &want, 0.0);
}

#[test]
fn softmax_output_is_softmax_forward_and_probabilities_minus_one_hot_backward() {
    let x = Host::random(&[3, 4], 63, -2.0, 2.0);
    let labels = [1.0, 3.0, 0.0];
    let probabilities = softmax_reference(&x, 1, 1.0, false);
    let mut data = x.nd64();
    data.attach_grad().unwrap();
    let out = {
        let _recording = oxnet::record();
        nn::softmax_output(&data, &array(&labels, &[3], DType::F64), SoftmaxOutputParams::new().grad_scale(0.5)).unwrap()
    };
    assert_close("SoftmaxOutput forward", &read(&out), &probabilities, 1e-12);
    // The loss layer ignores its head gradient: d = grad_scale * (p - one_hot(label)).
    out.backward().unwrap();
    let want: Vec<f64> = probabilities.iter().enumerate().map(|(i, p)| 0.5 * (p - f64::from(u8::from(labels[i / 4] as usize == i % 4)))).collect();
    assert_close("SoftmaxOutput gradient", &read(&data.grad().unwrap()), &want, 1e-12);
}

// ---- more normalization, resampling and padding -------------------------------------------

/// `(x - mean) / sqrt(var + eps)` over consecutive runs of `run` values of `x`.
fn standardized(x: &[f64], run: usize, eps: f64) -> Vec<f64> {
    x.chunks(run)
        .flat_map(|r| {
            let mean = r.iter().sum::<f64>() / run as f64;
            let var = r.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / run as f64;
            r.iter().map(move |v| (v - mean) / (var + eps).sqrt()).collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn group_instance_l2_and_local_response_normalization_match_reference() {
    let x = Host::random(&[2, 4, 3, 2], 64, -2.0, 2.0);
    let channel_of = |i: usize| unravel(i, &x.shape)[1];

    let (gamma, beta) = (Host::random(&[4], 65, 0.5, 1.5), Host::random(&[4], 66, -0.5, 0.5));
    let got = ops::call1("InstanceNorm", &[&x.nd(), &gamma.nd(), &beta.nd()], &InstanceNormParams::new().eps(1e-5)).unwrap();
    let want: Vec<f64> =
        standardized(&x.data, 6, 1e-5).iter().enumerate().map(|(i, v)| v * gamma.data[channel_of(i)] + beta.data[channel_of(i)]).collect();
    assert_close("InstanceNorm", &read(&got), &want, 1e-5);

    // MXNet 1.x's GroupNorm: statistics and gamma/beta per group of channels.
    let (gamma, beta) = (Host::random(&[2], 67, 0.5, 1.5), Host::random(&[2], 68, -0.5, 0.5));
    let got = ops::call1("GroupNorm", &[&x.nd(), &gamma.nd(), &beta.nd()], &GroupNormParams::new().num_groups(2)).unwrap();
    let want: Vec<f64> =
        standardized(&x.data, 12, 1e-5).iter().enumerate().map(|(i, v)| v * gamma.data[channel_of(i) / 2] + beta.data[channel_of(i) / 2]).collect();
    assert_close("GroupNorm", &read(&got), &want, 1e-5);

    let got = ops::call1("L2Normalization", &[&x.nd()], &L2NormalizationParams::new()).unwrap();
    let want: Vec<f64> = x
        .data
        .chunks(24)
        .flat_map(|r| {
            let norm = (r.iter().map(|v| v * v).sum::<f64>() + 1e-10).sqrt();
            r.iter().map(move |v| v / norm).collect::<Vec<_>>()
        })
        .collect();
    assert_close("L2Normalization instance", &read(&got), &want, 1e-6);

    let (alpha, beta_exp, knorm, nsize) = (1e-2, 0.75, 2.0, 3);
    let got = ops::call1("LRN", &[&x.nd()], &LRNParams::new(nsize).alpha(alpha).beta(beta_exp).knorm(knorm)).unwrap();
    let want: Vec<f64> = (0..x.data.len())
        .map(|i| {
            let index = unravel(i, &x.shape);
            let c = index[1] as i64;
            let squares: f64 = (c - 1..=c + 1)
                .filter(|&j| (0..4).contains(&j))
                .map(|j| {
                    let mut at = index.clone();
                    at[1] = j as usize;
                    x.at(&at).powi(2)
                })
                .sum();
            x.data[i] * (knorm + alpha / nsize as f64 * squares).powf(-beta_exp)
        })
        .collect();
    assert_close("LRN", &read(&got), &want, 1e-5);

    let gelu = nn::leaky_relu(&x.nd(), None, LeakyReLUParams::new().act_type(LeakyType::Gelu)).unwrap();
    let want: Vec<f64> = x.data.iter().map(|&v| 0.5 * v * (1.0 + libm::erf(v / std::f64::consts::SQRT_2))).collect();
    assert_close("gelu", &read(&gelu), &want, 1e-6);
}

#[test]
fn nearest_upsampling_and_padding_match_reference() {
    let x = Host::random(&[1, 2, 2, 3], 69, -1.0, 1.0);
    let got = ops::call1("UpSampling", &[&x.nd()], &UpSamplingParams::new(2, SampleType::Nearest)).unwrap();
    assert_eq!(got.shape().dims(), [1, 2, 4, 6]);
    let want: Vec<f64> = (0..48)
        .map(|i| {
            let [n, c, h, w] = unravel(i, &[1, 2, 4, 6])[..] else { unreachable!() };
            x.at(&[n, c, h / 2, w / 2])
        })
        .collect();
    assert_close("UpSampling nearest", &read(&got), &want, 0.0);

    let widths = [0i64, 0, 0, 0, 1, 2, 2, 1];
    let padded_shape = [1, 2, 5, 6];
    let source = |index: &[usize], edge: bool| -> Option<f64> {
        let (h, w) = (index[2] as i64 - 1, index[3] as i64 - 2);
        let inside = (0..2).contains(&h) && (0..3).contains(&w);
        (inside || edge).then(|| x.at(&[index[0], index[1], h.clamp(0, 1) as usize, w.clamp(0, 2) as usize]))
    };
    for (mode, edge) in [(PadMode::Constant, false), (PadMode::Edge, true)] {
        let got = ops::call1("Pad", &[&x.nd()], &PadParams::new(widths.to_vec()).mode(mode).constant_value(0.5)).unwrap();
        assert_eq!(got.shape().dims(), padded_shape);
        let want: Vec<f64> = (0..size(&padded_shape)).map(|i| source(&unravel(i, &padded_shape), edge).unwrap_or(0.5)).collect();
        assert_close(&format!("Pad {mode}"), &read(&got), &want, 0.0);
    }
}
