//! Criterion benchmarks of the core without Python: per-op engine overhead, a memory-bound
//! element-wise add, a reduction and a GEMM. Run with `cargo bench --bench core_ops`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use oxnet::imperative::invoke;
use oxnet::op::Attrs;
use oxnet::{Context, NDArray, Shape};

fn uniform(shape: &[usize]) -> NDArray {
    let attrs: Attrs = [("shape".to_string(), format!("{:?}", shape).replace('[', "(").replace(']', ")"))].into();
    invoke("_random_uniform", &[], &attrs, None, Context::cpu(0), None).unwrap().remove(0)
}

fn small_op_overhead(c: &mut Criterion) {
    let (a, b) = (uniform(&[2, 2]), uniform(&[2, 2]));
    let attrs = Attrs::new();
    c.bench_function("push broadcast_add 2x2", |bench| {
        bench.iter(|| invoke("broadcast_add", &[a.clone(), b.clone()], &attrs, None, Context::cpu(0), None).unwrap())
    });
    oxnet::engine::wait_all().unwrap();
}

fn big_add(c: &mut Criterion) {
    let n = 1 << 24;
    let (a, b) = (uniform(&[n]), uniform(&[n]));
    let out = NDArray::empty(Shape::new(vec![n]), oxnet::DType::F32, Context::cpu(0)).unwrap();
    let mut g = c.benchmark_group("add 16M f32 into out");
    g.throughput(Throughput::Bytes(3 * 4 * n as u64));
    g.bench_function("elemwise_add", |bench| {
        bench.iter(|| {
            invoke("elemwise_add", &[a.clone(), b.clone()], &Attrs::new(), Some(vec![out.clone()]), Context::cpu(0), None).unwrap();
            out.wait_to_read().unwrap();
        })
    });
    g.throughput(Throughput::Bytes(4 * n as u64));
    g.bench_function("sum", |bench| {
        bench.iter(|| invoke("sum", &[a.clone()], &Attrs::new(), None, Context::cpu(0), None).unwrap()[0].wait_to_read().unwrap())
    });
    g.finish();
}

fn gemm(c: &mut Criterion) {
    let mut g = c.benchmark_group("dot f32");
    for n in [512usize, 1024] {
        let (x, y) = (uniform(&[n, n]), uniform(&[n, n]));
        g.throughput(Throughput::Elements(2 * (n * n * n) as u64));
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |bench, _| {
            bench.iter(|| invoke("dot", &[x.clone(), y.clone()], &Attrs::new(), None, Context::cpu(0), None).unwrap()[0].wait_to_read().unwrap())
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = small_op_overhead, big_add, gemm
}
criterion_main!(benches);
