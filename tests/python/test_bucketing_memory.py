"""BucketingModule shares memory between buckets as MXNet does: the executors of the smaller
buckets reuse the default (largest) bucket's planned blocks and its all-ones head gradients, so
running every bucket costs little more than running the largest one."""

import numpy as np

import oxnet as mx

VOCAB, HIDDEN, BATCH, BUCKETS = 500, 64, 16, [10, 20, 30, 40]


def _sym_gen():
    cell = mx.rnn.LSTMCell(num_hidden=HIDDEN, prefix="lstm_")

    def sym_gen(seq_len):
        embed = mx.sym.Embedding(mx.sym.Variable("data"), input_dim=VOCAB, output_dim=HIDDEN, name="embed")
        cell.reset()
        outputs, _ = cell.unroll(seq_len, inputs=embed, merge_outputs=True)
        pred = mx.sym.FullyConnected(mx.sym.Reshape(outputs, shape=(-1, HIDDEN)), num_hidden=VOCAB, name="pred")
        label = mx.sym.Reshape(mx.sym.Variable("softmax_label"), shape=(-1,))
        return mx.sym.SoftmaxOutput(pred, label, name="softmax"), ("data",), ("softmax_label",)

    return sym_gen


def _pool_used():
    mx.nd.waitall()
    return mx._core.cpu_pool_stats()[0]


def test_smaller_buckets_reuse_the_default_buckets_memory():
    rng = np.random.RandomState(0)
    sentences = [list(rng.randint(1, VOCAB, size=rng.randint(5, 41))) for _ in range(BATCH * 12)]
    it = mx.rnn.BucketSentenceIter(sentences, BATCH, buckets=BUCKETS, invalid_label=0)
    batches = list(it)
    largest = [b for b in batches if b.bucket_key == max(BUCKETS)][0]
    module = mx.mod.BucketingModule(_sym_gen(), default_bucket_key=it.default_bucket_key, context=mx.cpu())
    module.bind(it.provide_data, it.provide_label)
    module.init_params()
    module.init_optimizer(optimizer="sgd", optimizer_params={"learning_rate": 0.1})
    module.forward_backward(largest)
    module.update()
    after_largest = _pool_used()
    gradients = [module.get_outputs()[0].asnumpy()]
    for batch in batches:
        module.forward_backward(batch)
        module.update()
    assert {b.bucket_key for b in batches} == set(BUCKETS)
    growth = _pool_used() - after_largest
    # Only the small input arrays of each bucket are new: no output-sized head gradients or plans.
    smallest_output_bytes = BATCH * min(BUCKETS) * VOCAB * 4
    assert growth < smallest_output_bytes / 4, growth
    module.forward_backward(largest)
    assert np.isfinite(module.get_outputs()[0].asnumpy()).all() and gradients[0].shape == (BATCH * 40, VOCAB)


def test_backward_without_head_gradients_is_repeatable():
    data = mx.sym.Variable("data")
    net = mx.sym.sum(mx.sym.FullyConnected(data, num_hidden=3, name="fc") * 2)
    ex = net.simple_bind(mx.cpu(), data=(4, 5))
    ex.arg_dict["data"][:] = mx.nd.array(np.arange(20).reshape(4, 5))
    ex.arg_dict["fc_weight"][:] = 0.5
    grads = []
    for _ in range(3):
        ex.forward(is_train=True)
        ex.backward()
        grads.append(ex.grad_dict["fc_weight"].asnumpy().copy())
    expected = np.tile(2 * np.arange(20).reshape(4, 5).sum(0), (3, 1))
    for grad in grads:
        np.testing.assert_allclose(grad, expected)
    # A smaller executor reshaped from this one views its head gradients.
    small = ex.reshape(data=(2, 5))
    small.arg_dict["data"][:] = 1.0
    small.forward(is_train=True)
    small.backward()
    np.testing.assert_allclose(small.grad_dict["fc_weight"].asnumpy(), np.full((3, 5), 4.0))


def _requested_bytes():
    mx.nd.waitall()
    return mx._core.cpu_pool_stats()[5]


def test_all_buckets_fit_in_the_largest_plan_and_the_parameters():
    """The issue's memory target: every bucket's executor together holds no more than the
    largest bucket's plan and the parameters (MXNet's shared buffers): smaller buckets view the
    largest one's blocks and input arrays, and a loss output's head gradient, which its gradient
    never reads, gets no array."""
    rng = np.random.RandomState(1)
    sentences = [list(rng.randint(1, VOCAB, size=rng.randint(5, 41))) for _ in range(BATCH * 12)]
    it = mx.rnn.BucketSentenceIter(sentences, BATCH, buckets=BUCKETS, invalid_label=0)
    batches = list(it)
    largest = [b for b in batches if b.bucket_key == max(BUCKETS)][0]
    before = _requested_bytes()
    module = mx.mod.BucketingModule(_sym_gen(), default_bucket_key=it.default_bucket_key, context=mx.cpu())
    module.bind(it.provide_data, it.provide_label)
    module.init_params()
    module.init_optimizer(optimizer="sgd", optimizer_params={"learning_rate": 0.1})
    for batch in [largest] + batches:
        module.forward_backward(batch)
        module.update()
    grown = _requested_bytes() - before
    default = module._buckets[max(BUCKETS)]
    executor = default._exec_group.execs[0]
    arrays = list(executor.arg_arrays) + [g for g in executor.grad_arrays if g is not None] + list(executor.aux_arrays)
    arrays += list(default._arg_params.values()) + list(default._aux_params.values())
    parameters = sum(a.size * np.dtype(a.dtype).itemsize for a in arrays)
    assert grown <= executor.planned_bytes + parameters, (grown, executor.planned_bytes, parameters)


