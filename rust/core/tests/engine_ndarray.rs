//! Engine ordering through NDArrays and their views, checked against a sequential reference.

use oxnet::imperative::{copy, invoke};
use oxnet::op::Attrs;
use oxnet::{Context, NDArray, Shape};

fn attrs(kv: &[(&str, &str)]) -> Attrs {
    kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn cpu() -> Context {
    Context::cpu(0)
}

fn run(op: &str, inputs: &[NDArray], kv: &[(&str, &str)], out: Option<&NDArray>) -> NDArray {
    invoke(op, inputs, &attrs(kv), out.map(|o| vec![o.clone()]), cpu(), None).unwrap().remove(0)
}

#[test]
fn writes_through_views_are_ordered_with_reads_of_the_whole() {
    let big = 1 << 16; // large enough that ops go to worker threads
    let x = NDArray::from_vec(Shape::new(vec![4, big]), &vec![0f32; 4 * big], cpu()).unwrap();
    let total = NDArray::from_vec(Shape::new(vec![1]), &[0f32], cpu()).unwrap();
    let mut expected = [0f64; 4];
    let mut sums = Vec::new();
    for step in 0..40 {
        let row = step % 4;
        let view = x.slice_view(row, row + 1).unwrap();
        run("_plus_scalar", std::slice::from_ref(&view), &[("scalar", "1")], Some(&view)); // write via the view
        expected[row] += 1.0;
        run("sum", std::slice::from_ref(&x), &[], Some(&total)); // read of the whole, after the write
        let snapshot = NDArray::empty(Shape::new(vec![1]), oxnet::DType::F32, cpu()).unwrap();
        copy(&total, &snapshot, None).unwrap(); // read of total before the next sum overwrites it
        sums.push((snapshot, expected.iter().sum::<f64>() * big as f64));
    }
    for (got, want) in sums {
        assert_eq!(got.to_vec::<f32>().unwrap()[0] as f64, want);
    }
    let rows = x.to_vec::<f32>().unwrap();
    for r in 0..4 {
        assert!(rows[r * big..(r + 1) * big].iter().all(|&v| v as f64 == expected[r]));
    }
}

#[test]
fn reshape_views_share_the_var() {
    let a = NDArray::from_vec(Shape::new(vec![6]), &[1f64, 2., 3., 4., 5., 6.], cpu()).unwrap();
    let m = a.reshape_view(Shape::new(vec![2, 3])).unwrap();
    assert!(std::sync::Arc::ptr_eq(a.var(), m.var()));
    run("_mul_scalar", std::slice::from_ref(&m), &[("scalar", "10")], Some(&m));
    let t = run("transpose", std::slice::from_ref(&m), &[], None);
    assert_eq!(t.to_vec::<f64>().unwrap(), vec![10., 40., 20., 50., 30., 60.]);
    assert_eq!(a.to_vec::<f64>().unwrap(), vec![10., 20., 30., 40., 50., 60.]);
}

#[test]
fn failing_kernel_reports_op_and_shapes_at_the_sync_point() {
    let data = NDArray::from_vec(Shape::new(vec![3, 2]), &[0f32; 6], cpu()).unwrap();
    let idx = NDArray::from_vec(Shape::new(vec![1]), &[5f32], cpu()).unwrap();
    let out = run("take", &[data, idx], &[("mode", "raise")], None);
    // An op that reads the failed array inherits its error; as in MXNet, the error is reported
    // once, at whichever sync point meets it first, and is then cleared for every array sharing it.
    let downstream = run("_plus_scalar", std::slice::from_ref(&out), &[("scalar", "1")], None);
    let err = downstream.wait_to_read().unwrap_err();
    assert!(err.message.contains("operator take((3, 2) float32, (1,) float32)"), "{}", err.message);
    assert!(err.message.contains("out of bounds"), "{}", err.message);
    assert!(out.wait_to_read().is_ok(), "an error already reported is raised again");
}

#[test]
fn invalid_calls_fail_synchronously_with_clear_messages() {
    let a = NDArray::from_vec(Shape::new(vec![2, 3]), &[0f32; 6], cpu()).unwrap();
    let b = NDArray::from_vec(Shape::new(vec![4]), &[0f32; 4], cpu()).unwrap();
    let e = invoke("broadcast_mul", &[a.clone(), b], &Attrs::new(), None, cpu(), None).unwrap_err();
    assert!(e.message.contains("could not be broadcast together with shapes (2, 3) (4,)"), "{}", e.message);
    let e = invoke("sum", std::slice::from_ref(&a), &attrs(&[("axis", "x")]), None, cpu(), None).unwrap_err();
    assert!(e.message.contains("invalid value 'x' for parameter 'axis'"), "{}", e.message);
    let e = invoke("_zeros", &[], &attrs(&[("shape", "(2,)")]), None, Context::gpu(0), None);
    if oxnet::backend::num_gpus() == 0 {
        assert!(e.unwrap_err().message.contains("no GPU"));
    }
}
