//! Criterion benchmarks of the core through its Rust API, without Python: per-op overhead,
//! a memory-bound element-wise add, a reduction, GEMM, convolution forward and backward, an LSTM
//! step, and `Model::predict` of the digits CNN and a ResNet-18-shaped network. Each group
//! reports throughput (bytes, FLOPs or images per second).
//!
//!     cargo bench --bench core_ops                 # all of them
//!     cargo bench --bench core_ops -- predict      # the groups whose name matches
//!
//! benches/README.md says how to compare two commits.

use std::collections::HashMap;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use oxnet::base::PartialShape;
use oxnet::imperative::invoke;
use oxnet::op::Attrs;
use oxnet::prelude::*;

fn cpu() -> Context {
    Context::cpu(0)
}

fn uniform(shape: &[usize]) -> NDArray {
    ops::random_uniform(UniformParams::new().shape(shape.iter().map(|&d| d as i64).collect())).unwrap()
}

fn small_op_overhead(c: &mut Criterion) {
    let (a, b) = (uniform(&[2, 2]), uniform(&[2, 2]));
    let mut g = c.benchmark_group("per-op overhead 2x2");
    g.bench_function("typed ops::add", |bench| bench.iter(|| ops::add(&a, &b).unwrap()));
    g.bench_function("&a + &b", |bench| bench.iter(|| (&a + &b).unwrap()));
    g.bench_function("imperative::invoke by name", |bench| {
        let attrs = Attrs::new();
        bench.iter(|| invoke("broadcast_add", &[a.clone(), b.clone()], &attrs, None, cpu(), None).unwrap())
    });
    g.bench_function("typed FullyConnected", |bench| {
        let (x, w) = (uniform(&[2, 2]), uniform(&[2, 2]));
        bench.iter(|| nn::fully_connected(&x, &w, None, FullyConnectedParams::new(2)).unwrap())
    });
    g.finish();
    oxnet::engine::wait_all().unwrap();
}

fn big_add(c: &mut Criterion) {
    let n = 1 << 24;
    let (a, b) = (uniform(&[n]), uniform(&[n]));
    let out = NDArray::empty(Shape::new(vec![n]), DType::F32, cpu()).unwrap();
    let mut g = c.benchmark_group("add 16M f32 into out");
    g.throughput(Throughput::Bytes(3 * 4 * n as u64));
    g.bench_function("elemwise_add", |bench| {
        bench.iter(|| {
            ops::call_into("elemwise_add", &[&a, &b], &NoParams, &[&out]).unwrap();
            out.wait_to_read().unwrap();
        })
    });
    g.throughput(Throughput::Bytes(4 * n as u64));
    g.bench_function("sum", |bench| bench.iter(|| a.sum_all().unwrap().wait_to_read().unwrap()));
    g.finish();
}

fn gemm(c: &mut Criterion) {
    let mut g = c.benchmark_group("dot f32");
    for n in [512usize, 1024] {
        let (x, y) = (uniform(&[n, n]), uniform(&[n, n]));
        g.throughput(Throughput::Elements(2 * (n * n * n) as u64));
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |bench, _| bench.iter(|| x.dot(&y).unwrap().wait_to_read().unwrap()));
    }
    g.finish();
}

fn convolution(c: &mut Criterion) {
    // A ResNet stage-2 layer: 3x3, 64 -> 64 channels on 56x56, batch 8.
    let (batch, channels, size) = (8usize, 64usize, 56usize);
    let params = ConvolutionParams::new(vec![3, 3], channels).pad(vec![1, 1]).no_bias(true);
    let x = uniform(&[batch, channels, size, size]);
    let mut w = uniform(&[channels, channels, 3, 3]);
    w.attach_grad().unwrap();
    let flops = 2 * batch * channels * channels * 9 * size * size;
    let mut g = c.benchmark_group("convolution 3x3 64x56x56 batch 8");
    g.sample_size(10);
    g.throughput(Throughput::Elements(flops as u64));
    g.bench_function("forward", |bench| bench.iter(|| nn::convolution(&x, &w, None, params.clone()).unwrap().wait_to_read().unwrap()));
    // Backward computes the data and the weight gradient: twice the forward's work.
    g.throughput(Throughput::Elements(3 * flops as u64));
    g.bench_function("forward+backward", |bench| {
        bench.iter(|| {
            let y = {
                let _recording = oxnet::record();
                nn::convolution(&x, &w, None, params.clone()).unwrap()
            };
            y.backward().unwrap();
            w.grad().unwrap().wait_to_read().unwrap();
        })
    });
    g.finish();
}

fn lstm_step(c: &mut Criterion) {
    // One time step of a one-layer LSTM, 512 inputs and 512 hidden units, batch 32.
    let (batch, inputs, hidden) = (32usize, 512usize, 512usize);
    let weights = 4 * hidden * (inputs + hidden) + 8 * hidden;
    let parameters = uniform(&[weights]);
    let (x, state, cell) = (uniform(&[1, batch, inputs]), uniform(&[1, batch, hidden]), uniform(&[1, batch, hidden]));
    let params = RnnParams::new(hidden, 1, RnnMode::Lstm).state_outputs(true);
    let mut g = c.benchmark_group("LSTM step 512x512 batch 32");
    g.throughput(Throughput::Elements((2 * batch * 4 * hidden * (inputs + hidden)) as u64));
    g.bench_function("forward", |bench| {
        bench.iter(|| nn::rnn(&x, &parameters, &state, Some(&cell), params.clone()).unwrap()[0].wait_to_read().unwrap())
    });
    g.finish();
}

