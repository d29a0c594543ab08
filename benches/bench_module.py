"""Side-by-side benchmark of the Module API and the data pipeline (issue 25) for oxnet, MXNet 1.9.1
and PyTorch:

- mlp_fit_samples_per_s: Module.fit on a symbolic MLP (784-256-256-10, batch 128) fed by
  NDArrayIter, with the accuracy metric; PyTorch: the same loop with nn.Sequential and SGD.
- tiny_step_us: one forward_backward + update of a tiny net (8 -> 2, batch 4), the per-batch
  Python overhead of the Module loop; PyTorch: forward, backward, step.
- bucketing_lstm_samples_per_s: BucketingModule.fit of an LSTM language model (vocabulary 2000,
  embedding and hidden 200, one layer) on BucketSentenceIter batches of 32 sentences of length
  5-40 in buckets of 10/20/30/40, the LSTM unrolled from mx.rnn.LSTMCell (as MXNet's bucketing
  example); PyTorch: nn.LSTM on the same bucketed batches.
- bucketing_fused_lstm_samples_per_s: the same with mx.rnn.FusedRNNCell (the fused RNN operator);
  PyTorch: the same nn.LSTM loop as above.
- imagerec_images_per_s: ImageRecordIter decoding 224x224 crops of 256-pixel JPEGs (resize,
  random crop, mirror, mean/std) with 2 preprocess threads; rss_growth_mb is the resident memory
  added between the second and the last epoch (flat memory: about 0).
- bucket_memory: BucketingModule memory once the largest bucket ran and after every bucket ran,
  beside the largest bucket's plan plus the parameters (the executor's arguments, their
  gradients and the Module's own copy of the parameters). oxnet: the bytes its pool's live
  arrays asked for (and, apart, as handed out by size class); both: resident memory growth.

    python benches/bench_module.py --framework oxnet|mxnet|torch [--quick] [--cases a,b]

Prints one JSON line; `benches/run_side_by_side.sh benches/bench_module.py` runs all three.
"""

import argparse
import importlib
import io
import json
import os
import statistics
import tempfile
import time

import numpy as np

CASES = ["mlp", "tiny", "bucketing", "bucketing_fused", "imagerec", "bucket_memory"]
VOCAB, EMBED, HIDDEN, LM_BATCH, BUCKETS = 2000, 200, 200, 32, [10, 20, 30, 40]


def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def sentences(count, seed=0):
    rng = np.random.RandomState(seed)
    return [list(rng.randint(1, VOCAB, size=rng.randint(5, 41))) for _ in range(count)]


# ---------------------------------------------------------------- MXNet API (oxnet and MXNet)

def mlp_symbol(mx):
    data = mx.sym.Variable("data")
    net = mx.sym.Activation(mx.sym.FullyConnected(data, num_hidden=256, name="fc1"), act_type="relu")
    net = mx.sym.Activation(mx.sym.FullyConnected(net, num_hidden=256, name="fc2"), act_type="relu")
    return mx.sym.SoftmaxOutput(mx.sym.FullyConnected(net, num_hidden=10, name="fc3"), name="softmax")


def mx_mlp(mx, quick):
    rng = np.random.RandomState(0)
    n = 128 * (16 if quick else 64)
    it = mx.io.NDArrayIter(rng.rand(n, 784).astype(np.float32), rng.randint(0, 10, n).astype(np.float32),
                           batch_size=128, label_name="softmax_label")
    mod = mx.mod.Module(mlp_symbol(mx), context=mx.cpu())
    mod.fit(it, num_epoch=1, optimizer_params={"learning_rate": 0.1})  # bind, init and warm up
    epochs = 2 if quick else 4
    t0 = time.perf_counter()
    mod.fit(it, begin_epoch=1, num_epoch=1 + epochs, optimizer_params={"learning_rate": 0.1},
            force_init=False)
    mx.nd.waitall()
    return n * epochs / (time.perf_counter() - t0)


def mx_tiny(mx, quick):
    data = mx.sym.Variable("data")
    net = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(data, num_hidden=2, name="fc"), name="softmax")
    mod = mx.mod.Module(net, context=mx.cpu())
    mod.bind(data_shapes=[("data", (4, 8))], label_shapes=[("softmax_label", (4,))])
    mod.init_params()
    mod.init_optimizer(optimizer_params={"learning_rate": 0.01})
    batch = mx.io.DataBatch([mx.nd.ones((4, 8))], [mx.nd.zeros((4,))])
    steps = 500 if quick else 3000

    def run(k):
        for _ in range(k):
            mod.forward_backward(batch)
            mod.update()
        mx.nd.waitall()

    run(50)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        run(steps)
        times.append((time.perf_counter() - t0) / steps * 1e6)
    return statistics.median(times)


