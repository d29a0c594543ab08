"""gluon.contrib: the Estimator training loop with its event handlers, and the contrib layers
checked against NumPy."""

import logging
import os
import warnings

import numpy as np
import pytest

import oxnet as mx
from oxnet import gluon
from oxnet.gluon import nn
from oxnet.gluon.contrib import data as contrib_data
from oxnet.gluon.contrib.estimator import (BatchEnd, CheckpointHandler, EarlyStoppingHandler, EpochBegin, EpochEnd,
                                           Estimator, LoggingHandler, MetricHandler, ValidationHandler)
from oxnet.gluon.contrib.nn import (Concurrent, HybridConcurrent, Identity, PixelShuffle1D, PixelShuffle2D,
                                    PixelShuffle3D, SparseEmbedding, SyncBatchNorm)


def _classification_loader(num_samples=24, batch_size=8):
    rng = np.random.RandomState(0)
    features = rng.normal(size=(num_samples, 5)).astype("float32")
    labels = (features[:, 0] > 0).astype("float32")
    dataset = gluon.data.ArrayDataset(mx.nd.array(features), mx.nd.array(labels))
    return gluon.data.DataLoader(dataset, batch_size=batch_size)


def _quiet_estimator(net, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = Estimator(net, loss=gluon.loss.SoftmaxCrossEntropyLoss(), **kwargs)
    est.logger.setLevel(logging.WARNING)
    return est


def test_estimator_fit_trains_and_reports_metrics():
    mx.random.seed(0)
    net = nn.HybridSequential()
    net.add(nn.Dense(16, activation="relu", in_units=5), nn.Dense(2, in_units=16))
    net.initialize(mx.init.Xavier())
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.5})
    est = _quiet_estimator(net, trainer=trainer)
    # Default metrics for softmax cross-entropy: accuracy and the loss itself, renamed.
    assert [m.name for m in est.train_metrics] == ["training accuracy", "training softmaxcrossentropyloss"]
    assert [m.name for m in est.val_metrics] == ["validation accuracy", "validation softmaxcrossentropyloss"]

    loader = _classification_loader()
    first_weight = net[0].weight.data().asnumpy().copy()
    est.fit(loader, val_data=loader, epochs=30)
    assert not np.allclose(first_weight, net[0].weight.data().asnumpy())
    assert est.train_metrics[0].get()[1] > 0.9
    assert est.val_metrics[0].get()[1] > 0.9
    # The validation loss metric averages the per-sample losses of the last evaluation.
    assert 0 < est.val_metrics[1].get()[1] < 0.5


def test_estimator_rejects_bad_arguments():
    net = nn.Dense(2)
    with pytest.raises(ValueError):
        Estimator(net, loss="mse")
    with pytest.raises(ValueError):
        Estimator(net, loss=gluon.loss.L2Loss(), train_metrics="acc")
    with pytest.raises(ValueError):
        Estimator(net, loss=gluon.loss.L2Loss(), trainer="sgd")
    with pytest.raises(ValueError):
        Estimator(net, loss=gluon.loss.L2Loss(), context="cpu")
    est = _quiet_estimator(net)
    with pytest.raises(ValueError):
        est.fit([mx.nd.ones((4, 5))], epochs=1)
    with pytest.raises(ValueError):
        est.fit(_classification_loader(), epochs=1, batches=2)


