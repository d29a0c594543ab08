"""Data-parallel training of the digits CNN (scikit-learn's 8x8 handwritten digits) over N MPI
ranks with the 'dist_sync' kvstore: each rank reads its own part of every epoch's data, the
gradients are summed over the ranks (allreduce on the engine, overlapping the backward pass)
and every rank applies the same update, so all ranks hold the same model.

    python -m oxnet.launch -n 2 examples/train_distributed.py [--epochs 10]
    mpirun -n 4 python examples/train_distributed.py          # the same, with mpirun itself
    python -m oxnet.launch -n 8 -H node1:4,node2:4 --interface eth0 examples/train_distributed.py

Needs MPI: pip install 'oxnet[dist]' (mpi4py and Open MPI). Rank 0 evaluates, prints and writes
the checkpoint; the per-rank batch is --batch-size / N, so the global batch and the learning
rate do not depend on N.
"""

import argparse
import os
import sys
import time

import numpy as np

import oxnet as mx
from oxnet import autograd, gluon
from oxnet.gluon import nn


def load_digits(seed):
    from sklearn.datasets import load_digits as sklearn_digits

    digits = sklearn_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None, :, :]  # (N, 1, 8, 8) in [0, 1]
    labels = digits.target.astype(np.float32)
    order = np.random.RandomState(seed).permutation(len(labels))
    split = int(0.8 * len(labels))
    train, test = order[:split], order[split:]
    return (images[train], labels[train]), (images[test], labels[test])


def build_net():
    net = nn.HybridSequential(prefix="digits_")
    with net.name_scope():
        net.add(nn.Conv2D(32, kernel_size=3, padding=1, activation="relu"),
                nn.MaxPool2D(pool_size=2),
                nn.Conv2D(64, kernel_size=3, padding=1, activation="relu"),
                nn.MaxPool2D(pool_size=2),
                nn.Flatten(),
                nn.Dense(128, activation="relu"),
                nn.Dense(10))
    return net


def evaluate(net, data, label):
    metric = mx.metric.Accuracy()
    metric.update([mx.nd.array(label)], [net(mx.nd.array(data))])
    return metric.get()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch, split over the ranks")
    parser.add_argument("--lr", type=float, default=0.002)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--kvstore", default="dist_sync")
    parser.add_argument("--out", default=os.path.join("model", "digits-dist"), help="checkpoint prefix (rank 0)")
    args = parser.parse_args()

    kv = mx.kv.create(args.kvstore)
    rank, workers = kv.rank, kv.num_workers
    if args.batch_size % workers:
        sys.exit("--batch-size %d must be a multiple of the %d ranks" % (args.batch_size, workers))
    local_batch = args.batch_size // workers

    # The same seed on every rank: the Trainer broadcasts rank 0's parameters at its first step,
    # after the first backward pass, which should therefore start from the same values.
    mx.random.seed(args.seed)
    (train_x, train_y), (test_x, test_y) = load_digits(args.seed)
    dataset = gluon.data.ArrayDataset(mx.nd.array(train_x), mx.nd.array(train_y))
    np.random.seed(args.seed + rank)
    sampler = gluon.data.SplitSampler(len(dataset), num_parts=workers, part_index=rank, shuffle=True)
    train_data = gluon.data.DataLoader(dataset, batch_size=local_batch, sampler=sampler, last_batch="discard")
    if rank == 0:
        print("digits on %d rank(s): %d training images, %d per rank, global batch %d"
              % (workers, len(train_y), len(sampler), args.batch_size))

    net = build_net()
    net.initialize(mx.init.Xavier(magnitude=2.24))
    net.hybridize()
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": args.lr}, kvstore=kv)

    start = time.time()
    for epoch in range(1, args.epochs + 1):
        total_loss, seen = 0.0, 0
        for data, label in train_data:
            with autograd.record():
                loss = loss_fn(net(data), label)
            loss.backward()
            # Gradients are summed over the ranks: normalise by the global batch.
            trainer.step(args.batch_size)
            total_loss += loss.sum().asscalar()
            seen += data.shape[0]
        if rank == 0:
            print("epoch %2d  rank-0 loss %.4f  test acc %.4f  %.1fs"
                  % (epoch, total_loss / seen, evaluate(net, test_x, test_y), time.time() - start))

    test_acc = evaluate(net, test_x, test_y)
    # Every rank holds the same parameters: one copy on disk is enough.
    if rank == 0:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        net.save_parameters(args.out + ".params")
        print("trained %d epochs on %d rank(s) in %.1fs; test accuracy %.4f; saved %s.params"
              % (args.epochs, workers, time.time() - start, test_acc, args.out))
    kv.barrier()
    if test_acc < 0.95:
        sys.exit("rank %d: test accuracy %.4f is below the 95%% target" % (rank, test_acc))


if __name__ == "__main__":
    main()