def lm_sym_gen(mx, fused=False):
    if fused:
        cell = mx.rnn.FusedRNNCell(HIDDEN, num_layers=1, mode="lstm", prefix="lstm_")
    else:
        cell = mx.rnn.LSTMCell(num_hidden=HIDDEN, prefix="lstm_")

    def sym_gen(seq_len):
        data, label = mx.sym.Variable("data"), mx.sym.Variable("softmax_label")
        embed = mx.sym.Embedding(data=data, input_dim=VOCAB, output_dim=EMBED, name="embed")
        cell.reset()
        outputs, _ = cell.unroll(seq_len, inputs=embed, merge_outputs=True, layout="NTC")
        pred = mx.sym.FullyConnected(mx.sym.Reshape(outputs, shape=(-1, HIDDEN)), num_hidden=VOCAB, name="pred")
        loss = mx.sym.SoftmaxOutput(pred, mx.sym.Reshape(label, shape=(-1,)), name="softmax")
        return loss, ("data",), ("softmax_label",)

    return sym_gen


def mx_bucketing(mx, quick, fused=False):
    it = mx.rnn.BucketSentenceIter(sentences(LM_BATCH * (8 if quick else 24)), LM_BATCH, buckets=BUCKETS,
                                   invalid_label=0)
    mod = mx.mod.BucketingModule(lm_sym_gen(mx, fused), default_bucket_key=it.default_bucket_key, context=mx.cpu())
    metric = mx.metric.Perplexity(0)
    mod.fit(it, eval_metric=metric, num_epoch=1, optimizer_params={"learning_rate": 0.01})
    samples = sum(1 for _ in it) * LM_BATCH
    it.reset()
    epochs = 1 if quick else 2
    t0 = time.perf_counter()
    mod.fit(it, eval_metric=metric, begin_epoch=1, num_epoch=1 + epochs, optimizer_params={"learning_rate": 0.01})
    mx.nd.waitall()
    return samples * epochs / (time.perf_counter() - t0)


