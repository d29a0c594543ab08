"""Inference throughput of oxnet against onnxruntime on the same model exported with mx.onnx.export_model:
ResNet-18 v1 and MobileNet 1.0 at 224x224, batch 1 and 32, two threads each.

    python benches/bench_onnx.py [--models resnet18_v1,mobilenet1.0] [--batches 1,32] [--repeat N]

For each case it prints images/s (from the median of runs taken in turn) of the hybridized Gluon net, of a
bound executor and of onnxruntime, oxnet's throughput relative to onnxruntime's, and the largest difference of
their outputs relative to the largest output. Needs `pip install onnx onnxruntime`.
"""

import argparse
import os
import statistics
import tempfile
import time

# Both runtimes get two threads; the variable must be set before oxnet starts its engine.
THREADS = 2
os.environ.setdefault("OXNET_CPU_WORKER_NTHREADS", str(THREADS))

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402

import oxnet as mx  # noqa: E402
from oxnet.gluon.model_zoo import vision  # noqa: E402


def interleaved_medians(runs, repeat, warmup=2):
    """Median seconds of each of `runs`, taken in turn so that a busy moment of the machine falls on all."""
    for fn in runs.values():
        for _ in range(warmup):
            fn()
    times = {label: [] for label in runs}
    for _ in range(repeat):
        for label, fn in runs.items():
            start = time.perf_counter()
            fn()
            times[label].append(time.perf_counter() - start)
    return {label: statistics.median(t) for label, t in times.items()}


def build(name, batch):
    net = vision.get_model(name)
    net.initialize(mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2))
    x = mx.nd.array(np.random.RandomState(0).uniform(-1, 1, (batch, 3, 224, 224)).astype(np.float32))
    net.hybridize(static_alloc=True, static_shape=True)
    net(x).wait_to_read()
    return net, x


def bound_executor(net, x):
    sym = net(mx.sym.var("data"))
    params = {k: v.data() for k, v in net.collect_params().items()}
    exe = sym.simple_bind(mx.cpu(), grad_req="null", data=x.shape)
    aux = set(sym.list_auxiliary_states())
    exe.copy_params_from({k: v for k, v in params.items() if k not in aux},
                         {k: v for k, v in params.items() if k in aux})
    exe.arg_dict["data"][:] = x
    return sym, params, exe


def onnx_session(sym, params, shape, path):
    mx.onnx.export_model(sym, params, [shape], np.float32, path)
    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def bench_case(name, batch, repeat, workdir):
    net, x = build(name, batch)
    sym, params, exe = bound_executor(net, x)
    session = onnx_session(sym, params, x.shape, os.path.join(workdir, "%s-b%d.onnx" % (name, batch)))
    feed = {"data": x.asnumpy()}
    reference = net(x).asnumpy()
    difference = np.abs(session.run(None, feed)[0] - reference).max() / np.abs(reference).max()

    def gluon_run():
        net(x).wait_to_read()

    def executor_run():
        exe.forward(is_train=False)[0].wait_to_read()

    def onnx_run():
        session.run(None, feed)

    seconds = interleaved_medians({"gluon": gluon_run, "executor": executor_run, "onnxruntime": onnx_run}, repeat)
    rates = {label: batch / s for label, s in seconds.items()}
    print("%-13s batch %-3d  gluon %8.1f img/s  executor %8.1f img/s  onnxruntime %8.1f img/s  "
          "oxnet/ort %.2f (gluon) %.2f (executor)  rel. diff %.1e"
          % (name, batch, rates["gluon"], rates["executor"], rates["onnxruntime"],
             rates["gluon"] / rates["onnxruntime"], rates["executor"] / rates["onnxruntime"], difference), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet18_v1,mobilenet1.0")
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--repeat", type=int, help="timed runs of each (default: 48 images' worth, at least 5)")
    args = parser.parse_args()
    print("threads: oxnet %s, onnxruntime %d; onnxruntime %s" % (os.environ["OXNET_CPU_WORKER_NTHREADS"], THREADS,
                                                                 ort.__version__))
    with tempfile.TemporaryDirectory() as workdir:
        for name in args.models.split(","):
            for batch in (int(b) for b in args.batches.split(",")):
                bench_case(name, batch, args.repeat or max(5, 48 // batch), workdir)


if __name__ == "__main__":
    main()
