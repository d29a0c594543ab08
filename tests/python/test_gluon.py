"""Gluon: blocks, naming, deferred initialization, hybridize, save/load, the gluon_mlp fixture,
trainer, data loading."""

import json

import numpy as np
import pytest

import oxnet as mx
from oxnet import autograd, gluon
from oxnet.gluon import nn


def fixture_net():
    net = nn.HybridSequential(prefix="net_")
    with net.name_scope():
        net.add(nn.Dense(16, activation="relu"), nn.BatchNorm(), nn.Dropout(0.3), nn.Dense(4))
    return net


def test_names_follow_mxnet_prefixes():
    net = fixture_net()
    assert list(net.collect_params()) == [
        "net_dense0_weight", "net_dense0_bias", "net_batchnorm0_gamma", "net_batchnorm0_beta",
        "net_batchnorm0_running_mean", "net_batchnorm0_running_var", "net_dense1_weight", "net_dense1_bias"]
    assert list(net.collect_params(".*weight")) == ["net_dense0_weight", "net_dense1_weight"]
    with mx.name.NameManager():
        a, b = nn.Dense(2), nn.Dense(2)
    assert (a.prefix, b.prefix) == ("dense0_", "dense1_")


def test_deferred_initialization_from_the_first_batch():
    net = nn.Dense(3)
    net.initialize()
    with pytest.raises(gluon.DeferredInitializationError):
        net.weight.data()
    out = net(mx.nd.ones((2, 7)))
    assert out.shape == (2, 3) and net.weight.shape == (3, 7)
    conv = nn.Conv2D(4, kernel_size=3, padding=1)
    conv.initialize()
    assert conv(mx.nd.ones((1, 5, 6, 6))).shape == (1, 4, 6, 6) and conv.weight.shape == (4, 5, 3, 3)
    with pytest.raises(RuntimeError, match="has not been initialized"):
        nn.Dense(2, in_units=3).weight.data()


def test_fixture_loads_by_imports_and_by_save_parameters(fixtures_dir):
    io = mx.nd.load(str(fixtures_dir / "gluon_mlp-io.params"))
    imported = gluon.SymbolBlock.imports(str(fixtures_dir / "gluon_mlp-symbol.json"), ["data"],
                                         str(fixtures_dir / "gluon_mlp-0000.params"))
    np.testing.assert_allclose(imported(io["data"]).asnumpy(), io["out:0"].asnumpy(), rtol=1e-4, atol=1e-5)
    net = fixture_net()
    net.load_parameters(str(fixtures_dir / "gluon_mlp.save_parameters.params"))
    np.testing.assert_allclose(net(io["data"]).asnumpy(), io["out:0"].asnumpy(), rtol=1e-4, atol=1e-5)
    net.hybridize()
    np.testing.assert_allclose(net(io["data"]).asnumpy(), io["out:0"].asnumpy(), rtol=1e-4, atol=1e-5)


def test_save_parameters_round_trip_writes_mxnet_layout(fixtures_dir, tmp_path):
    net = fixture_net()
    net.load_parameters(str(fixtures_dir / "gluon_mlp.save_parameters.params"))
    path = tmp_path / "mlp.params"
    net.save_parameters(str(path))
    assert path.read_bytes() == (fixtures_dir / "gluon_mlp.save_parameters.params").read_bytes()


def test_hybridized_equals_imperative_in_values_and_gradients():
    mx.random.seed(3)
    net = nn.HybridSequential()
    with net.name_scope():
        net.add(nn.Conv2D(4, 3, padding=1, activation="tanh"), nn.MaxPool2D(), nn.Flatten(), nn.Dense(5))
    net.initialize(mx.init.Xavier())
    x = mx.nd.random.uniform(shape=(3, 2, 6, 6))
    label = mx.nd.array([0, 3, 4])
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    def run():
        with autograd.record():
            loss = loss_fn(net(x), label)
        loss.backward()
        return loss.asnumpy(), {n: p.grad().asnumpy().copy() for n, p in net.collect_params().items()}

    loss_imperative, grads_imperative = run()
    net.hybridize()
    loss_hybrid, grads_hybrid = run()
    np.testing.assert_allclose(loss_hybrid, loss_imperative, rtol=1e-5, atol=1e-6)
    for name in grads_imperative:
        np.testing.assert_allclose(grads_hybrid[name], grads_imperative[name], rtol=1e-4, atol=1e-6, err_msg=name)