def make_rec(mx, directory, count):
    """``count`` JPEGs of 256 x 320 pixels (smooth gradients with noise, like photos compress)."""
    from PIL import Image
    rng = np.random.RandomState(0)
    path = os.path.join(directory, "bench.rec")
    writer = mx.recordio.MXRecordIO(path, "w")
    y, x = np.mgrid[0:256, 0:320]
    for i in range(count):
        base = np.stack([(x * (i % 7 + 1) + y) % 256, (y * 2 + i) % 256, (x + y * (i % 3 + 1)) % 256], axis=2)
        img = np.clip(base + rng.normal(0, 8, base.shape), 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG", quality=90)
        writer.write(mx.recordio.pack((0, float(i % 10), i, 0), buf.getvalue()))
    writer.close()
    return path


def mx_imagerec(mx, quick):
    with tempfile.TemporaryDirectory() as directory:
        count = 256 if quick else 1024
        path = make_rec(mx, directory, count)
        it = mx.io.ImageRecordIter(path_imgrec=path, data_shape=(3, 224, 224), batch_size=32, resize=256,
                                   rand_crop=True, rand_mirror=True, mean_r=123.68, mean_g=116.28, mean_b=103.53,
                                   std_r=58.4, std_g=57.1, std_b=57.4, preprocess_threads=2)
        epochs = 2 if quick else 4
        rates, rss = [], []
        for _ in range(epochs):
            t0 = time.perf_counter()
            images = 0
            for batch in it:
                batch.data[0].wait_to_read()
                images += 32 - batch.pad
            rates.append(images / (time.perf_counter() - t0))
            rss.append(rss_mb())
            it.reset()
        return {"images_per_s": statistics.median(rates[1:]), "rss_growth_mb": rss[-1] - rss[1]}


def mx_bucket_memory(mx, quick):
    oxnet_pool = getattr(getattr(mx, "_core", None), "cpu_pool_stats", None)

    def used():
        # Requested bytes are the sixth figure; older builds report only the size-class bytes.
        stats = oxnet_pool() if oxnet_pool else (0,)
        return stats[5] if len(stats) > 5 else stats[0]

    def used_by_class():
        return oxnet_pool()[0] if oxnet_pool else 0
    it = mx.rnn.BucketSentenceIter(sentences(LM_BATCH * 8), LM_BATCH, buckets=BUCKETS, invalid_label=0)
    mx.nd.waitall()
    used0, class0, rss0 = used(), used_by_class(), rss_mb()
    mod = mx.mod.BucketingModule(lm_sym_gen(mx), default_bucket_key=it.default_bucket_key, context=mx.cpu())
    mod.bind(it.provide_data, it.provide_label)
    mod.init_params()
    mod.init_optimizer(optimizer="sgd", optimizer_params={"learning_rate": 0.01})
    default_exec = mod._curr_module._exec_group.execs[0]
    arrays = list(default_exec.arg_arrays) + [g for g in default_exec.grad_arrays if g is not None] + \
        list(default_exec.aux_arrays)
    module = mod._curr_module
    arrays += list((module._arg_params or {}).values()) + list((module._aux_params or {}).values())
    params_bytes = sum(a.size * np.dtype(a.dtype).itemsize for a in arrays)
    batches = list(it)
    largest = [b for b in batches if b.bucket_key == it.default_bucket_key][0]
    mod.forward_backward(largest)
    mod.update()
    mx.nd.waitall()
    used_largest, rss_largest = used() - used0, rss_mb() - rss0
    for batch in batches:
        mod.forward_backward(batch)
        mod.update()
    mx.nd.waitall()
    res = {"buckets_run": len({b.bucket_key for b in batches}), "params_mb": params_bytes / 2**20,
           "rss_largest_bucket_mb": rss_largest, "rss_all_buckets_mb": rss_mb() - rss0}
    if hasattr(default_exec, "planned_bytes"):
        res["largest_plan_mb"] = default_exec.planned_bytes / 2**20
        res["largest_bucket_mb"] = used_largest / 2**20
        res["all_buckets_mb"] = (used() - used0) / 2**20
        res["all_buckets_by_size_class_mb"] = (used_by_class() - class0) / 2**20
        res["all_buckets_over_largest_plan_plus_params"] = (used() - used0) / (default_exec.planned_bytes + params_bytes)
    else:
        plan = [line for line in default_exec.debug_str().splitlines() if line.startswith("Total")]
        res["largest_plan_mb"] = float(plan[-1].split()[1]) if plan else float("nan")
    return res


# ---------------------------------------------------------------- PyTorch equivalents

def torch_mlp(torch, quick):
    nn = torch.nn
    rng = np.random.RandomState(0)
    n = 128 * (16 if quick else 64)
    x = torch.from_numpy(rng.rand(n, 784).astype(np.float32))
    y = torch.from_numpy(rng.randint(0, 10, n))
    net = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()

    def epoch():
        correct = 0
        for i in range(0, n, 128):
            out = net(x[i:i + 128])
            loss = loss_fn(out, y[i:i + 128])
            opt.zero_grad()
            loss.backward()
            opt.step()
            correct += int((out.argmax(1) == y[i:i + 128]).sum())
        return correct

    epoch()
    epochs = 2 if quick else 4
    t0 = time.perf_counter()
    for _ in range(epochs):
        epoch()
    return n * epochs / (time.perf_counter() - t0)


def torch_tiny(torch, quick):
    net = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    x, y = torch.ones(4, 8), torch.zeros(4, dtype=torch.long)
    steps = 500 if quick else 3000

    def run(k):
        for _ in range(k):
            loss = torch.nn.functional.cross_entropy(net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()

    run(50)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        run(steps)
        times.append((time.perf_counter() - t0) / steps * 1e6)
    return statistics.median(times)


def torch_bucketing(torch, quick):
    nn = torch.nn

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, EMBED)
            self.lstm = nn.LSTM(EMBED, HIDDEN, batch_first=True)
            self.decoder = nn.Linear(HIDDEN, VOCAB)

        def forward(self, x):
            return self.decoder(self.lstm(self.embed(x))[0])

    # The same bucketing as BucketSentenceIter: pad each sentence to its bucket, batch within a bucket.
    by_bucket = {b: [] for b in BUCKETS}
    for s in sentences(LM_BATCH * (8 if quick else 24)):
        bucket = min(b for b in BUCKETS if b >= len(s))
        by_bucket[bucket].append(s + [0] * (bucket - len(s)))
    batches = []
    for bucket, rows in by_bucket.items():
        for i in range(0, len(rows) - LM_BATCH + 1, LM_BATCH):
            data = torch.tensor(rows[i:i + LM_BATCH])
            batches.append((data, torch.cat([data[:, 1:], torch.zeros(LM_BATCH, 1, dtype=data.dtype)], 1)))
    net = LM()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss(ignore_index=0)

    def epoch():
        for data, label in batches:
            loss = loss_fn(net(data).reshape(-1, VOCAB), label.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            float(loss)

    epoch()
    epochs = 1 if quick else 2
    t0 = time.perf_counter()
    for _ in range(epochs):
        epoch()
    return len(batches) * LM_BATCH * epochs / (time.perf_counter() - t0)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--framework", default="oxnet")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    fw = importlib.import_module(args.framework)
    cases = args.cases.split(",")
    res = {}
    if args.framework == "torch":
        fw.set_num_threads(2)
        table = {"mlp": torch_mlp, "tiny": torch_tiny, "bucketing": torch_bucketing}
    else:
        table = {"mlp": mx_mlp, "tiny": mx_tiny, "bucketing": mx_bucketing,
                 "bucketing_fused": lambda mx, quick: mx_bucketing(mx, quick, fused=True), "imagerec": mx_imagerec,
                 "bucket_memory": mx_bucket_memory}
    names = {"mlp": "mlp_fit_samples_per_s", "tiny": "tiny_step_us", "bucketing": "bucketing_lstm_samples_per_s",
             "bucketing_fused": "bucketing_fused_lstm_samples_per_s", "imagerec": "imagerec",
             "bucket_memory": "bucket_memory"}
    for case in cases:
        if case in table:
            res[names[case]] = table[case](fw, args.quick)
    print(json.dumps({"framework": args.framework, "version": getattr(fw, "__version__", "?"), "results": res}))


if __name__ == "__main__":
    main()