def test_fit_by_batches_with_checkpoints_and_resume(tmp_path):
    net = nn.HybridSequential()
    net.add(nn.Dense(2))
    net.hybridize()
    est = _quiet_estimator(net)
    loader = _classification_loader()  # 3 batches per epoch
    checkpoints = CheckpointHandler(str(tmp_path), model_prefix="run", epoch_period=None, batch_period=2,
                                    max_checkpoints=2)
    est.fit(loader, event_handlers=[checkpoints], batches=7)
    assert (checkpoints.current_epoch, checkpoints.current_batch) == (3, 7)
    # Saved after batches 2, 4 and 6 (indices 1, 3, 5); only the newest two are kept.
    assert sorted(os.listdir(tmp_path)) == ["run-epoch1batch3.params", "run-epoch1batch3.states",
                                             "run-epoch1batch5.params", "run-epoch1batch5.states",
                                             "run-symbol.json"]

    saved_weight = mx.nd.load(str(tmp_path / "run-epoch1batch5.params"))["0.weight"].asnumpy()
    resumed = CheckpointHandler(str(tmp_path), model_prefix="run", epoch_period=None, batch_period=2,
                                max_checkpoints=2, resume_from_checkpoint=True)
    net[0].weight.set_data(mx.nd.zeros_like(net[0].weight.data()))

    class RecordWeightAtEpochBegin(EpochBegin):
        def __init__(self):
            self.weights = []

        def epoch_begin(self, estimator, *args, **kwargs):
            self.weights.append(estimator.net[0].weight.data().asnumpy().copy())

    recorder = RecordWeightAtEpochBegin()
    est.fit(loader, event_handlers=[resumed, recorder], batches=10)
    np.testing.assert_array_equal(recorder.weights[0], saved_weight)
    # 6 batches were done, 4 remain. The resumed run is a new pass over the data (epoch 2) and
    # continues the epoch and batch numbering; the checkpoints found on disk count towards max_checkpoints.
    assert est.max_batch == 4 and resumed.current_batch == 4
    assert sorted(f for f in os.listdir(tmp_path) if f.endswith(".params")) == [
        "run-epoch2batch7.params", "run-epoch3batch9.params"]


