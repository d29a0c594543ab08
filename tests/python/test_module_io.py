"""mx.io iterators, mx.mod.Module, mx.model checkpoints, mx.kv and the Trainer's use of a store."""

import numpy as np
import pytest

import oxnet as mx


def _batches(it):
    return [(b.data[0].asnumpy(), b.label[0].asnumpy() if b.label else None, b.pad) for b in it]


def test_ndarrayiter_pad_discard_roll_over():
    data = np.arange(10, dtype=np.float32).reshape(10, 1)
    label = np.arange(10, dtype=np.float32)

    padded = _batches(mx.io.NDArrayIter(data, label, batch_size=4, last_batch_handle="pad"))
    assert [p for _, _, p in padded] == [0, 0, 2]
    np.testing.assert_array_equal(padded[-1][0].ravel(), [8, 9, 0, 1])
    np.testing.assert_array_equal(padded[-1][1], [8, 9, 0, 1])

    discarded = _batches(mx.io.NDArrayIter(data, label, batch_size=4, last_batch_handle="discard"))
    assert len(discarded) == 2

    rolling = mx.io.NDArrayIter(data, label, batch_size=4, last_batch_handle="roll_over")
    assert len(_batches(rolling)) == 2
    rolling.reset()
    first = rolling.next()
    # The two examples left over from the last epoch start the next one.
    np.testing.assert_array_equal(first.data[0].asnumpy().ravel(), [8, 9, 0, 1])
    np.testing.assert_array_equal(first.label[0].asnumpy(), [8, 9, 0, 1])
    assert first.pad == 2


def test_ndarrayiter_batch_larger_than_data_and_names():
    it = mx.io.NDArrayIter(data=np.arange(3), batch_size=7, last_batch_handle="pad")
    np.testing.assert_array_equal(it.next().data[0].asnumpy(), [0, 1, 2, 0, 1, 2, 0])
    it = mx.io.NDArrayIter({"b": np.ones((6, 2)), "a": np.zeros((6, 3))}, np.ones(6), batch_size=3)
    assert [d.name for d in it.provide_data] == ["a", "b"]
    assert it.provide_data[1].shape == (3, 2)
    assert it.provide_label[0].name == "softmax_label"
    listed = mx.io.NDArrayIter([np.ones((4, 1)), np.ones((4, 1))], batch_size=2)
    assert [d.name for d in listed.provide_data] == ["_0_data", "_1_data"]


def test_ndarrayiter_shuffle_keeps_pairs():
    data = np.arange(20, dtype=np.float32)
    it = mx.io.NDArrayIter(data, data * 10, batch_size=5, shuffle=True)
    seen = []
    for batch in it:
        np.testing.assert_array_equal(batch.label[0].asnumpy(), batch.data[0].asnumpy() * 10)
        seen.extend(batch.data[0].asnumpy().tolist())
    assert sorted(seen) == data.tolist()


def test_csviter_round_batch(tmp_path):
    data_path = tmp_path / "data.csv"
    data_path.write_text("\n".join("%d,%d" % (i, i) for i in range(5)) + "\n")
    it = mx.io.CSVIter(data_csv=str(data_path), data_shape=(2,), batch_size=2, dtype="int64")
    batches = list(it)
    assert len(batches) == 3 and batches[-1].pad == 1
    np.testing.assert_array_equal(batches[-1].data[0].asnumpy()[:, 0], [4, 0])
    assert batches[0].data[0].dtype == np.int64
    it.reset()
    # The example that completed the last batch is not repeated first.
    np.testing.assert_array_equal(it.next().data[0].asnumpy()[:, 0], [1, 2])


def test_resize_and_prefetching_iters():
    base = mx.io.NDArrayIter(np.arange(8, dtype=np.float32), batch_size=4)
    assert len(list(mx.io.ResizeIter(base, 5))) == 5
    prefetch = mx.io.PrefetchingIter(mx.io.NDArrayIter(np.arange(8, dtype=np.float32), batch_size=4))
    assert [b.data[0].asnumpy()[0] for b in prefetch] == [0, 4]


