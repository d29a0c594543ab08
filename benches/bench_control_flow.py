"""Side-by-side benchmark of control flow and variable-length sequences (issue 26) for oxnet,
MXNet 1.9.1 and PyTorch:

- foreach_step_us: the cost per time step of a symbolic `foreach` loop (forward + backward of a
  bound executor) over a tiny LSTM step (batch 1, width 4, hidden 4), so that the figure is the
  loop's own overhead, not arithmetic; `foreach_imperative_step_us` is the same loop through
  `mx.nd.contrib.foreach` under autograd. PyTorch has no graph-level loop: its column is a Python
  loop over `nn.LSTMCell`, the per-step cost its users pay instead.
- fused_lstm_ms: the fused RNN operator, forward + backward of a 2-layer LSTM, hidden 512, 35
  steps, batch 32, input 512 (MXNet/oxnet: `mx.nd.RNN` under autograd; PyTorch: `nn.LSTM`).
- bucketing: oxnet only (MXNet and PyTorch have no such facility): epochs/s of the digit-sum
  LSTM of examples/variable_length_sum.py (10000 sequences of lengths 2..64, skewed short, 30
  epochs) trained with `gluon.contrib.data.BucketedBatches` against the same batches, in the same
  order, each padded to 64 (`pad_to`), their ratio and the final (last epoch's mean) losses of both
  (equal: the net reads each example's length, so padding changes nothing it learns).

    python benches/bench_control_flow.py --framework oxnet|mxnet|torch [--quick] [--cases a,b]

Prints one JSON line; `benches/run_side_by_side.sh benches/bench_control_flow.py` runs all three.
"""

import argparse
import importlib
import json
import os
import statistics
import sys
import time

import numpy as np

CASES = ["foreach", "fused_lstm", "bucketing"]
TINY_BATCH, TINY_WIDTH, TINY_HIDDEN = 1, 4, 4
LSTM_LAYERS, LSTM_HIDDEN, LSTM_STEPS, LSTM_BATCH, LSTM_INPUT = 2, 512, 35, 32, 512


def median_seconds(run, repeats):
    """Median wall time of `run()` over `repeats` calls after one warm-up call."""
    run()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ---------------------------------------------------------------- MXNet API (oxnet and MXNet)

def lstm_step(F, x, h, c, weights, hidden):
    """An LSTM step as Keras-MXNet writes it inside foreach: two FullyConnected and the gates."""
    i2h_weight, i2h_bias, h2h_weight, h2h_bias = weights
    gates = F.FullyConnected(x, i2h_weight, i2h_bias, num_hidden=4 * hidden) + \
        F.FullyConnected(h, h2h_weight, h2h_bias, num_hidden=4 * hidden)
    i, f, g, o = F.split(gates, num_outputs=4, axis=1)
    c = F.sigmoid(f) * c + F.sigmoid(i) * F.tanh(g)
    return F.sigmoid(o) * F.tanh(c), c


def tiny_lstm_arrays(mx, steps):
    rng = np.random.RandomState(0)
    shapes = {"data": (steps, TINY_BATCH, TINY_WIDTH), "h0": (TINY_BATCH, TINY_HIDDEN),
              "c0": (TINY_BATCH, TINY_HIDDEN), "i2h_weight": (4 * TINY_HIDDEN, TINY_WIDTH),
              "i2h_bias": (4 * TINY_HIDDEN,), "h2h_weight": (4 * TINY_HIDDEN, TINY_HIDDEN),
              "h2h_bias": (4 * TINY_HIDDEN,)}
    return {name: mx.nd.array(rng.uniform(-0.5, 0.5, shape)) for name, shape in shapes.items()}


def mx_foreach_symbolic(mx, steps, repeats):
    data, h0, c0 = mx.sym.var("data"), mx.sym.var("h0"), mx.sym.var("c0")
    weights = [mx.sym.var(n) for n in ("i2h_weight", "i2h_bias", "h2h_weight", "h2h_bias")]

    def step(x, states):
        h, c = lstm_step(mx.sym, x, states[0], states[1], weights, TINY_HIDDEN)
        return h, [h, c]

    outs, (h, c) = mx.sym.contrib.foreach(step, data, [h0, c0])
    loss = mx.sym.MakeLoss(mx.sym.sum(outs) + mx.sym.sum(h) + mx.sym.sum(c))
    args = tiny_lstm_arrays(mx, steps)
    grads = {name: mx.nd.zeros(a.shape) for name, a in args.items()}
    exe = loss.bind(mx.cpu(), args, args_grad=grads)

    def run():
        exe.forward(is_train=True)
        exe.backward()
        mx.nd.waitall()

    return median_seconds(run, repeats) / steps * 1e6


def mx_foreach_imperative(mx, steps, repeats):
    args = tiny_lstm_arrays(mx, steps)
    weights = [args[n] for n in ("i2h_weight", "i2h_bias", "h2h_weight", "h2h_bias")]
    for w in weights:
        w.attach_grad()

    def step(x, states):
        h, c = lstm_step(mx.nd, x, states[0], states[1], weights, TINY_HIDDEN)
        return h, [h, c]

    def run():
        with mx.autograd.record():
            outs, (h, c) = mx.nd.contrib.foreach(step, args["data"], [args["h0"], args["c0"]])
            loss = outs.sum() + h.sum() + c.sum()
        loss.backward()
        mx.nd.waitall()

    return median_seconds(run, repeats) / steps * 1e6