def test_hybridized_block_is_one_recorded_node():
    net = nn.HybridSequential()
    with net.name_scope():
        net.add(nn.Dense(4, activation="relu"), nn.Dense(2))
    net.initialize()
    net.hybridize()
    x = mx.nd.ones((2, 3))
    with autograd.record():
        out = net(x)
    dot = mx.autograd.to_dot(out)
    assert "_CachedOp" in dot and "FullyConnected" not in dot


def test_export_and_imports_round_trip(tmp_path):
    net = fixture_net()
    net.initialize()
    net.hybridize()
    x = mx.nd.random.uniform(shape=(3, 8))
    expected = net(x).asnumpy()
    sym_file, params_file = net.export(str(tmp_path / "m"), epoch=7)
    assert params_file.endswith("m-0007.params")
    keys = set(mx.nd.load(params_file))
    assert "aux:net_batchnorm0_running_mean" in keys and "arg:net_dense0_weight" in keys
    back = gluon.SymbolBlock.imports(sym_file, ["data"], params_file)
    np.testing.assert_allclose(back(x).asnumpy(), expected, rtol=1e-5)
    with pytest.raises(RuntimeError, match="hybridize"):
        fixture_net().export(str(tmp_path / "x"))


def test_trainer_sgd_momentum_matches_numpy():
    net = nn.Dense(1, in_units=2, use_bias=False)
    net.initialize(mx.init.Constant(0.5))
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 0.01})
    x = mx.nd.array([[1.0, 2.0], [3.0, 4.0]])
    w = np.full((1, 2), 0.5, np.float32)
    mom = np.zeros_like(w)
    for _ in range(3):
        with autograd.record():
            loss = (net(x) ** 2).sum()
        loss.backward()
        trainer.step(2)
        grad = (2 * (x.asnumpy() @ w.T) * x.asnumpy()).sum(0, keepdims=True) / 2
        mom = 0.9 * mom - 0.1 * (grad + 0.01 * w)
        w = w + mom
    np.testing.assert_allclose(net.weight.data().asnumpy(), w, rtol=1e-5)


def test_trainer_states_round_trip(tmp_path):
    net = nn.Dense(2, in_units=2)
    net.initialize()
    trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 0.01})
    with autograd.record():
        loss = net(mx.nd.ones((1, 2))).sum()
    loss.backward()
    trainer.step(1)
    trainer.save_states(str(tmp_path / "t.states"))
    other = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 0.5})
    other.load_states(str(tmp_path / "t.states"))
    assert other.learning_rate == pytest.approx(0.01)
    trainer.set_learning_rate(0.2)
    assert trainer.learning_rate == pytest.approx(0.2)


def test_dataloader_batches_shuffles_and_uses_workers():
    data = np.arange(20, dtype=np.float32).reshape(10, 2)
    labels = np.arange(10, dtype=np.float32)
    dataset = gluon.data.ArrayDataset(data, labels)
    batches = list(gluon.data.DataLoader(dataset, batch_size=4))
    assert [b[0].shape for b in batches] == [(4, 2), (4, 2), (2, 2)]
    np.testing.assert_array_equal(batches[0][1].asnumpy(), [0, 1, 2, 3])
    assert len(gluon.data.DataLoader(dataset, batch_size=4, last_batch="discard")) == 2
    seen = np.concatenate([b[1].asnumpy() for b in gluon.data.DataLoader(dataset, batch_size=3, shuffle=True)])
    assert sorted(seen.tolist()) == labels.tolist()
    loader = gluon.data.DataLoader(dataset, batch_size=4, num_workers=2)
    worker_batches = list(loader)
    loader.close()
    for got, expected in zip(worker_batches, batches):
        np.testing.assert_array_equal(got[0].asnumpy(), expected[0].asnumpy())