def test_save_best_and_early_stopping(tmp_path):
    net = nn.Dense(2)
    est = _quiet_estimator(net)
    accuracy = est.train_metrics[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        best = CheckpointHandler(str(tmp_path), monitor=accuracy, save_best=True)
    stopper = EarlyStoppingHandler(monitor=accuracy, patience=0, mode="min", baseline=-1.0)
    est.fit(_classification_loader(), event_handlers=[best, stopper], epochs=5)
    # With baseline -1 nothing is ever smaller, so training stops after the first epoch.
    assert stopper.current_epoch == 1 and stopper.stopped_epoch == 0
    assert os.path.isfile(tmp_path / "model-best.params")
    assert os.path.isfile(tmp_path / "model-epoch0batch3.states")


def test_handlers_must_use_the_estimator_metrics():
    est = _quiet_estimator(nn.Dense(2))
    outsider = mx.metric.Accuracy()
    with pytest.raises(ValueError):
        est.fit(_classification_loader(), epochs=1, event_handlers=[LoggingHandler(metrics=[outsider])])
    handlers = est._prepare_default_handlers(None, [EarlyStoppingHandler(monitor=est.val_metrics[0], mode="max")])
    assert [type(h).__name__ for h in handlers] == ["GradientUpdateHandler", "MetricHandler",
                                                    "EarlyStoppingHandler", "StoppingHandler", "LoggingHandler"]


def test_custom_handler_stops_training():
    # As in MXNet, True from batch_end ends the current epoch; returning it from epoch_end too
    # ends the training.
    class StopAfter(BatchEnd, EpochEnd):
        def __init__(self, limit):
            self.limit = limit
            self.seen = 0

        def batch_end(self, estimator, *args, **kwargs):
            self.seen += 1
            return self.seen >= self.limit

        def epoch_end(self, estimator, *args, **kwargs):
            return self.seen >= self.limit

    est = _quiet_estimator(nn.Dense(2))
    stopper = StopAfter(4)
    est.fit(_classification_loader(), epochs=10, event_handlers=[stopper])
    assert stopper.seen == 4


def test_logging_handler_writes_interval_lines(capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = Estimator(nn.Dense(2), loss=gluon.loss.SoftmaxCrossEntropyLoss())
    est.fit(_classification_loader(), epochs=1, event_handlers=[LoggingHandler(log_interval=2,
                                                                               metrics=est.train_metrics)])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[Epoch 0][Batch")]
    assert [line.split("]")[1] for line in lines] == ["[Batch 0", "[Batch 2"]
    assert "training accuracy:" in lines[0]


def test_validation_handler_batch_period():
    est = _quiet_estimator(nn.Dense(2))
    calls = []
    loader = _classification_loader()
    handler = ValidationHandler(loader, eval_fn=lambda **kwargs: calls.append(kwargs), epoch_period=None,
                                batch_period=2)
    est.fit(loader, epochs=2, event_handlers=[handler, MetricHandler(est.train_metrics)])
    assert len(calls) == 3 and calls[0]["val_data"] is loader


def test_pixel_shuffle_matches_numpy():
    def reference(x, factors):
        n, c = x.shape[0], x.shape[1] // int(np.prod(factors))
        spatial = x.shape[2:]
        k = len(factors)
        blocks = x.reshape((n, c) + tuple(factors) + spatial)
        axes = [0, 1] + [a for i in range(k) for a in (2 + k + i, 2 + i)]
        return blocks.transpose(axes).reshape((n, c) + tuple(s * f for s, f in zip(spatial, factors)))

    rng = np.random.RandomState(1)
    for layer, factors, shape in ((PixelShuffle1D(3), (3,), (2, 6, 5)),
                                  (PixelShuffle2D((2, 3)), (2, 3), (1, 12, 3, 4)),
                                  (PixelShuffle3D(2), (2, 2, 2), (1, 16, 2, 3, 2))):
        x = rng.uniform(size=shape).astype("float32")
        expected = reference(x, factors)
        np.testing.assert_array_equal(layer(mx.nd.array(x)).asnumpy(), expected)
        layer.hybridize()
        np.testing.assert_array_equal(layer(mx.nd.array(x)).asnumpy(), expected)
    # MXNet's documented example: channel c*f + i goes to pixel w*f + i.
    out = PixelShuffle1D(2)(mx.nd.arange(12).reshape((1, 4, 3))).asnumpy()
    np.testing.assert_array_equal(out, [[[0, 3, 1, 4, 2, 5], [6, 9, 7, 10, 8, 11]]])
    with pytest.raises(ValueError):
        PixelShuffle2D((2, 2, 2))


def test_concurrent_identity_and_sparse_embedding():
    model = HybridConcurrent(axis=1)
    model.add(nn.Dense(3, in_units=4), Identity())
    model.initialize()
    x = mx.nd.array(np.arange(8).reshape(2, 4))
    weight, bias = model[0].weight.data().asnumpy(), model[0].bias.data().asnumpy()
    expected = np.concatenate([x.asnumpy() @ weight.T + bias, x.asnumpy()], axis=1)
    np.testing.assert_allclose(model(x).asnumpy(), expected, rtol=1e-5)
    eager = Concurrent(axis=0)
    eager.add(Identity(), Identity())
    assert eager(x).shape == (4, 4)

    embedding = SparseEmbedding(10, 3)
    embedding.initialize()
    indices = mx.nd.array([3, 4, 3, 0])
    with mx.autograd.record():
        out = embedding(indices)
    out.backward()
    np.testing.assert_array_equal(out.asnumpy(), embedding.weight.data().asnumpy()[[3, 4, 3, 0]])
    rows_hit = np.zeros((10, 1), dtype="float32")
    rows_hit[[0, 4]] = 1
    rows_hit[3] = 2
    np.testing.assert_array_equal(embedding.weight.grad().asnumpy(), np.broadcast_to(rows_hit, (10, 3)))


def test_sync_batch_norm_is_batch_norm_on_one_device():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        layer = SyncBatchNorm()
    layer.initialize()
    x = np.random.RandomState(2).normal(size=(4, 3, 2)).astype("float32")
    with mx.autograd.record():
        out = layer(mx.nd.array(x)).asnumpy()
    mean = x.mean(axis=(0, 2), keepdims=True)
    var = x.var(axis=(0, 2), keepdims=True)
    np.testing.assert_allclose(out, (x - mean) / np.sqrt(var + 1e-5), rtol=1e-4, atol=1e-5)


def test_interval_sampler():
    assert list(contrib_data.IntervalSampler(7, 3)) == [0, 3, 6, 1, 4, 2, 5]
    no_rollover = contrib_data.IntervalSampler(7, 3, rollover=False)
    assert list(no_rollover) == [0, 3, 6] and len(no_rollover) == 3


def _conv1d(x, w, b, pad, dilate):
    """(N, C, W) * (F, C, K) -> (N, F, W') at stride 1, NumPy reference."""
    x = np.pad(x, ((0, 0), (0, 0), (pad, pad)))
    k = w.shape[2]
    width = x.shape[2] - dilate * (k - 1)
    taps = np.stack([x[:, :, t * dilate:t * dilate + width] for t in range(k)], axis=-1)  # N C W' K
    return np.einsum("ncwk,fck->nfw", taps, w) + b[None, :, None]


@pytest.mark.parametrize("kind", ["RNN", "LSTM", "GRU"])
def test_conv_rnn_cells_match_numpy_for_two_steps(kind):
    """Conv1D cells: the dense cells' gates over convolutions (i2h with padding and dilation,
    h2h keeping the state's width), two steps against a NumPy reference."""
    from oxnet.gluon.contrib import rnn as contrib_rnn

    sigmoid = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    cell = getattr(contrib_rnn, "Conv1D%sCell" % kind)((3, 9), 4, 3, 3, i2h_pad=(1,), i2h_dilate=(2,),
                                                      h2h_dilate=(2,))
    cell.initialize(mx.init.Uniform(0.5))
    rng = np.random.RandomState(0)
    x = rng.uniform(-1, 1, (2, 2, 3, 9))  # steps, batch, channels, width
    outs, states = cell.unroll(2, mx.nd.array(x), layout="TNC", merge_outputs=True)
    w = {name[len(cell.prefix):]: p.data().asnumpy() for name, p in cell.collect_params().items()}
    assert w["i2h_weight"].shape[2:] == (3,) and w["h2h_weight"].shape[1] == 4
    h = np.zeros((2, 4, 7))
    c = np.zeros_like(h)
    for t in range(2):
        i2h = _conv1d(x[t], w["i2h_weight"], w["i2h_bias"], 1, 2)
        h2h = _conv1d(h, w["h2h_weight"], w["h2h_bias"], 2, 2)
        if kind == "RNN":
            h = np.tanh(i2h + h2h)
        elif kind == "LSTM":
            i, f, g, o = np.split(i2h + h2h, 4, axis=1)
            c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
            h = sigmoid(o) * np.tanh(c)
        else:
            (xr, xz, xn), (hr, hz, hn) = np.split(i2h, 3, axis=1), np.split(h2h, 3, axis=1)
            r, z = sigmoid(xr + hr), sigmoid(xz + hz)
            h = (1 - z) * np.tanh(xn + r * hn) + z * h
        np.testing.assert_allclose(outs.asnumpy()[t], h, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(states[0].asnumpy(), h, rtol=1e-4, atol=1e-5)


def test_conv_rnn_cell_arguments_are_checked():
    from oxnet.gluon.contrib import rnn as contrib_rnn

    with pytest.raises(ValueError, match="odd"):
        contrib_rnn.Conv2DLSTMCell((3, 8, 8), 4, 3, (2, 3))
    with pytest.raises(ValueError, match="channels first"):
        contrib_rnn.Conv2DGRUCell((8, 8, 3), 4, 3, 3, conv_layout="NHWC")
    with pytest.raises(ValueError, match="input_shape"):
        contrib_rnn.Conv3DRNNCell((3, 8, 8), 4, 3, 3)


@pytest.mark.parametrize("layout", ["TNC", "NTC"])
def test_dynamic_unroll_matches_unroll_with_valid_length(layout):
    """dynamic_unroll (one foreach node) gives unroll's outputs and each sequence's states at its
    last valid step, imperatively and hybridized."""
    from oxnet.gluon.contrib.rnn.rnn_cell import dynamic_unroll

    class Layer(gluon.HybridBlock):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.cell = gluon.rnn.LSTMCell(5, prefix="cell_")

        def hybrid_forward(self, F, data, h, c, lengths):
            return dynamic_unroll(self.cell, data, [h, c], layout=layout, valid_length=lengths)

    layer = Layer()
    layer.initialize(mx.init.Uniform(0.5))
    shape = (6, 3, 4) if layout == "TNC" else (3, 6, 4)
    data = mx.nd.random.normal(shape=shape)
    h, c = mx.nd.random.normal(shape=(3, 5)), mx.nd.random.normal(shape=(3, 5))
    lengths = mx.nd.array([6, 2, 4])
    want_out, want_states = layer.cell.unroll(6, data, [h, c], layout=layout, merge_outputs=True, valid_length=lengths)
    for hybridize in (False, True):
        if hybridize:
            layer.hybridize()
        out, states = layer(data, h, c, lengths)
        np.testing.assert_allclose(out.asnumpy(), want_out.asnumpy(), rtol=1e-5, atol=1e-6)
        for got, want in zip(states, want_states):
            np.testing.assert_allclose(got.asnumpy(), want.asnumpy(), rtol=1e-5, atol=1e-6)