def mx_foreach(mx, quick):
    steps, repeats = (50, 5) if quick else (200, 11)
    return {"foreach_step_us": mx_foreach_symbolic(mx, steps, repeats),
            "foreach_imperative_step_us": mx_foreach_imperative(mx, steps, repeats)}


def mx_fused_lstm(mx, quick):
    rng = np.random.RandomState(0)
    x = mx.nd.array(rng.uniform(-1, 1, (LSTM_STEPS, LSTM_BATCH, LSTM_INPUT)))
    gates = 4 * LSTM_HIDDEN
    count = sum(gates * (width + LSTM_HIDDEN + 2)
                for width in [LSTM_INPUT] + [LSTM_HIDDEN] * (LSTM_LAYERS - 1))
    params = mx.nd.array(rng.uniform(-0.05, 0.05, (count,)))
    state = mx.nd.zeros((LSTM_LAYERS, LSTM_BATCH, LSTM_HIDDEN))
    cell = mx.nd.zeros((LSTM_LAYERS, LSTM_BATCH, LSTM_HIDDEN))
    for a in (x, params):
        a.attach_grad()

    def run():
        with mx.autograd.record():
            out = mx.nd.RNN(x, params, state, cell, mode="lstm", state_size=LSTM_HIDDEN,
                            num_layers=LSTM_LAYERS)
        out.backward()
        mx.nd.waitall()

    return median_seconds(run, 3 if quick else 9) * 1e3


def oxnet_bucketing(mx, quick):
    """Bucketed against padded-to-64 training of the digit-sum example, same data, seed and epochs."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
    import variable_length_sum as example
    from oxnet.gluon.contrib.data import BucketedBatches

    # The example's own settings (its --small ones with --quick).
    settings = argparse.Namespace(hidden=32, lr=0.005, epochs=8 if quick else 30, batch_size=16)
    rng = np.random.RandomState(0)
    sequences, sums = example.digit_sequences(2000 if quick else 10000, rng)
    bucketed = BucketedBatches(sequences, sums, batch_size=settings.batch_size, ratio=1.5, min_length=2, seed=0)
    # The same batches in the same order, each padded to the longest length.
    padded = BucketedBatches(sequences, sums, batch_size=settings.batch_size, ratio=1.5, min_length=2, seed=0,
                             pad_to=example.MAX_LENGTH)
    results = {}
    for name, batches in (("bucketed", bucketed), ("padded", padded)):
        _, seconds, loss = example.train(batches, settings, seed=0)
        results[name + "_epochs_per_s"] = settings.epochs / seconds
        results[name + "_final_loss"] = loss
    results["speedup"] = results["bucketed_epochs_per_s"] / results["padded_epochs_per_s"]
    results["padding_fraction"] = bucketed.stats()["padding_fraction"]
    return results


# ---------------------------------------------------------------- PyTorch

def torch_foreach(torch, quick):
    steps, repeats = (50, 5) if quick else (200, 11)
    torch.manual_seed(0)
    cell = torch.nn.LSTMCell(TINY_WIDTH, TINY_HIDDEN)
    data = torch.rand(steps, TINY_BATCH, TINY_WIDTH)

    def run():
        h = torch.zeros(TINY_BATCH, TINY_HIDDEN)
        c = torch.zeros(TINY_BATCH, TINY_HIDDEN)
        outs = []
        for t in range(steps):
            h, c = cell(data[t], (h, c))
            outs.append(h)
        (torch.stack(outs).sum() + h.sum() + c.sum()).backward()

    per_step = median_seconds(run, repeats) / steps * 1e6
    return {"foreach_step_us": per_step, "foreach_imperative_step_us": per_step}


def torch_fused_lstm(torch, quick):
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(LSTM_INPUT, LSTM_HIDDEN, num_layers=LSTM_LAYERS)
    x = torch.rand(LSTM_STEPS, LSTM_BATCH, LSTM_INPUT, requires_grad=True)

    def run():
        out, _ = lstm(x)
        out.sum().backward()

    return median_seconds(run, 3 if quick else 9) * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--framework", default="oxnet")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    fw = importlib.import_module(args.framework)
    if args.framework == "torch":
        fw.set_num_threads(2)
        table = {"foreach": torch_foreach, "fused_lstm": torch_fused_lstm}
    else:
        table = {"foreach": mx_foreach, "fused_lstm": mx_fused_lstm}
        if args.framework == "oxnet":
            table["bucketing"] = oxnet_bucketing
    res = {}
    for case in args.cases.split(","):
        if case not in table:
            continue
        value = table[case](fw, args.quick)
        if isinstance(value, dict) and case != "bucketing":
            res.update(value)
        else:
            res[{"fused_lstm": "fused_lstm_ms"}.get(case, case)] = value
    print(json.dumps({"framework": args.framework, "version": getattr(fw, "__version__", "?"), "results": res}))


if __name__ == "__main__":
    main()
