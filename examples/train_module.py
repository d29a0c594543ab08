"""Train a symbolic MLP on scikit-learn's handwritten digits with the Module API (MXNet 1.x's
classic training loop): NDArrayIter batches, Module.fit with a Speedometer and a checkpoint after
every epoch, then a second run that resumes from the last checkpoint with
mx.model.load_checkpoint and trains further.

    python examples/train_module.py [--epochs 4] [--resume-epochs 4] [--prefix model/digits_mlp]
"""

import argparse
import logging
import os

import numpy as np

import oxnet as mx


def load_digits(seed):
    from sklearn.datasets import load_digits as sklearn_digits

    digits = sklearn_digits()
    features = (digits.data / 16.0).astype(np.float32)  # (N, 64) in [0, 1]
    labels = digits.target.astype(np.float32)
    order = np.random.RandomState(seed).permutation(len(labels))
    split = int(0.8 * len(labels))
    return (features[order[:split]], labels[order[:split]]), (features[order[split:]], labels[order[split:]])


def mlp(num_hidden):
    data = mx.sym.Variable("data")
    hidden = mx.sym.Activation(mx.sym.FullyConnected(data, num_hidden=num_hidden, name="fc1"), act_type="relu",
                               name="relu1")
    hidden = mx.sym.Activation(mx.sym.FullyConnected(hidden, num_hidden=num_hidden, name="fc2"), act_type="relu",
                               name="relu2")
    return mx.sym.SoftmaxOutput(mx.sym.FullyConnected(hidden, num_hidden=10, name="fc3"), name="softmax")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=4, help="epochs of the first run")
    parser.add_argument("--resume-epochs", type=int, default=4, help="epochs trained after resuming")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--prefix", default=os.path.join("model", "digits_mlp"), help="checkpoint path prefix")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    mx.random.seed(args.seed)
    np.random.seed(args.seed)
    (train_x, train_y), (test_x, test_y) = load_digits(args.seed)
    train_iter = mx.io.NDArrayIter(train_x, train_y, batch_size=args.batch_size, shuffle=True,
                                   label_name="softmax_label")
    test_iter = mx.io.NDArrayIter(test_x, test_y, batch_size=args.batch_size, label_name="softmax_label")
    print("digits: %d training and %d test samples of 64 features" % (len(train_y), len(test_y)))
    os.makedirs(os.path.dirname(args.prefix) or ".", exist_ok=True)
    optimizer_params = {"learning_rate": args.lr, "momentum": 0.9}

    module = mx.mod.Module(mlp(args.hidden), context=mx.cpu())
    module.fit(train_iter, eval_data=test_iter, eval_metric="acc", optimizer="sgd",
               optimizer_params=optimizer_params, initializer=mx.init.Xavier(magnitude=2.0),
               num_epoch=args.epochs, batch_end_callback=mx.callback.Speedometer(args.batch_size, 20),
               epoch_end_callback=mx.callback.do_checkpoint(args.prefix))
    first_acc = module.score(test_iter, "acc")[0][1]
    print("first run: %d epochs, test accuracy %.4f" % (args.epochs, first_acc))

    # A new process would start here: everything comes from the checkpoint files.
    symbol, arg_params, aux_params = mx.model.load_checkpoint(args.prefix, args.epochs)
    reloaded = mx.mod.Module(symbol, context=mx.cpu())
    reloaded.bind(data_shapes=test_iter.provide_data, label_shapes=test_iter.provide_label, for_training=False)
    reloaded.set_params(arg_params, aux_params)
    print("checkpoint %s-%04d.params reloaded: test accuracy %.4f"
          % (args.prefix, args.epochs, reloaded.score(test_iter, "acc")[0][1]))

    resumed = mx.mod.Module(symbol, context=mx.cpu())
    resumed.fit(train_iter, eval_data=test_iter, eval_metric="acc", optimizer="sgd",
                optimizer_params=optimizer_params, arg_params=arg_params, aux_params=aux_params,
                begin_epoch=args.epochs, num_epoch=args.epochs + args.resume_epochs,
                batch_end_callback=mx.callback.Speedometer(args.batch_size, 20),
                epoch_end_callback=mx.callback.do_checkpoint(args.prefix))
    resumed_acc = resumed.score(test_iter, "acc")[0][1]
    print("resumed: %d more epochs, test accuracy %.4f" % (args.resume_epochs, resumed_acc))


if __name__ == "__main__":
    main()
