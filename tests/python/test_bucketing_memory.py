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
