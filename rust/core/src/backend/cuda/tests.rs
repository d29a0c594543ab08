//! Kernel sources are checked here on any machine: their text always, their compilation by NVRTC
//! wherever libnvrtc loads (CI installs pip's nvidia-cuda-nvrtc), so a syntax error in a
//! generated kernel never waits for a GPU machine.

use super::kernel_source::{
    add_bias_kernel, broadcast_kernel, cast_kernel, col2im_kernel, dropout_kernel, elementwise_kernel, elementwise_vector_kernel, fill_kernel,
    fused_kernel, im2col_kernel, kernel_name, pick_kernel, pool_backward_kernel, pool_kernel, reduce_kernel, scale_kernel, softmax_backward_kernel,
    softmax_kernel, strided_copy_kernel, PRELUDE,
};
use super::nvrtc;
use crate::base::{DType, Shape};
use crate::graph::topo_order;
use crate::op::{registry, Attrs, Elementwise, Reduction};
use crate::pass::fuse::fuse_elementwise;
use crate::pass::infer::{infer_shapes, infer_types};
use crate::symbol::Symbol;

/// Every registered operator that has an element-wise expression, instantiated with its
/// default parameters: (name, number of inputs, expression).
fn elementwise_operators() -> Vec<(&'static str, usize, Elementwise)> {
    registry()
        .defs()
        .iter()
        .filter_map(|def| {
            let op = def.instantiate(def.name, &Attrs::new()).ok()?;
            let elementwise = op.elementwise()?;
            Some((def.name, op.num_inputs(), elementwise))
        })
        .collect()
}

/// Every registered reduction, instantiated with its default parameters.
fn reductions() -> Vec<(&'static str, Reduction)> {
    registry().defs().iter().filter_map(|def| Some((def.name, def.instantiate(def.name, &Attrs::new()).ok()?.reduction()?))).collect()
}

fn kernel_for(op_name: &str, dtype: DType) -> String {
    let (name, inputs, elementwise) =
        elementwise_operators().into_iter().find(|(name, ..)| *name == op_name).unwrap_or_else(|| panic!("{op_name} is not element-wise"));
    elementwise_kernel(&kernel_name(name, dtype), &elementwise, inputs, dtype)
}

#[test]
fn kernels_compute_in_the_cpu_kernels_types() {
    let reverse_minus = kernel_for("_rminus_scalar", DType::F32);
    assert!(reverse_minus.contains("double scalar") && reverse_minus.contains("ox_store(out_ptr + i3, s - v0_3);"), "{reverse_minus}");
    // Integer binary math runs in long long, with the scalar cast to the dtype first.
    let plus = kernel_for("_plus_scalar", DType::I32);
    assert!(plus.contains("int scalar_stored;") && plus.contains("const long long v0_0 = i0 < n ? (long long)ox_load(in0_ptr[i0])"), "{plus}");
    // Integer unary math runs in double; 16-bit floats in float.
    assert!(kernel_for("sqrt", DType::U8).contains("const double v0_0"));
    let half = kernel_for("elemwise_mul", DType::F16);
    assert!(half.contains("const ox_half* in1_ptr") && half.contains("const float v1_2 = i2 < n ? (float)ox_load(in1_ptr[i2])"), "{half}");
    // Operands that are not plain names keep their precedence.
    assert!(kernel_for("square", DType::F64).contains("v0_1 * v0_1"));
    // Every load of a pass comes before its first store (in-place operators read each element
    // in the thread that writes it).
    let load = plus.rfind("ox_load(in0_ptr").unwrap();
    assert!(load < plus.find("ox_store(out_ptr").unwrap(), "{plus}");
    let (_, _, add) = elementwise_operators().into_iter().find(|(name, ..)| *name == "broadcast_add").unwrap();
    let broadcast = broadcast_kernel("ox_broadcast_add_int64", &add, DType::I64);
    assert!(broadcast.contains("ox_broadcast shape)") && broadcast.contains("ox_load(in1_ptr[rhs])"), "{broadcast}");
}

