"""Programs run by test_dist_kvstore.py under mpirun: ``python dist_kvstore_worker.py SCENARIO OUTDIR``.

Each scenario checks what one rank can check and writes what the test compares to
``OUTDIR/<scenario>-rank<r>.npz``."""

import os
import sys
import time

import numpy as np

import oxnet as mx
from oxnet import autograd, gluon

GLOBAL_BATCH = 24
FEATURES = 10
CLASSES = 3
STEPS = 4


def global_batches(seed=7):
    """The whole job's data: STEPS batches of GLOBAL_BATCH examples."""
    rng = np.random.RandomState(seed)
    data = rng.uniform(-1, 1, (STEPS, GLOBAL_BATCH, FEATURES)).astype(np.float32)
    label = rng.randint(0, CLASSES, (STEPS, GLOBAL_BATCH)).astype(np.float32)
    return data, label


def make_net(seed):
    mx.random.seed(seed)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(16, activation="relu", in_units=FEATURES), gluon.nn.Dense(CLASSES, in_units=16))
    net.initialize(mx.init.Xavier())
    return net


def train_gluon(kvstore, update_on_kvstore, rank, num_workers, init_seed, optimizer="sgd"):
    """Train on this rank's share of every global batch; ``step`` normalises by the global batch."""
    net = make_net(init_seed)
    params = {"learning_rate": 0.5, "momentum": 0.9} if optimizer == "sgd" else {"learning_rate": 0.05}
    trainer = gluon.Trainer(net.collect_params(), optimizer, params, kvstore=kvstore,
                            update_on_kvstore=update_on_kvstore)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    data, label = global_batches()
    share = GLOBAL_BATCH // num_workers
    for step in range(STEPS):
        x = mx.nd.array(data[step, rank * share:(rank + 1) * share])
        y = mx.nd.array(label[step, rank * share:(rank + 1) * share])
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(GLOBAL_BATCH)
    return {name: p.data().asnumpy() for name, p in net.collect_params().items()}


def scenario_train(outdir, kv):
    """Gluon training with dist_sync, the store updating (True) or each rank updating (False),
    and the horovod store. As in MXNet, the Trainer broadcasts rank 0's parameters at the first
    step, after the first backward: every rank starts from the same seed."""
    results = {}
    for label, store, update_on_kvstore, optimizer in (("update_on_kvstore", "dist_sync", True, "sgd"),
                                                       ("local_update", "dist_sync", False, "adam"),
                                                       ("horovod", "horovod", None, "sgd")):
        params = train_gluon(store, update_on_kvstore, kv.rank, kv.num_workers, 100, optimizer)
        for name, value in params.items():
            results["%s/%s" % (label, name.split("_", 1)[-1])] = value
    np.savez(os.path.join(outdir, "train-rank%d.npz" % kv.rank), **results)


def scenario_module(outdir, kv):
    """Module.fit with dist_sync over this rank's part of the data."""
    data, label = global_batches()
    share = GLOBAL_BATCH // kv.num_workers
    x = data[:, kv.rank * share:(kv.rank + 1) * share].reshape(-1, FEATURES)
    y = label[:, kv.rank * share:(kv.rank + 1) * share].reshape(-1)
    it = mx.io.NDArrayIter(x, y, batch_size=share, label_name="softmax_label")
    sym = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(mx.sym.Variable("data"), num_hidden=CLASSES, name="fc"),
                               name="softmax")
    mod = mx.mod.Module(sym, context=mx.cpu())
    mx.random.seed(200 + kv.rank)
    mod.fit(it, num_epoch=1, kvstore=kv, optimizer="sgd", optimizer_params={"learning_rate": 0.5},
            initializer=mx.init.Xavier())
    args, _ = mod.get_params()
    np.savez(os.path.join(outdir, "module-rank%d.npz" % kv.rank), **{k: v.asnumpy() for k, v in args.items()})


