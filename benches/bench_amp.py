"""Mixed-precision training (mx.contrib.amp, bfloat16 on CPU) against float32: training steps per
second of an MLP (4 x 1024, batch 128, relu) and LeNet (batch 64, 28x28 inputs), hybridized, SGD,
for oxnet or MXNet 1.9.1.

- <net>_float32_steps_s: plain float32 training.
- <net>_bf16_amp_steps_s: the same after amp.init('bfloat16') with amp.init_trainer and
  amp.scale_loss (Convolution and FullyConnected run in bfloat16).

amp.init changes the process for good, so each precision runs in its own child process.

    python benches/bench_amp.py [--framework oxnet|mxnet]

Prints the CPU model (lscpu) and one JSON line.
"""

import argparse
import importlib
import json
import statistics
import subprocess
import sys
import time

import numpy as np

MLP_LAYERS, MLP_HIDDEN, MLP_BATCH, LENET_BATCH = 4, 1024, 128, 64
STEPS, WARMUP, REPEATS = 30, 5, 3


def mlp(nn):
    net = nn.HybridSequential()
    for _ in range(MLP_LAYERS):
        net.add(nn.Dense(MLP_HIDDEN, activation="relu"))
    net.add(nn.Dense(10))
    return net, (MLP_BATCH, 784)


def lenet(nn):
    net = nn.HybridSequential()
    net.add(nn.Conv2D(20, 5, activation="relu"), nn.MaxPool2D(2, 2), nn.Conv2D(50, 5, activation="relu"),
            nn.MaxPool2D(2, 2), nn.Flatten(), nn.Dense(500, activation="relu"), nn.Dense(10))
    return net, (LENET_BATCH, 1, 28, 28)


def steps_per_second(mx, build, use_amp):
    """Median over REPEATS runs of STEPS training steps (after WARMUP), in steps/s."""
    amp = importlib.import_module(mx.__name__ + ".contrib.amp")
    net, shape = build(mx.gluon.nn)
    net.initialize(mx.init.Xavier())
    net.hybridize(static_alloc=True, static_shape=True)
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01})
    if use_amp:
        amp.init_trainer(trainer)
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    rng = np.random.RandomState(0)
    data = mx.nd.array(rng.uniform(0, 1, shape))
    label = mx.nd.array(rng.randint(0, 10, shape[0]))

    def step():
        with mx.autograd.record():
            loss = loss_fn(net(data), label)
            if use_amp:
                with amp.scale_loss(loss, trainer) as scaled:
                    mx.autograd.backward(scaled)
            else:
                loss.backward()
        trainer.step(shape[0])
        loss.wait_to_read()

    for _ in range(WARMUP):
        step()
    mx.nd.waitall()
    rates = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        for _ in range(STEPS):
            step()
        mx.nd.waitall()
        rates.append(STEPS / (time.perf_counter() - start))
    return statistics.median(rates)


def child(framework, precision):
    mx = importlib.import_module(framework)
    use_amp = precision == "bf16_amp"
    if use_amp:
        importlib.import_module(framework + ".contrib.amp").init(target_dtype="bfloat16")
    return {"%s_%s_steps_s" % (name, precision): round(steps_per_second(mx, build, use_amp), 2)
            for name, build in (("mlp", mlp), ("lenet", lenet))}


def cpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    models = [line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")]
    return models[0] if models else "unknown"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--framework", default="oxnet", choices=["oxnet", "mxnet"])
    parser.add_argument("--precision", choices=["float32", "bf16_amp"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.precision:
        print(json.dumps(child(args.framework, args.precision)))
        return
    print("CPU: %s" % cpu_model())
    result = {"framework": args.framework}
    for precision in ("float32", "bf16_amp"):
        proc = subprocess.run([sys.executable, __file__, "--framework", args.framework, "--precision", precision],
                              capture_output=True, text=True, check=True)
        result.update(json.loads(proc.stdout.strip().splitlines()[-1]))
    for name in ("mlp", "lenet"):
        result["%s_bf16_amp_vs_float32" % name] = round(
            result["%s_bf16_amp_steps_s" % name] / result["%s_float32_steps_s" % name], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