#[test]
fn fused_chains_become_one_expression() {
    let expr = fused_expression(|a, b| {
        let mul = Symbol::create("elemwise_mul", Attrs::new(), "mul", &[a.clone(), b], &[]).unwrap();
        let plus = Symbol::create("_plus_scalar", [("scalar".to_string(), "1".to_string())].into_iter().collect(), "plus", &[mul], &[]).unwrap();
        let sig = Symbol::create("sigmoid", Attrs::new(), "sig", &[plus], &[]).unwrap();
        Symbol::create("elemwise_mul", Attrs::new(), "gate", &[sig, a], &[]).unwrap()
    });
    assert_eq!(expr, "(float)(((float)(1 / (1 + exp(-((float)(((float)(in0 * in1)) + ((float)1e0))))))) * in0)");
    let kernel = fused_kernel("ox_fused_gate", 2, &expr);
    assert!(kernel.contains(&format!("ox_store(out_ptr + i, {expr});")), "{kernel}");
}

/// A chain mixing value types in C++ (sign yields int, a comparison bool) that the template
/// helpers (ox_div) could not deduce one type for, were the steps not each made float.
fn mixed_type_chain() -> String {
    fused_expression(|a, b| {
        let sign = Symbol::create("sign", Attrs::new(), "sign", std::slice::from_ref(&a), &[]).unwrap();
        let greater = Symbol::create("_greater", Attrs::new(), "gt", &[a, b.clone()], &[]).unwrap();
        let ratio = Symbol::create("elemwise_div", Attrs::new(), "div", &[sign, b], &[]).unwrap();
        Symbol::create("_maximum", Attrs::new(), "max", &[greater, ratio], &[]).unwrap()
    })
}

/// The expression of the single fused node the fusion pass makes of `build(a, b)`.
fn fused_expression(build: impl Fn(Symbol, Symbol) -> Symbol) -> String {
    let a = Symbol::variable("a", Attrs::new());
    let b = Symbol::variable("b", Attrs::new());
    let out = build(a, b);
    let shapes = infer_shapes(&out.outputs, &|_| Some(Shape::new(vec![8]))).unwrap();
    let types = infer_types(&out.outputs, &|_| Some(DType::F32)).unwrap();
    let fused = fuse_elementwise(&out.outputs, &shapes, &types);
    let nodes = topo_order(&fused, |_| false);
    let ops: Vec<_> = nodes.iter().filter_map(|n| n.op.as_ref()).collect();
    assert_eq!(ops.len(), 1, "one fused node expected");
    ops[0].attrs["expr"].clone()
}

#[test]
fn every_generated_kernel_compiles_with_nvrtc() {
    if let Err(e) = nvrtc::available() {
        eprintln!("skipped, NVRTC not loadable here: {e}");
        return;
    }
    let operators = elementwise_operators();
    // 50 unary operators and 18 binary ones in three forms (broadcast, same-shape, scalar) at least.
    assert!(operators.len() >= 50 + 18 * 3, "only {} element-wise operators found", operators.len());
    let reductions = reductions();
    let reduction_names: Vec<&str> = reductions.iter().map(|(name, _)| *name).collect();
    for expected in ["sum", "mean", "prod", "nansum", "nanprod", "max", "min", "norm"] {
        assert!(reduction_names.contains(&expected), "{expected} has no CUDA reduction: {reduction_names:?}");
    }
    // One program per dtype (all its kernels in one compile) keeps the suite fast.
    for dtype in DType::ALL {
        let mut source = PRELUDE.to_string();
        let mut names = Vec::new();
        for (name, inputs, elementwise) in &operators {
            names.push(kernel_name(name, dtype));
            source.push_str(&elementwise_kernel(names.last().unwrap(), elementwise, *inputs, dtype));
            names.push(kernel_name(&format!("{name}_vector"), dtype));
            source.push_str(&elementwise_vector_kernel(names.last().unwrap(), elementwise, *inputs, dtype));
            if name.starts_with("broadcast_") {
                names.push(kernel_name(&format!("{name}_strided"), dtype));
                source.push_str(&broadcast_kernel(names.last().unwrap(), elementwise, dtype));
            }
        }
        for (name, reduction) in &reductions {
            names.push(kernel_name(name, dtype));
            source.push_str(&reduce_kernel(names.last().unwrap(), reduction, dtype));
        }
        let ptx = nvrtc::compile_uncached(&format!("generated_{}", dtype.name()), &source).unwrap_or_else(|e| panic!("{e}"));
        let text = ptx.to_src();
        for name in &names {
            let entry = format!(".entry {name}(");
            assert!(text.contains(&entry), "{entry} missing from the PTX");
        }
    }
    let fused = fused_kernel("ox_fused_mixed", 2, &mixed_type_chain());
    let ptx = nvrtc::compile("ox_fused_mixed", &format!("{PRELUDE}{fused}")).unwrap_or_else(|e| panic!("{e}"));
    assert!(ptx.to_src().contains(".entry ox_fused_mixed("));
    let again = nvrtc::compile("ox_fused_mixed", "this text is not compiled: the name is cached").unwrap();
    assert!(std::sync::Arc::ptr_eq(&ptx, &again));
}