def _regression_module(context=mx.cpu()):
    data = mx.sym.var("data")
    out = mx.sym.FullyConnected(data, num_hidden=1, name="fc")
    out = mx.sym.LinearRegressionOutput(out, mx.sym.var("label"), name="lro")
    return mx.mod.Module(out, data_names=["data"], label_names=["label"], context=context)


def _regression_data():
    rng = np.random.RandomState(0)
    x = rng.uniform(-1, 1, (64, 3)).astype(np.float32)
    y = x.dot(np.array([1.0, -2.0, 0.5], dtype=np.float32)) + 0.3
    return x, y


@pytest.mark.parametrize("contexts", [[mx.cpu(0)], [mx.cpu(0), mx.cpu(1)]])
def test_module_fit_reaches_low_loss(contexts):
    x, y = _regression_data()
    train = mx.io.NDArrayIter(x, {"label": y}, batch_size=16, shuffle=True)
    mod = _regression_module(contexts)
    mod.fit(train, num_epoch=60, optimizer="sgd", optimizer_params={"learning_rate": 0.3},
            initializer=mx.init.Xavier(), eval_metric="mse")
    score = dict(mod.score(mx.io.NDArrayIter(x, {"label": y}, batch_size=16), "mse"))
    assert score["mse"] < 1e-3
    weight = mod.get_params()[0]["fc_weight"].asnumpy()
    np.testing.assert_allclose(weight.ravel(), [1.0, -2.0, 0.5], atol=0.05)
    assert mod.predict(mx.io.NDArrayIter(x, batch_size=16)).shape == (64, 1)


def test_module_checkpoint_round_trip(tmp_path):
    x, y = _regression_data()
    mod = _regression_module()
    mod.fit(mx.io.NDArrayIter(x, {"label": y}, batch_size=16), num_epoch=2,
            optimizer_params={"learning_rate": 0.1, "momentum": 0.9})
    prefix = str(tmp_path / "reg")
    mod.save_checkpoint(prefix, 3, save_optimizer_states=True)
    symbol, args, auxs = mx.model.load_checkpoint(prefix, 3)
    assert symbol.tojson() == mod.symbol.tojson()
    loaded = mx.mod.Module.load(prefix, 3, load_optimizer_states=True, data_names=["data"], label_names=["label"])
    loaded.bind(data_shapes=[("data", (16, 3))], label_shapes=[("label", (16,))])
    loaded.init_optimizer(optimizer_params={"learning_rate": 0.1, "momentum": 0.9})
    for name, value in mod.get_params()[0].items():
        np.testing.assert_array_equal(loaded.get_params()[0][name].asnumpy(), value.asnumpy())
        np.testing.assert_array_equal(args[name].asnumpy(), value.asnumpy())
    assert set(loaded._updater.states) == set(mod._updater.states)
    for key, state in mod._updater.states.items():
        np.testing.assert_array_equal(loaded._updater.states[key].asnumpy(), state.asnumpy())


def test_module_forward_reshapes_and_fixed_params():
    data = mx.sym.var("data")
    net = mx.sym.FullyConnected(data, num_hidden=2, name="fc")
    mod = mx.mod.Module(net, label_names=None, fixed_param_names=["fc_weight"])
    mod.bind(data_shapes=[("data", (4, 3))])
    mod.init_params(initializer=mx.init.One())
    mod.init_optimizer(optimizer_params={"learning_rate": 1.0})
    mod.forward(mx.io.DataBatch([mx.nd.ones((6, 3))]), is_train=True)
    assert mod.get_outputs()[0].shape == (6, 2)
    mod.backward([mx.nd.ones((6, 2))])
    mod.update()
    params = mod.get_params()[0]
    np.testing.assert_array_equal(params["fc_weight"].asnumpy(), np.ones((2, 3)))
    # rescale_grad is 1/4 (the bound batch): six ones give a bias step of -1.5.
    np.testing.assert_allclose(params["fc_bias"].asnumpy(), [-1.5, -1.5])


