"""Side-by-side benchmark of the neural-network operators: LeNet forward+backward and a
ResNet-style block forward+backward, imperatively with autograd, for oxnet, MXNet 1.9.1 and
PyTorch (eager).

    python benches/bench_nn_ops.py --framework oxnet|mxnet|torch [--quick]

Prints one JSON line of samples/s; `benches/run_side_by_side.sh benches/bench_nn_ops.py` runs all
three frameworks and prints the table.
"""
import numpy as np

from bench_foundation import bench_main, timeit

LENET_BATCH = 64
BLOCK_BATCH, BLOCK_CHANNELS, BLOCK_SIDE = 16, 64, 16


def lenet_params(rng):
    return {
        "c1w": rng.randn(20, 1, 5, 5) * 0.1, "c1b": np.zeros(20),
        "c2w": rng.randn(50, 20, 5, 5) * 0.05, "c2b": np.zeros(50),
        "f1w": rng.randn(500, 800) * 0.03, "f1b": np.zeros(500),
        "f2w": rng.randn(10, 500) * 0.05, "f2b": np.zeros(10),
    }


def block_params(rng):
    c = BLOCK_CHANNELS
    return {"w1": rng.randn(c, c, 3, 3) * 0.05, "w2": rng.randn(c, c, 3, 3) * 0.05,
            "g1": np.ones(c), "b1": np.zeros(c), "g2": np.ones(c), "b2": np.zeros(c)}


def mx_like(mx, quick):
    nd, autograd = mx.nd, mx.autograd
    reps = 3 if quick else 7
    rng = np.random.RandomState(0)
    res = {}

    p = {k: nd.array(v) for k, v in lenet_params(rng).items()}
    for v in p.values():
        v.attach_grad()
    x = nd.array(rng.rand(LENET_BATCH, 1, 28, 28))
    y = nd.array(rng.randint(0, 10, size=LENET_BATCH))

    def lenet_step():
        with autograd.record():
            h = nd.Activation(nd.Convolution(x, p["c1w"], p["c1b"], kernel=(5, 5), num_filter=20), act_type="tanh")
            h = nd.Pooling(h, kernel=(2, 2), stride=(2, 2), pool_type="max")
            h = nd.Activation(nd.Convolution(h, p["c2w"], p["c2b"], kernel=(5, 5), num_filter=50), act_type="tanh")
            h = nd.Pooling(h, kernel=(2, 2), stride=(2, 2), pool_type="max")
            h = nd.Activation(nd.FullyConnected(h, p["f1w"], p["f1b"], num_hidden=500), act_type="tanh")
            out = nd.SoftmaxOutput(nd.FullyConnected(h, p["f2w"], p["f2b"], num_hidden=10), y)
        out.backward()
        for v in p.values():
            nd.sgd_update(v, v.grad, lr=0.01, out=v)
    res["lenet_b64_train_samples_per_s"] = LENET_BATCH / timeit(lenet_step, nd.waitall, reps, 2)

    q = {k: nd.array(v) for k, v in block_params(rng).items()}
    for v in q.values():
        v.attach_grad()
    stats = [nd.zeros(BLOCK_CHANNELS), nd.ones(BLOCK_CHANNELS), nd.zeros(BLOCK_CHANNELS), nd.ones(BLOCK_CHANNELS)]
    xb = nd.array(rng.randn(BLOCK_BATCH, BLOCK_CHANNELS, BLOCK_SIDE, BLOCK_SIDE))

    def block_step():
        with autograd.record():
            h = nd.Convolution(xb, q["w1"], kernel=(3, 3), pad=(1, 1), num_filter=BLOCK_CHANNELS, no_bias=True)
            h = nd.relu(nd.BatchNorm(h, q["g1"], q["b1"], stats[0], stats[1], fix_gamma=False))
            h = nd.Convolution(h, q["w2"], kernel=(3, 3), pad=(1, 1), num_filter=BLOCK_CHANNELS, no_bias=True)
            h = nd.BatchNorm(h, q["g2"], q["b2"], stats[2], stats[3], fix_gamma=False)
            out = nd.relu(h + xb).sum()
        out.backward()
    res["resblock_b16_c64_16x16_train_samples_per_s"] = BLOCK_BATCH / timeit(block_step, nd.waitall, reps, 2)
    return res


def torch_like(torch, quick):
    F = torch.nn.functional
    reps = 3 if quick else 7
    rng = np.random.RandomState(0)
    res = {}
    t = lambda v: torch.tensor(v, dtype=torch.float32, requires_grad=True)  # noqa: E731
    p = {k: t(v) for k, v in lenet_params(rng).items()}
    x = torch.tensor(rng.rand(LENET_BATCH, 1, 28, 28), dtype=torch.float32)
    y = torch.tensor(rng.randint(0, 10, size=LENET_BATCH))

    def lenet_step():
        h = torch.tanh(F.conv2d(x, p["c1w"], p["c1b"]))
        h = F.max_pool2d(h, 2, 2)
        h = torch.tanh(F.conv2d(h, p["c2w"], p["c2b"]))
        h = F.max_pool2d(h, 2, 2)
        h = torch.tanh(F.linear(h.flatten(1), p["f1w"], p["f1b"]))
        loss = F.cross_entropy(F.linear(h, p["f2w"], p["f2b"]), y)
        loss.backward()
        with torch.no_grad():
            for v in p.values():
                v -= 0.01 * v.grad
                v.grad = None
    res["lenet_b64_train_samples_per_s"] = LENET_BATCH / timeit(lenet_step, lambda: None, reps, 2)

    q = {k: t(v) for k, v in block_params(rng).items()}
    stats = [torch.zeros(BLOCK_CHANNELS), torch.ones(BLOCK_CHANNELS), torch.zeros(BLOCK_CHANNELS), torch.ones(BLOCK_CHANNELS)]
    xb = torch.tensor(rng.randn(BLOCK_BATCH, BLOCK_CHANNELS, BLOCK_SIDE, BLOCK_SIDE), dtype=torch.float32)

    def block_step():
        h = F.conv2d(xb, q["w1"], padding=1)
        h = F.relu(F.batch_norm(h, stats[0], stats[1], q["g1"], q["b1"], training=True))
        h = F.conv2d(h, q["w2"], padding=1)
        h = F.batch_norm(h, stats[2], stats[3], q["g2"], q["b2"], training=True)
        F.relu(h + xb).sum().backward()
        for v in q.values():
            v.grad = None
    res["resblock_b16_c64_16x16_train_samples_per_s"] = BLOCK_BATCH / timeit(block_step, lambda: None, reps, 2)
    return res


if __name__ == "__main__":
    bench_main(mx_like, torch_like)