#[test]
fn compile_errors_name_the_kernel_and_quote_the_log() {
    if nvrtc::available().is_err() {
        eprintln!("skipped, NVRTC not loadable here");
        return;
    }
    let err = nvrtc::compile_uncached("ox_broken", "extern \"C\" __global__ void ox_broken() { undefined_name; }").unwrap_err();
    assert!(err.message.contains("ox_broken") && err.message.contains("undefined_name"), "{}", err.message);
}

#[test]
fn data_movement_kernels_compile_for_every_dtype() {
    if let Err(e) = nvrtc::available() {
        eprintln!("skipped, NVRTC not loadable here: {e}");
        return;
    }
    let mut source = PRELUDE.to_string();
    let mut names = Vec::new();
    for dtype in DType::ALL {
        names.push(format!("ox_fill_{}", dtype.name()));
        source.push_str(&fill_kernel(names.last().unwrap(), dtype));
        for log in [false, true] {
            names.push(format!("ox_softmax_{log}_{}", dtype.name()));
            source.push_str(&softmax_kernel(names.last().unwrap(), dtype, log));
            names.push(format!("ox_softmax_backward_{log}_{}", dtype.name()));
            source.push_str(&softmax_backward_kernel(names.last().unwrap(), dtype, log));
        }
        for (index, backward) in [(DType::F32, false), (DType::I64, true)] {
            names.push(format!("ox_pick_{backward}_{}", dtype.name()));
            source.push_str(&pick_kernel(names.last().unwrap(), dtype, index, backward));
        }
        names.push(format!("ox_dropout_{}", dtype.name()));
        source.push_str(&dropout_kernel(names.last().unwrap(), dtype));
        names.push(format!("ox_scale_{}", dtype.name()));
        source.push_str(&scale_kernel(names.last().unwrap(), dtype));
        names.push(format!("ox_add_bias_{}", dtype.name()));
        source.push_str(&add_bias_kernel(names.last().unwrap(), dtype));
        for to in DType::ALL.into_iter().filter(|&to| to != dtype) {
            names.push(format!("ox_cast_{}_{}", dtype.name(), to.name()));
            source.push_str(&cast_kernel(names.last().unwrap(), dtype, to));
        }
    }
    let ptx = nvrtc::compile_uncached("data_movement", &source).unwrap_or_else(|e| panic!("{e}"));
    for name in &names {
        assert!(ptx.to_src().contains(&format!(".entry {name}(")), "{name} missing from the PTX");
    }
    // Each strided copy defines its parameter struct, so each compiles alone.
    for bytes in [1, 2, 4, 8] {
        let name = format!("ox_strided_copy_{bytes}");
        let ptx = nvrtc::compile_uncached(&name, &format!("{PRELUDE}{}", strided_copy_kernel(&name, bytes))).unwrap_or_else(|e| panic!("{e}"));
        assert!(ptx.to_src().contains(&format!(".entry {name}(")));
    }
}

#[test]
fn pooling_and_convolution_kernels_compile_for_every_dtype() {
    if let Err(e) = nvrtc::available() {
        eprintln!("skipped, NVRTC not loadable here: {e}");
        return;
    }
    // Each of these kernels carries its own geometry struct, so each compiles alone.
    for dtype in DType::ALL {
        for (name, source) in [
            ("ox_pool", pool_kernel("ox_pool", dtype)),
            ("ox_pool_backward", pool_backward_kernel("ox_pool_backward", dtype)),
            ("ox_im2col", im2col_kernel("ox_im2col", dtype)),
            ("ox_col2im", col2im_kernel("ox_col2im", dtype)),
        ] {
            let ptx = nvrtc::compile_uncached(name, &format!("{PRELUDE}{source}")).unwrap_or_else(|e| panic!("{e}"));
            assert!(ptx.to_src().contains(&format!(".entry {name}(")));
        }
    }
}