def test_local_kvstore_push_pull_and_updater():
    kv = mx.kv.create("local")
    assert (kv.type, kv.rank, kv.num_workers) == ("local", 0, 1)
    kv.init(3, mx.nd.zeros((2, 2)))
    kv.push(3, [mx.nd.ones((2, 2), ctx=mx.cpu(i)) for i in range(3)])
    outs = [mx.nd.zeros((2, 2), ctx=mx.cpu(i)) for i in range(2)]
    kv.pull(3, out=outs)
    for out in outs:
        np.testing.assert_array_equal(out.asnumpy(), np.full((2, 2), 3.0))
    with pytest.raises(mx.MXNetError):
        kv.init("a", mx.nd.zeros((2, 2)))
    with pytest.raises(mx.MXNetError):
        kv.pull(4, out=mx.nd.zeros((2, 2)))

    def accumulate(key, pushed, stored):
        assert key == "w"
        stored += pushed * 2

    kv = mx.kv.create("device")
    kv.init(["w"], [mx.nd.ones((3,))])
    kv._set_updater(accumulate)
    pulled = mx.nd.zeros((3,), ctx=mx.cpu(1))
    kv.pushpull("w", [mx.nd.ones((3,)), mx.nd.ones((3,))], out=pulled)
    np.testing.assert_array_equal(pulled.asnumpy(), [5.0, 5.0, 5.0])


def test_kvstore_optimizer_and_states(tmp_path):
    kv = mx.kv.create("local")
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.5, momentum=0.9))
    weight = mx.nd.ones((4,))
    kv.init(0, weight)
    kv.pushpull(0, [mx.nd.ones((4,)), mx.nd.ones((4,))], out=weight)
    np.testing.assert_allclose(weight.asnumpy(), np.zeros(4))
    fname = str(tmp_path / "kv.states")
    kv.save_optimizer_states(fname)
    other = mx.kv.create("local")
    other.set_optimizer(mx.optimizer.SGD(learning_rate=0.5, momentum=0.9))
    other.load_optimizer_states(fname)
    np.testing.assert_allclose(other._updater.states[0].asnumpy(), kv._updater.states[0].asnumpy())
    with pytest.raises(mx.MXNetError, match="asynchronous updates need a parameter server"):
        mx.kv.create("dist_async")


@pytest.mark.parametrize("update_on_kvstore", [None, False])
def test_trainer_sums_gradients_through_kvstore(update_on_kvstore):
    x = mx.gluon.Parameter("x", shape=(4,))
    x.initialize(ctx=[mx.cpu(0), mx.cpu(1)], init="zeros")
    trainer = mx.gluon.Trainer([x], "sgd", {"learning_rate": 1.0}, update_on_kvstore=update_on_kvstore)
    with mx.autograd.record():
        for w in x.list_data():
            (w * 3).backward()
    trainer.step(1)
    assert trainer._kvstore.type == "device"
    assert trainer._update_on_kvstore is (update_on_kvstore is None)
    for data in x.list_data():
        np.testing.assert_array_equal(data.asnumpy(), np.full(4, -6.0))


def test_parameter_set_data_resets_trainer_store():
    x = mx.gluon.Parameter("x", shape=(2,))
    x.initialize(ctx=[mx.cpu(0), mx.cpu(1)], init="zeros")
    trainer = mx.gluon.Trainer([x], "sgd", {"learning_rate": 1.0})
    with mx.autograd.record():
        for w in x.list_data():
            w.backward()
    trainer.step(1)
    x.set_data(mx.nd.full((2,), 5.0))
    assert trainer._kvstore is None and not trainer._kv_initialized
    with mx.autograd.record():
        for w in x.list_data():
            w.backward()
    trainer.step(1)
    np.testing.assert_array_equal(x.data(mx.cpu(1)).asnumpy(), [3.0, 3.0])


def test_setitem_copies_value_from_another_device():
    target = mx.nd.zeros((3,), ctx=mx.cpu(1))
    target[:] = mx.nd.ones((3,), ctx=mx.cpu(0))
    assert target.context == mx.cpu(1)
    np.testing.assert_array_equal(target.asnumpy(), np.ones(3))


def test_loss_metric_and_global_values():
    metric = mx.metric.create("loss")
    metric.update(None, [mx.nd.array([1.0, 3.0])])
    metric.reset_local()
    metric.update(None, [mx.nd.array([5.0])])
    assert metric.get()[1] == 5.0
    assert metric.get_global_name_value() == [("loss", 3.0)]