def test_dataloader_workers_hand_batches_over_in_shared_memory():
    import os
    data = np.arange(60, dtype=np.float32).reshape(20, 3)
    labels = np.arange(20, dtype=np.int32)
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    loader = gluon.data.DataLoader(gluon.data.ArrayDataset(data, labels), batch_size=6, num_workers=2)
    batches = list(loader)
    loader.close()
    assert [b[0].shape for b in batches] == [(6, 3), (6, 3), (6, 3), (2, 3)]
    assert batches[0][1].dtype == np.int32
    np.testing.assert_array_equal(np.concatenate([b[0].asnumpy() for b in batches]), data)
    np.testing.assert_array_equal(np.concatenate([b[1].asnumpy() for b in batches]), labels)
    if shm_before or os.path.isdir("/dev/shm"):
        # Every block a worker made was unlinked once the parent copied it.
        assert set(os.listdir("/dev/shm")) <= shm_before


def test_split_and_load_and_clip_global_norm():
    parts = gluon.utils.split_and_load(mx.nd.arange(12).reshape((6, 2)), [mx.cpu(0), mx.cpu(1)])
    assert [p.shape for p in parts] == [(3, 2), (3, 2)] and parts[1].context == mx.cpu(1)
    arrays = [mx.nd.array([3.0, 0.0]), mx.nd.array([4.0])]
    norm = gluon.utils.clip_global_norm(arrays, 1.0)
    assert norm == pytest.approx(5.0)
    np.testing.assert_allclose(arrays[0].asnumpy(), [0.6, 0.0], rtol=1e-5)


def test_block_repr_summary_and_hooks(capsys):
    net = fixture_net()
    net.initialize()
    seen = []
    handle = net.register_forward_hook(lambda block, inputs, out: seen.append(out.shape))
    net(mx.nd.ones((2, 8)))
    handle.detach()
    net(mx.nd.ones((2, 8)))
    assert seen == [(2, 4)]
    assert "Dense(8 -> 16, Activation(relu))" in repr(net)
    net.summary(mx.nd.ones((2, 8)))
    assert "Total params" in capsys.readouterr().out


def test_instance_and_group_norm_layers():
    x = mx.nd.random.normal(shape=(2, 4, 3, 3))
    inorm = nn.InstanceNorm(scale=True)
    inorm.initialize()
    out = inorm(x).asnumpy()
    xs = x.asnumpy()
    expected = (xs - xs.mean((2, 3), keepdims=True)) / np.sqrt(xs.var((2, 3), keepdims=True) + 1e-5)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)
    gnorm = nn.GroupNorm(num_groups=2)
    gnorm.initialize()
    gnorm.hybridize()
    out = gnorm(x).asnumpy()
    grouped = xs.reshape(2, 2, -1)
    expected = ((grouped - grouped.mean(2, keepdims=True)) / np.sqrt(grouped.var(2, keepdims=True) + 1e-5)).reshape(xs.shape)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)
    assert gnorm.gamma.shape == (2,) and inorm.gamma.shape == (4,)