/// `Symbol::apply` with the node named after its position, for networks built in a loop.
struct Builder {
    layers: usize,
}

impl Builder {
    fn op<P: Params>(&mut self, op: &str, inputs: &[&Symbol], params: &P) -> Symbol {
        self.layers += 1;
        Symbol::apply(op, &format!("{}{}", op.to_lowercase(), self.layers), inputs, params).unwrap()
    }
    fn conv_bn(&mut self, x: &Symbol, filters: usize, kernel: i64, stride: i64, relu: bool) -> Symbol {
        let p = ConvolutionParams::new(vec![kernel, kernel], filters).stride(vec![stride, stride]).pad(vec![kernel / 2, kernel / 2]).no_bias(true);
        let y = self.op("Convolution", &[x], &p);
        let y = self.op("BatchNorm", &[&y], &BatchNormParams::new().fix_gamma(false));
        if relu {
            self.op("Activation", &[&y], &ActivationParams::new(ActivationType::Relu))
        } else {
            y
        }
    }
}

/// The network `examples/train_digits.py` trains, composed in Rust.
fn digits_cnn() -> Symbol {
    let mut b = Builder { layers: 0 };
    let relu = ActivationParams::new(ActivationType::Relu);
    let pool = PoolingParams::new().kernel(vec![2, 2]).stride(vec![2, 2]);
    let x = Symbol::var("data");
    let x = b.op("Convolution", &[&x], &ConvolutionParams::new(vec![3, 3], 32).pad(vec![1, 1]));
    let x = b.op("Activation", &[&x], &relu);
    let x = b.op("BatchNorm", &[&x], &BatchNormParams::new());
    let x = b.op("Pooling", &[&x], &pool);
    let x = b.op("Convolution", &[&x], &ConvolutionParams::new(vec![3, 3], 64).pad(vec![1, 1]));
    let x = b.op("Activation", &[&x], &relu);
    let x = b.op("Pooling", &[&x], &pool);
    let x = b.op("FullyConnected", &[&x], &FullyConnectedParams::new(128));
    let x = b.op("Activation", &[&x], &relu);
    let x = b.op("Dropout", &[&x], &DropoutParams::new().p(0.2));
    b.op("FullyConnected", &[&x], &FullyConnectedParams::new(10))
}

/// ResNet-18's layer shapes (basic blocks, 64-128-256-512 channels) for 1000 classes.
fn resnet18() -> Symbol {
    let mut b = Builder { layers: 0 };
    let x = Symbol::var("data");
    let x = b.conv_bn(&x, 64, 7, 2, true);
    let mut x = b.op("Pooling", &[&x], &PoolingParams::new().kernel(vec![3, 3]).stride(vec![2, 2]).pad(vec![1, 1]));
    for (stage, filters) in [64usize, 128, 256, 512].into_iter().enumerate() {
        for block in 0..2 {
            let stride = if stage > 0 && block == 0 { 2 } else { 1 };
            let y = b.conv_bn(&x, filters, 3, stride, true);
            let y = b.conv_bn(&y, filters, 3, 1, false);
            let shortcut = if stride == 2 { b.conv_bn(&x, filters, 1, 2, false) } else { x.clone() };
            let sum = b.op("elemwise_add", &[&y, &shortcut], &NoParams);
            x = b.op("Activation", &[&sum], &ActivationParams::new(ActivationType::Relu));
        }
    }
    let x = b.op("Pooling", &[&x], &PoolingParams::new().global_pool(true).pool_type(PoolingType::Avg));
    b.op("FullyConnected", &[&x], &FullyConnectedParams::new(1000))
}

/// A model of `symbol` with random parameters for inputs of `data_shape` (moving variances 1).
fn random_model(symbol: Symbol, data_shape: &[usize]) -> Model {
    let given: HashMap<String, PartialShape> = [("data".to_string(), PartialShape::from(&Shape::from(data_shape)))].into();
    let inferred = symbol.infer_shape(&given).unwrap();
    let names =
        symbol.list_arguments().into_iter().zip(inferred.arguments).chain(symbol.list_auxiliary_states().into_iter().zip(inferred.auxiliary_states));
    let parameters = names
        .filter(|(name, _)| name != "data")
        .map(|(name, shape)| {
            let dims: Vec<i64> = shape.and_then(|s| s.full()).unwrap().dims().iter().map(|&d| d as i64).collect();
            let value = if name.ends_with("moving_var") {
                ops::random_uniform(UniformParams::new().low(0.5).high(1.5).shape(dims))
            } else {
                ops::random_normal(NormalParams::new().scale(0.05).shape(dims))
            };
            (name, value.unwrap())
        })
        .collect();
    Model::new(symbol, parameters, cpu()).unwrap()
}

fn model_predict(c: &mut Criterion) {
    let mut g = c.benchmark_group("Model::predict");
    g.sample_size(10);
    let cases: [(&str, Symbol, Vec<usize>); 3] = [
        ("digits CNN, batch 256", digits_cnn(), vec![256, 1, 8, 8]),
        ("ResNet-18 224x224, batch 1", resnet18(), vec![1, 3, 224, 224]),
        ("ResNet-18 224x224, batch 8", resnet18(), vec![8, 3, 224, 224]),
    ];
    for (name, symbol, shape) in cases {
        let mut model = random_model(symbol, &shape);
        let images = uniform(&shape);
        g.throughput(Throughput::Elements(shape[0] as u64));
        g.bench_function(name, |bench| bench.iter(|| model.predict(&[("data", &images)]).unwrap()[0].wait_to_read().unwrap()));
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = small_op_overhead, big_add, gemm, convolution, lstm_step, model_predict
}
criterion_main!(benches);