def test_a_weight_used_many_times_sums_its_gradient_as_each_part_is_made():
    """Gradient contributions to a value used many times (the weight of an unrolled RNN) are
    summed by a chain of in-place adds run as each contribution is made (MXNet's, from
    MXNET_EXEC_INPLACE_GRAD_SUM_CAP = 8 uses on), so the plan does not grow by a weight per use;
    fewer uses are summed by one add_n. Both give the sum."""
    batch, width, hidden = 4, 64, 64
    weight_bytes = hidden * width * 4

    def run(uses):
        rng = np.random.RandomState(uses)
        weight = mx.sym.Variable("w")
        parts = [mx.sym.FullyConnected(mx.sym.Variable("x%d" % i), weight, num_hidden=hidden, no_bias=True,
                                       name="fc%d" % i) for i in range(uses)]
        net = mx.sym.add_n(*parts)
        xs = [rng.uniform(-1, 1, (batch, width)).astype(np.float32) for _ in range(uses)]
        w = rng.uniform(-1, 1, (hidden, width)).astype(np.float32)
        args = {"x%d" % i: mx.nd.array(x) for i, x in enumerate(xs)}
        args["w"] = mx.nd.array(w)
        grad = mx.nd.zeros(w.shape)
        exe = net.bind(mx.cpu(), args, args_grad={"w": grad}, grad_req={"w": "write"})
        exe.forward(is_train=True)
        head = rng.uniform(-1, 1, (batch, hidden)).astype(np.float32)
        exe.backward([mx.nd.array(head)])
        expected = sum(head.T @ x for x in xs)
        np.testing.assert_allclose(grad.asnumpy(), expected, rtol=1e-4, atol=1e-4)
        return exe.planned_bytes

    run(3)
    assert run(24) - run(12) < weight_bytes


def test_simple_bind_views_the_shared_buffer():
    """``shared_buffer`` (MXNet's simple_bind argument, how a BucketingModule's executors share
    their inputs): an argument outside ``shared_arg_names`` is a view of the buffer's array when
    that one is large enough, and a new array that replaces it otherwise."""
    net = mx.sym.FullyConnected(mx.sym.Variable("data"), num_hidden=2, name="fc")
    params = ["fc_weight", "fc_bias"]
    buffer = {}
    net.simple_bind(mx.cpu(), data=(8, 3), shared_buffer=buffer, shared_arg_names=params)
    assert sorted(buffer) == ["data", "grad of data"] and buffer["data"].shape == (8, 3)
    held = buffer["data"]
    small = net.simple_bind(mx.cpu(), data=(2, 3), shared_buffer=buffer, shared_arg_names=params)
    small.arg_dict["data"][:] = 5.0
    np.testing.assert_array_equal(held.asnumpy().ravel()[:6], 5.0)
    assert buffer["data"] is held
    net.simple_bind(mx.cpu(), data=(16, 3), shared_buffer=buffer, shared_arg_names=params)
    assert buffer["data"].shape == (16, 3) and buffer["data"] is not held


def test_softmax_output_overwrites_the_scores_in_a_plan():
    """SoftmaxOutput may write its probabilities over its input (MXNet's in-place option): a
    classifier's last layer and its softmax share one planned array, with the same values."""
    rng = np.random.RandomState(2)
    batch, classes = 6, 37
    data = mx.sym.Variable("data")
    net = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(data, num_hidden=classes, name="fc"), name="softmax")
    ex = net.simple_bind(mx.cpu(), grad_req="null", data=(batch, 5))
    for name, array in ex.arg_dict.items():
        array[:] = rng.uniform(-1, 1, array.shape)
    assert ex.planned_bytes == batch * classes * 4
    scores = ex.arg_dict["data"].asnumpy() @ ex.arg_dict["fc_weight"].asnumpy().T + ex.arg_dict["fc_bias"].asnumpy()
    expected = np.exp(scores - scores.max(1, keepdims=True))
    expected /= expected.sum(1, keepdims=True)
    np.testing.assert_allclose(ex.forward()[0].asnumpy(), expected, rtol=1e-5, atol=1e-6)
    # The same in place by hand, and in float64 (the lane kernel).
    for dtype in (np.float32, np.float64):
        x = mx.nd.array(scores, dtype=dtype)
        mx.nd.SoftmaxOutput(x, mx.nd.zeros((batch,), dtype=dtype), out=x)
        np.testing.assert_allclose(x.asnumpy(), expected, rtol=1e-5, atol=1e-6)
