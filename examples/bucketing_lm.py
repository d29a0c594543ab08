"""A character-level LSTM language model trained with BucketingModule (MXNet 1.x's way of
training on sequences of different lengths: one executor per length bucket, all sharing one set of
parameters and memory) and BucketSentenceIter.

The text is the docstrings of Python's standard library, cut into sentences of 10-60
characters: it ships with every Python, so nothing is downloaded. Prints the training and
validation perplexity per epoch.

    python examples/bucketing_lm.py [--epochs 6] [--num-sentences 5000]
"""

import argparse
import importlib
import logging
import time

import numpy as np

import oxnet as mx

MODULES = ["argparse", "collections", "json", "os", "re", "string", "textwrap", "unittest", "logging", "random",
           "functools", "itertools", "pathlib", "subprocess", "threading", "datetime", "decimal", "fractions",
           "statistics", "csv", "inspect", "pickle", "shutil", "tempfile", "zipfile", "heapq", "bisect",
           "contextlib", "dataclasses", "enum", "io", "struct", "socket", "sqlite3", "math", "email.message",
           "http.client", "urllib.parse", "calendar", "difflib", "configparser", "tarfile", "gzip", "queue"]


def stdlib_sentences(count, seed):
    """``count`` pieces of 10-60 characters of standard-library docstrings, cut at spaces."""
    docs = []
    for name in MODULES:
        module = importlib.import_module(name)
        docs.append(module.__doc__ or "")
        for attr in sorted(vars(module)):
            obj = getattr(module, attr)
            if getattr(obj, "__module__", None) == module.__name__ and isinstance(obj.__doc__, str):
                docs.append(obj.__doc__)
    words = " ".join(" ".join(doc.split()) for doc in docs).split(" ")
    rng = np.random.RandomState(seed)
    sentences, current = [], ""
    target = rng.randint(10, 61)
    for word in words:
        candidate = (current + " " + word) if current else word
        if len(candidate) > target:
            if len(current) >= 10:
                sentences.append(current)
                if len(sentences) == count:
                    break
            current, target = (word if len(word) <= 60 else ""), rng.randint(10, 61)
        else:
            current = candidate
    return sentences


def build_sym_gen(vocab_size, num_embed, num_hidden, num_layers):
    stack = mx.rnn.SequentialRNNCell()
    for layer in range(num_layers):
        stack.add(mx.rnn.LSTMCell(num_hidden=num_hidden, prefix="lstm_l%d_" % layer))

    def sym_gen(seq_len):
        data = mx.sym.Variable("data")
        label = mx.sym.Variable("softmax_label")
        embed = mx.sym.Embedding(data=data, input_dim=vocab_size, output_dim=num_embed, name="embed")
        stack.reset()
        outputs, _ = stack.unroll(seq_len, inputs=embed, merge_outputs=True)
        pred = mx.sym.FullyConnected(mx.sym.Reshape(outputs, shape=(-1, num_hidden)), num_hidden=vocab_size,
                                     name="pred")
        loss = mx.sym.SoftmaxOutput(data=pred, label=mx.sym.Reshape(label, shape=(-1,)), name="softmax")
        return loss, ("data",), ("softmax_label",)

    return sym_gen


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--num-sentences", type=int, default=5000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--num-hidden", type=int, default=128)
    parser.add_argument("--num-embed", type=int, default=32)
    parser.add_argument("--num-layers", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    mx.random.seed(args.seed)
    np.random.seed(args.seed)

    sentences = [list(s) for s in stdlib_sentences(args.num_sentences, args.seed)]
    invalid_label = 0
    encoded, vocab = mx.rnn.encode_sentences(sentences, invalid_label=invalid_label, start_label=1)
    split = int(0.9 * len(encoded))
    buckets = [10, 20, 30, 40, 50, 60]
    train_iter = mx.rnn.BucketSentenceIter(encoded[:split], args.batch_size, buckets=buckets,
                                           invalid_label=invalid_label)
    val_iter = mx.rnn.BucketSentenceIter(encoded[split:], args.batch_size, buckets=buckets,
                                         invalid_label=invalid_label)
    print("%d sentences of standard-library docstrings, %d distinct characters, buckets %s"
          % (len(encoded), len(vocab), buckets))

    model = mx.mod.BucketingModule(build_sym_gen(len(vocab) + 1, args.num_embed, args.num_hidden, args.num_layers),
                                   default_bucket_key=train_iter.default_bucket_key, context=mx.cpu())
    metric = mx.metric.Perplexity(invalid_label)
    start = time.time()

    def report(epoch, symbol, arg_params, aux_params):
        print("epoch %d: validation perplexity %.3f (%.1fs)"
              % (epoch + 1, model.score(val_iter, metric)[0][1], time.time() - start))

    model.fit(train_iter, eval_metric=metric, optimizer="adam", optimizer_params={"learning_rate": args.lr},
              initializer=mx.init.Xavier(factor_type="in", magnitude=2.34), num_epoch=args.epochs,
              batch_end_callback=mx.callback.Speedometer(args.batch_size, 50), epoch_end_callback=report)


if __name__ == "__main__":
    main()
