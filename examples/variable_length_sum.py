"""Learn the sum of a sequence of digits, for sequences of any length (2 to 64 digits, most of
them short): Embedding -> LSTM -> SequenceLast -> Dense, trained with automatic bucketing.

The task of Wolfram's post on variable-length sequences. Examples are grouped into buckets of
log-rounded length (gluon.contrib.data.BucketedBatches), padded only up to their bucket's length,
and the LSTM and SequenceLast read each example's true length, so the padding changes nothing
the net computes for an example: it only costs work, and bucketing keeps that work small. One
hybridized net serves every bucket with one set of parameters.

    python examples/variable_length_sum.py              # full run (well under a minute on 2 cores)
    python examples/variable_length_sum.py --small      # a quick smoke run
    python examples/variable_length_sum.py --compare    # also train padding every batch to 64
"""

import argparse
import time

import numpy as np

import oxnet as mx
from oxnet import autograd, gluon, nd
from oxnet.gluon import nn, rnn
from oxnet.gluon.contrib.data import BucketedBatches

MAX_LENGTH = 64
# Sums reach 9 * 64; the net regresses them scaled into a range its units handle well.
SCALE = 50.0


def digit_sequences(count, rng):
    """``count`` digit sequences with lengths log-uniform over 2..64 (skewed short), and their sums."""
    lengths = np.exp(rng.uniform(np.log(2), np.log(MAX_LENGTH + 1), size=count)).astype(int).clip(2, MAX_LENGTH)
    sequences = [rng.randint(0, 10, size=n) for n in lengths]
    return sequences, [float(s.sum()) for s in sequences]


class DigitSum(gluon.HybridBlock):
    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.embed = nn.Embedding(10, 16)
            self.lstm = rnn.LSTM(hidden, layout="NTC", use_sequence_length=True, input_size=16)
            self.out = nn.Dense(1)

    def hybrid_forward(self, F, digits, lengths):
        states = self.lstm.begin_state(batch_size=0, func=F.zeros) if F is mx.sym else \
            self.lstm.begin_state(batch_size=digits.shape[0], ctx=digits.context)
        steps, _ = self.lstm(self.embed(digits), states, lengths)
        last = F.SequenceLast(steps, lengths, use_sequence_length=True, axis=1)
        return F.reshape(self.out(last), shape=(-1,))


def train(batches, args, seed):
    mx.random.seed(seed)
    net = DigitSum(args.hidden)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": args.lr})
    loss_fn = gluon.loss.L2Loss()
    loss_fn.hybridize()
    start = time.perf_counter()
    for epoch in range(args.epochs):
        # Cosine decay: large steps first, then small ones that settle on the exact sums.
        trainer.set_learning_rate(args.lr * 0.5 * (1 + np.cos(np.pi * epoch / args.epochs)))
        total, count = 0.0, 0
        for batch in batches:
            with autograd.record():
                loss = loss_fn(net(batch.data, batch.lengths), batch.label / SCALE)
            loss.backward()
            trainer.step(batch.data.shape[0])
            total += float(loss.sum().asscalar())
            count += batch.data.shape[0]
        print("epoch %d  loss %.5f  (%.1f s)" % (epoch + 1, total / count, time.perf_counter() - start))
    return net, time.perf_counter() - start, total / count


def evaluate(net, sequences, sums):
    """Mean absolute error of the predicted sums, and the share exactly right once rounded."""
    test = BucketedBatches(sequences, sums, batch_size=256, shuffle=False)
    errors = []
    for batch in test:
        predicted = net(batch.data, batch.lengths).asnumpy() * SCALE
        errors.append(predicted - batch.label.asnumpy())
    errors = np.concatenate(errors)
    return float(np.abs(errors).mean()), float((np.abs(errors) < 0.5).mean())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-train", type=int, default=10000)
    parser.add_argument("--num-test", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.005)
    parser.add_argument("--ratio", type=float, default=1.5, help="growth factor of the bucket lengths")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--small", action="store_true", help="a quick run with little data (for tests)")
    parser.add_argument("--compare", action="store_true",
                        help="also train with every batch padded to the longest length, and compare")
    args = parser.parse_args()
    if args.small:
        args.num_train, args.num_test, args.epochs = 2000, 300, 8

    rng = np.random.RandomState(args.seed)
    train_x, train_y = digit_sequences(args.num_train, rng)
    test_x, test_y = digit_sequences(args.num_test, rng)
    batches = BucketedBatches(train_x, train_y, batch_size=args.batch_size, ratio=args.ratio, min_length=2,
                              seed=args.seed)
    net, seconds, final_loss = train(batches, args, args.seed)
    stats = batches.stats()
    mae, exact = evaluate(net, test_x, test_y)
    print("buckets used: %s" % " ".join("%d:%d" % item for item in stats["buckets"].items()))
    print("cached graphs (distinct batch shapes): %d" % stats["graphs"])
    print("padding: %.1f%% of the steps with buckets, %.1f%% padding every batch to %d"
          % (100 * stats["padding_fraction"], 100 * stats["padding_fraction_to_longest"], MAX_LENGTH))
    print("trained in %.1f s" % seconds)
    print("test mean absolute error of the sum: %.3f" % mae)
    print("test sums exactly right when rounded: %.1f%%" % (100 * exact))

    if args.compare:
        # The same batches in the same order, each padded to the longest length.
        padded = BucketedBatches(train_x, train_y, batch_size=args.batch_size, ratio=args.ratio, min_length=2,
                                 seed=args.seed, pad_to=MAX_LENGTH)
        _, padded_seconds, padded_loss = train(padded, args, args.seed)
        print("padded to %d: trained in %.1f s, final loss %.2e (bucketed: %.1f s, %.2e): bucketing %.2fx faster"
              % (MAX_LENGTH, padded_seconds, padded_loss, seconds, final_loss, padded_seconds / seconds))


if __name__ == "__main__":
    main()
