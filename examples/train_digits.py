"""Train a small CNN on the handwritten digits scikit-learn ships (8x8 images, 10 classes), export
it, reload the exported files with SymbolBlock.imports and check the reloaded model predicts the
same. Runs in well under a minute on 2 CPU cores.

    python examples/train_digits.py [--epochs 15] [--out model/digits]

Besides the exported model (OUT-symbol.json, OUT-0000.params) it saves the test split as
OUT-test.params (arrays "data" and "label"), which the Rust example predict_digits.rs evaluates
with no Python: cargo run --release --example predict_digits
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
                nn.BatchNorm(),
                nn.MaxPool2D(pool_size=2),
                nn.Conv2D(64, kernel_size=3, padding=1, activation="relu"),
                nn.MaxPool2D(pool_size=2),
                nn.Flatten(),
                nn.Dense(128, activation="relu"),
                nn.Dropout(0.2),
                nn.Dense(10))
    return net


def progress(epoch, epochs, done, total, loss, start, width=30):
    if not sys.stdout.isatty() and done < total:
        return  # a log file gets one line per epoch
    filled = int(width * done / total)
    bar = "#" * filled + "-" * (width - filled)
    sys.stdout.write("\repoch %2d/%d [%s] %3d/%d  loss %.4f  %.1fs"
                     % (epoch, epochs, bar, done, total, loss, time.time() - start))
    sys.stdout.flush()


def evaluate(net, loader):
    metric = mx.metric.Accuracy()
    for data, label in loader:
        metric.update([label], [net(data)])
    return metric.get()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.002)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", default=os.path.join("model", "digits"), help="export path prefix")
    args = parser.parse_args()

    mx.random.seed(args.seed)
    np.random.seed(args.seed)
    (train_x, train_y), (test_x, test_y) = load_digits(args.seed)
    train_data = gluon.data.DataLoader(gluon.data.ArrayDataset(mx.nd.array(train_x), mx.nd.array(train_y)),
                                       batch_size=args.batch_size, shuffle=True)
    test_data = gluon.data.DataLoader(gluon.data.ArrayDataset(mx.nd.array(test_x), mx.nd.array(test_y)),
                                      batch_size=256)
    print("digits: %d training and %d test images of 8x8 pixels" % (len(train_y), len(test_y)))

    net = build_net()
    net.initialize(mx.init.Xavier(magnitude=2.24))
    net.hybridize()
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": args.lr})

    start = time.time()
    for epoch in range(1, args.epochs + 1):
        train_acc = mx.metric.Accuracy()
        total_loss, seen = 0.0, 0
        for i, (data, label) in enumerate(train_data):
            with autograd.record():
                output = net(data)
                loss = loss_fn(output, label)
            loss.backward()
            trainer.step(data.shape[0])
            total_loss += loss.sum().asscalar()
            seen += data.shape[0]
            train_acc.update([label], [output])
            progress(epoch, args.epochs, i + 1, len(train_data), total_loss / seen, start)
        test_acc = evaluate(net, test_data)
        print("  train acc %.4f  test acc %.4f" % (train_acc.get()[1], test_acc))
    elapsed = time.time() - start
    print("trained %d epochs in %.1fs; test accuracy %.4f" % (args.epochs, elapsed, test_acc))

    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    sym_file, params_file = net.export(args.out)
    test_file = args.out + "-test.params"
    mx.nd.save(test_file, {"data": mx.nd.array(test_x), "label": mx.nd.array(test_y)})
    print("exported %s and %s, test split in %s" % (sym_file, params_file, test_file))

    reloaded = gluon.SymbolBlock.imports(sym_file, ["data"], params_file)
    sample = mx.nd.array(test_x)
    expected = net(sample).asnumpy()
    got = reloaded(sample).asnumpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    agree = (got.argmax(1) == expected.argmax(1)).mean()
    reloaded_acc = (got.argmax(1) == test_y).mean()
    print("reloaded model: predictions agree on %.1f%% of the test set, accuracy %.4f" % (100 * agree, reloaded_acc))
    if test_acc < 0.97:
        sys.exit("test accuracy %.4f is below the 97%% target" % test_acc)


if __name__ == "__main__":
    main()