@pytest.mark.parametrize("layer, shape", [
    (lambda: nn.Conv1DTranspose(3, 3, strides=2, padding=1, output_padding=1), (2, 4, 5)),
    (lambda: nn.Conv2DTranspose(6, (4, 3), strides=(2, 1), padding=(1, 0), groups=2, activation="relu"), (2, 4, 3, 5)),
    (lambda: nn.Conv3DTranspose(2, 2, strides=2, use_bias=False), (1, 3, 2, 2, 3)),
])
def test_conv_transpose_layers(layer, shape):
    x = mx.nd.random.normal(shape=shape)
    with mx.name.NameManager():
        block = layer()
    assert block.prefix == "conv0_"
    block.initialize(mx.init.Xavier())
    out = block(x)
    kw = block._kwargs
    groups, channels = kw["num_group"], kw["num_filter"]
    assert block.weight.shape == (shape[1], channels // groups) + kw["kernel"]
    args = [x, block.weight.data()] + ([block.bias.data()] if block.bias is not None else [])
    expected = mx.nd.Deconvolution(*args, **{k: v for k, v in kw.items() if k != "layout"})
    if block.act is not None:
        expected = mx.nd.relu(expected)
    np.testing.assert_allclose(out.asnumpy(), expected.asnumpy(), rtol=1e-5, atol=1e-6)
    spatial = [(n - 1) * s - 2 * p + k + a for n, s, p, k, a in zip(shape[2:], kw["stride"], kw["pad"], kw["kernel"], kw["adj"])]
    assert out.shape == (shape[0], channels) + tuple(spatial)
    block.hybridize()
    with autograd.record():
        hybrid_out = block(x)
    hybrid_out.backward()
    np.testing.assert_allclose(hybrid_out.asnumpy(), out.asnumpy(), rtol=1e-5, atol=1e-6)
    assert np.abs(block.weight.grad().asnumpy()).sum() > 0


def test_trainer_rejects_stale_gradients():
    # As MXNet: a parameter whose gradient backward has not written since the last step raises
    # UserWarning; ignore_stale_grad=True skips it and updates the others.
    used, unused = gluon.nn.Dense(2, in_units=3), gluon.nn.Dense(2, in_units=3)
    for block in (used, unused):
        block.initialize(mx.init.One())
    params = used.collect_params()
    params.update(unused.collect_params())
    trainer = gluon.Trainer(params, "sgd", {"learning_rate": 0.1})
    x = mx.nd.ones((4, 3))
    with mx.autograd.record():
        loss = used(x).sum()
    loss.backward()
    # The Trainer orders a dict of parameters by name (as MXNet): the unused bias comes first.
    with pytest.raises(UserWarning, match="Gradient of Parameter `%s` on context cpu\\(0\\) has not been updated"
                       % unused.bias.name):
        trainer.step(4)
    trainer.step(4, ignore_stale_grad=True)
    assert np.all(unused.weight.data().asnumpy() == 1)
    assert np.allclose(used.weight.data().asnumpy(), 1 - 0.1 * 4 / 4)
    # The update consumed the fresh gradients: stepping again without backward is stale.
    with pytest.raises(UserWarning, match="has not been updated by backward"):
        trainer.step(4)


class _AddOptional(gluon.HybridBlock):
    def hybrid_forward(self, F, a, b=None):
        return a if b is None else a + b


def test_hybrid_block_accepts_none_arguments_and_checks_input_types():
    block = _AddOptional()
    block.hybridize()
    x = mx.nd.ones((3,))
    assert np.all(block(x).asnumpy() == 1)
    # Trailing None matches the traced call that left it out.
    assert np.all(block(x, None).asnumpy() == 1)
    with pytest.raises(ValueError):
        block(x, x)  # traced without b
    with pytest.raises(ValueError):
        _AddOptional()(None, None)
    with pytest.raises(ValueError):
        _AddOptional()(x, mx.sym.var("b"))
    hybrid = _AddOptional()
    hybrid.hybridize()
    with pytest.raises(ValueError):
        hybrid(x, 1)  # a number cannot enter a traced graph
    assert np.all(_AddOptional()(x, 1).asnumpy() == 2)  # but it can imperatively


def test_invalid_parameter_storage_types_are_rejected():
    with pytest.raises(AssertionError):
        gluon.Parameter("weight", shape=(2, 2), stype="dense")
    with pytest.raises(AssertionError):
        gluon.Parameter("weight", shape=(2, 2), grad_stype="dense")


def test_split_data_uneven_sections_follow_numpy_array_split():
    x = mx.nd.arange(33).reshape((1, 33))
    parts = gluon.utils.split_data(x, 4, batch_axis=1, even_split=False)
    expected = np.array_split(x.asnumpy(), 4, axis=1)
    assert [p.shape for p in parts] == [e.shape for e in expected]


def test_unregistered_blocks_in_containers_and_sequential_of_hybrids_warn():
    class ListHolder(gluon.Block):
        def __init__(self):
            super().__init__()
            self.layers = [nn.Dense(2)]

    with pytest.warns(UserWarning, match="unregistered container"):
        ListHolder().collect_params()
    seq = nn.Sequential()
    seq.add(nn.Dense(2))
    with pytest.warns(UserWarning, match="Consider using HybridSequential"):
        seq.hybridize()


def test_load_deduplicated_shared_parameters(tmp_path):
    class Pair(gluon.Block):
        def __init__(self, first, second):
            super().__init__()
            self.first, self.second = first, second

    def build():
        first = nn.Dense(2, in_units=2)
        return Pair(first, nn.Dense(2, in_units=2, params=first.collect_params()))

    net = build()
    net.initialize()
    path = str(tmp_path / "shared.params")
    net.save_parameters(path, deduplicate=True)
    assert len(mx.nd.load(path)) == 2
    loaded = build()
    loaded.load_parameters(path)
    assert np.all(loaded.second.weight.data().asnumpy() == net.first.weight.data().asnumpy())


def test_legacy_save_params_loads_into_symbol_block(tmp_path):
    net = nn.HybridSequential(prefix="")
    with net.name_scope():
        net.add(nn.Dense(3, in_units=2))
    net.initialize()
    path = str(tmp_path / "legacy.params")
    with pytest.warns(UserWarning, match="deprecated"):
        net.save_params(path)
    assert all("." not in key for key in mx.nd.load(path))
    model = gluon.SymbolBlock(net(mx.sym.var("data")), mx.sym.var("data"))
    with pytest.warns(UserWarning, match="deprecated"):
        model.load_params(path, ctx=mx.cpu())
    x = mx.nd.ones((1, 2))
    assert np.allclose(model(x).asnumpy(), net(x).asnumpy())


def test_small_hybridized_graphs_are_recorded_inline():
    net = nn.HybridSequential()
    with net.name_scope():
        net.add(nn.Dense(2, in_units=2), nn.Dense(2, in_units=2))
    net.initialize()

    def recorded_nodes(inline_limit):
        net.hybridize(inline_limit=inline_limit)
        with autograd.record():
            out = net(mx.nd.ones((1, 2)))
        out.backward()
        return [node["op"] for node in json.loads(autograd.get_symbol(out).tojson())["nodes"]]

    assert recorded_nodes(2).count("FullyConnected") == 2
    assert "FullyConnected" not in recorded_nodes(0)


def test_cached_graph_returning_its_input_differentiates():
    # The second output is the graph's own input: its head gradient reaches no operator, yet the
    # compiled gradient must still know its shape (MXNet's test_grad_graph_change).
    class TakeRow(gluon.HybridBlock):
        def hybrid_forward(self, F, array, index):
            return array.take(index), index

    array, index = mx.nd.arange(3), mx.nd.array([2])
    array.attach_grad()
    block = TakeRow()
    block.hybridize(inline_limit=0)
    for _ in range(2):
        with autograd.record():
            row, _ = block(array, index)
        row.backward()
        assert array.grad.asnumpy().tolist() == [0, 0, 1]


def test_reflection_pad_and_channels_last_pooling():
    x = mx.nd.arange(16).reshape((1, 1, 4, 4))
    padded = nn.ReflectionPad2D(1)(x).asnumpy()[0, 0]
    assert np.all(padded == np.pad(x.asnumpy()[0, 0], 1, mode="reflect"))
    data = mx.nd.random.uniform(shape=(2, 5, 6, 3))
    data.attach_grad()
    with autograd.record():
        out = nn.MaxPool2D(layout="NHWC")(data)
    out.backward()
    reference = nn.MaxPool2D()(data.transpose((0, 3, 1, 2))).transpose((0, 2, 3, 1))
    assert np.all(out.asnumpy() == reference.asnumpy())
    # Each 2x2 window sends its one gradient to its maximum.
    assert data.grad.sum().asscalar() == out.size


def test_selu_rounds_like_float32_arithmetic():
    x = mx.nd.array([0.1, 2.5])
    assert np.all(nn.SELU()(x).asnumpy() == np.float32(1.0507009873554805) * x.asnumpy())