def scenario_ops(outdir, kv):
    """The store's operations; results are checked here, against what every rank pushed."""
    rank, n = kv.rank, kv.num_workers
    ranks_sum = n * (n - 1) / 2
    assert kv.type == "dist_sync", kv.type
    # init and broadcast start every rank from rank 0's value.
    kv.init("w", mx.nd.full((3, 4), rank + 1.0))
    out = mx.nd.zeros((3, 4))
    kv.pull("w", out=out)
    assert (out.asnumpy() == 1).all(), out.asnumpy()
    got = mx.nd.zeros((5,))
    kv.broadcast("b", mx.nd.full((5,), 10.0 * rank + 2), out=got)
    assert (got.asnumpy() == 2).all(), got.asnumpy()
    # push sums over ranks and over this rank's devices.
    kv.push("w", [mx.nd.full((3, 4), rank, ctx=mx.cpu(0)), mx.nd.full((3, 4), 1.0, ctx=mx.cpu(1))])
    kv.pull("w", out=out)
    assert np.allclose(out.asnumpy(), ranks_sum + n), out.asnumpy()
    # Many small keys in one pushpull are fused into one bucket; each keeps its own sum.
    keys = ["k%d" % i for i in range(40)]
    kv.init(keys, [mx.nd.zeros((i + 1,)) for i in range(40)])
    values = [mx.nd.full((i + 1,), rank * 100 + i) for i in range(40)]
    kv.pushpull(keys, values)
    for i, v in enumerate(values):
        assert np.allclose(v.asnumpy(), ranks_sum * 100 + n * i), (i, v.asnumpy())
    # float16 and float64 are summed too.
    for dtype in ("float16", "float64", "int32"):
        kv.init("t" + dtype, mx.nd.zeros((7,), dtype=dtype))
        v = mx.nd.full((7,), rank + 1, dtype=dtype)
        kv.pushpull("t" + dtype, v)
        assert v.dtype == np.dtype(dtype) and (v.asnumpy() == n * (n + 1) / 2).all(), (dtype, v.asnumpy())
    # An updater runs on every rank with the summed value.
    kv._set_updater(lambda key, summed, stored: stored.__isub__(summed * 0.5))
    kv.init("u", mx.nd.ones((2,)))
    kv.push("u", mx.nd.full((2,), rank + 1.0))
    kv.pull("u", out=got[:2])
    assert np.allclose(got[:2].asnumpy(), 1 - 0.5 * n * (n + 1) / 2), got.asnumpy()
    # Barrier: nobody leaves before the slowest rank arrives.
    start = time.time()
    if rank == 0:
        time.sleep(0.5)
    kv.barrier()
    assert time.time() - start > 0.45, "barrier returned before rank 0 arrived"
    np.savez(os.path.join(outdir, "ops-rank%d.npz" % rank), ok=np.array(1))


def scenario_compression(outdir, kv):
    """2-bit compression with error feedback between workers, against a NumPy replay of it."""
    rank, n = kv.rank, kv.num_workers
    kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
    kv.init(0, mx.nd.zeros((37,)))
    rng = np.random.RandomState(3)
    grads = rng.uniform(-1, 1, (3, n, 37)).astype(np.float32)
    residuals = np.zeros((n, 37), dtype=np.float32)
    out = mx.nd.zeros((37,))
    for step in range(3):
        kv.push(0, mx.nd.array(grads[step, rank]))
        kv.pull(0, out=out)
        expected = np.zeros(37, dtype=np.float32)
        for r in range(n):
            residuals[r] += grads[step, r]
            sent = np.where(residuals[r] >= 0.5, 0.5, np.where(residuals[r] <= -0.5, -0.5, 0)).astype(np.float32)
            residuals[r] -= sent
            expected += sent
        assert np.array_equal(out.asnumpy(), expected), (step, out.asnumpy(), expected)
    np.savez(os.path.join(outdir, "compression-rank%d.npz" % rank), ok=np.array(1))


def scenario_fail(outdir, kv):
    """Rank 1 raises after the first collective; the others wait in the next one."""
    kv.init(0, mx.nd.zeros((10,)))
    if kv.rank == 1:
        raise ValueError("rank 1 failed on purpose")
    kv.push(0, mx.nd.ones((10,)))
    kv.barrier()
    time.sleep(120)


def scenario_checkpoint(outdir, kv):
    """Every rank asks for checkpoints under its own prefix: only rank 0's are written."""
    net = make_net(1)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore=kv)
    with autograd.record():
        loss = net(mx.nd.ones((2, FEATURES))).sum()
    loss.backward()
    trainer.step(2)
    prefix = os.path.join(outdir, "ckpt-rank%d" % kv.rank)
    trainer.save_states(prefix + ".states")
    sym = mx.sym.FullyConnected(mx.sym.Variable("data"), num_hidden=2, name="fc")
    mx.callback.do_checkpoint(prefix)(0, sym, {"fc_weight": mx.nd.ones((2, 3))}, {})
    local = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore="dist_sync",
                          update_on_kvstore=False)
    with autograd.record():
        loss = net(mx.nd.ones((2, FEATURES))).sum()
    loss.backward()
    local.step(2)
    local.save_states(prefix + ".local-states")


SCENARIOS = {name[len("scenario_"):]: f for name, f in globals().items() if name.startswith("scenario_")}

if __name__ == "__main__":
    scenario, outdir = sys.argv[1], sys.argv[2]
    SCENARIOS[scenario](outdir, mx.kv.create("dist_sync"))
