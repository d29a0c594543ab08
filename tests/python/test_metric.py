"""mx.metric against NumPy: values, local/global statistics, configs and the registry."""

import json
import math

import numpy as np
import pytest

import oxnet as mx


def _classification_batches(seed=0, batches=4, size=12, classes=2):
    rng = np.random.RandomState(seed)
    out = []
    for _ in range(batches):
        label = rng.randint(0, classes, size=size)
        pred = rng.rand(size, classes)
        out.append((label, pred))
    return out


def _binary_counts(label, pred):
    guess = pred.argmax(axis=1)
    tp = np.sum((guess == 1) & (label == 1))
    fp = np.sum((guess == 1) & (label == 0))
    fn = np.sum((guess == 0) & (label == 1))
    tn = np.sum((guess == 0) & (label == 0))
    return tp, fp, fn, tn


def _f1(tp, fp, fn, tn):
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def _mcc(tp, fp, fn, tn):
    terms = [t for t in (tp + fp, tp + fn, tn + fp, tn + fn) if t]
    return (tp * tn - fp * fn) / math.sqrt(np.prod(terms, dtype=np.float64))


@pytest.mark.parametrize("average", ["macro", "micro"])
@pytest.mark.parametrize("name,score", [("f1", _f1), ("mcc", _mcc)])
def test_binary_metrics_macro_and_micro_against_numpy(name, score, average):
    metric = mx.metric.create(name, average=average)
    batches = _classification_batches()
    for label, pred in batches:
        metric.update([mx.nd.array(label)], [mx.nd.array(pred)])
    counts = [_binary_counts(label, pred) for label, pred in batches]
    if average == "macro":
        expected = np.mean([score(*c) for c in counts])
        assert metric.num_inst == len(batches)
    else:
        expected = score(*np.sum(counts, axis=0))
        assert metric.num_inst == sum(len(label) for label, _ in batches)
    assert metric.get() == (name, pytest.approx(expected))


def test_accuracy_topk_and_regression_metrics_against_numpy():
    rng = np.random.RandomState(1)
    pred, label = rng.rand(20, 5), rng.randint(0, 5, size=20)
    acc = mx.metric.Accuracy()
    acc.update(mx.nd.array(label), mx.nd.array(pred))  # a single array counts as a one-element list
    assert acc.get()[1] == pytest.approx(np.mean(pred.argmax(axis=1) == label))
    top3 = mx.metric.create("top_k_accuracy", top_k=3)
    top3.update([mx.nd.array(label)], [mx.nd.array(pred)])
    in_top3 = [label[i] in np.argsort(pred[i])[-3:] for i in range(20)]
    assert top3.get() == ("top_k_accuracy_3", pytest.approx(np.mean(in_top3)))

    target, guess = rng.rand(8, 3), rng.rand(8, 3)
    for name, expected in (("mae", np.abs(target - guess).mean()), ("mse", ((target - guess) ** 2).mean()),
                           ("rmse", np.sqrt(((target - guess) ** 2).mean()))):
        metric = mx.metric.create(name)
        metric.update([mx.nd.array(target)], [mx.nd.array(guess)])
        assert metric.get()[1] == pytest.approx(expected, rel=1e-5)


def test_perplexity_with_ignore_label_and_axis():
    rng = np.random.RandomState(2)
    probs = rng.dirichlet(np.ones(4), size=(3, 5))          # (batch, time, classes)
    label = rng.randint(0, 4, size=(3, 5))
    label[0, :2] = -1
    picked = np.take_along_axis(probs, np.maximum(label, 0)[..., None], axis=-1)[..., 0]
    keep = label != -1
    expected = np.exp(-np.log(picked[keep]).sum() / keep.sum())
    metric = mx.metric.Perplexity(ignore_label=-1)
    metric.update([mx.nd.array(label)], [mx.nd.array(probs)])
    assert metric.get()[1] == pytest.approx(expected, rel=1e-5)
    # Classes on axis 1 instead of the last axis.
    moved = mx.metric.Perplexity(ignore_label=-1, axis=1)
    moved.update([mx.nd.array(label.reshape(-1))], [mx.nd.array(probs.reshape(-1, 4))])
    assert moved.get()[1] == pytest.approx(expected, rel=1e-5)


def test_cross_entropy_and_nll_against_numpy():
    pred = np.array([[0.2, 0.3, 0.5], [0.6, 0.1, 0.3]])
    label = np.array([2, 1])
    expected = -np.log(pred[[0, 1], label]).mean()
    for name in ("ce", "nll_loss"):
        metric = mx.metric.create(name)
        metric.update([mx.nd.array(label)], [mx.nd.array(pred)])
        assert metric.get()[1] == pytest.approx(expected, rel=1e-5)
    assert mx.metric.create("nll_loss").get()[0] == "nll-loss"


def test_pearson_micro_streams_equal_the_pooled_correlation():
    rng = np.random.RandomState(3)
    chunks = [(rng.rand(n).astype(np.float32), (rng.rand(n) * 3 + 1).astype(np.float32)) for n in (4, 9, 2, 6)]
    micro = mx.metric.PearsonCorrelation(average="micro")
    macro = mx.metric.create("pearsonr")
    for label, pred in chunks:
        micro.update([mx.nd.array(label)], [mx.nd.array(pred)])
        macro.update([mx.nd.array(label)], [mx.nd.array(pred)])
    pooled = np.corrcoef(np.concatenate([c[1] for c in chunks]), np.concatenate([c[0] for c in chunks]))[0, 1]
    assert micro.get()[1] == pytest.approx(pooled, rel=1e-9)
    assert micro.get_global()[1] == pytest.approx(pooled, rel=1e-9)
    assert macro.get()[1] == pytest.approx(np.mean([np.corrcoef(p, l)[0, 1] for l, p in chunks]), rel=1e-9)
    # reset_local restarts the local stream only.
    micro.reset_local()
    label, pred = chunks[0]
    micro.update([mx.nd.array(label)], [mx.nd.array(pred)])
    assert micro.get()[1] == pytest.approx(np.corrcoef(pred, label)[0, 1], rel=1e-9)
    assert micro.get_global()[1] != pytest.approx(micro.get()[1])


def _multiclass_mcc(labels, guesses, classes):
    confusion = np.zeros((classes, classes))
    np.add.at(confusion, (guesses, labels), 1)
    total, correct = confusion.sum(), np.trace(confusion)
    predicted, actual = confusion.sum(axis=1), confusion.sum(axis=0)
    return (correct * total - predicted @ actual) / np.sqrt((total ** 2 - predicted @ predicted)
                                                             * (total ** 2 - actual @ actual))


def test_pcc_matches_mcc_for_two_classes_and_grows_with_classes():
    batches = _classification_batches(seed=4, batches=3)
    pcc, mcc = mx.metric.create("pcc"), mx.metric.MCC(average="micro")
    for label, pred in batches:
        pcc.update([mx.nd.array(label)], [mx.nd.array(pred)])
        mcc.update([mx.nd.array(label)], [mx.nd.array(pred)])
    assert pcc.get()[1] == pytest.approx(mcc.get()[1])
    labels, guesses = np.array([0, 1, 2, 3, 3, 1, 0]), np.array([0, 1, 2, 3, 2, 0, 0])
    multi = mx.metric.PCC()
    multi.update([mx.nd.array(labels[:3])], [mx.nd.array(guesses[:3])])  # class indices, 3 classes so far
    multi.update([mx.nd.array(labels[3:])], [mx.nd.array(np.eye(4)[guesses[3:]])])  # scores, a 4th class
    assert multi.get()[1] == pytest.approx(_multiclass_mcc(labels, guesses, 4))


@pytest.mark.parametrize("name,kwargs", [("acc", {}), ("f1", {}), ("mcc", {"average": "micro"}), ("pcc", {}),
                                         ("perplexity", {"ignore_label": None}), ("loss", {}), ("ce", {})])
def test_reset_local_keeps_global_statistics(name, kwargs):
    batches = _classification_batches(seed=5, batches=3)
    local_only, everything = mx.metric.create(name, **kwargs), mx.metric.create(name, **kwargs)
    for label, pred in batches:
        local_only.update([mx.nd.array(label)], [mx.nd.array(pred)])
        local_only.reset_local()
        everything.update([mx.nd.array(label)], [mx.nd.array(pred)])
    assert local_only.get_global() == everything.get()
    assert math.isnan(local_only.get()[1])
    assert local_only.get_global_name_value() == everything.get_name_value()


def test_configs_round_trip_through_json_and_the_registry():
    for metric in (mx.metric.create("acc", axis=0), mx.metric.Perplexity(-1, axis=1), mx.metric.F1(average="micro"),
                   mx.metric.create(["acc", "mae"]), mx.metric.create("top_k_acc", top_k=4)):
        config = metric.get_config()
        again = mx.metric.create(json.dumps(config))
        assert type(again) is type(metric) and again.get_config() == config
    assert isinstance(mx.metric.create({"metric": "MSE"}), mx.metric.MSE)
    assert isinstance(mx.metric.create("torch"), mx.metric.Loss) and mx.metric.Caffe().name == "caffe"
    with pytest.raises(ValueError, match="unknown metric"):
        mx.metric.create("no_such_metric")
    with pytest.raises(NotImplementedError):
        mx.metric.create(lambda label, pred: 0.0).get_config()


def test_custom_metric_and_np_helper():
    def abs_error(label, pred):
        return np.abs(label - pred).sum(), label.size

    metric = mx.metric.np(abs_error)
    metric.update([mx.nd.array([1.0, 2.0])], [mx.nd.array([2.0, 4.0])])
    assert metric.get() == ("abs_error", 1.5)
    assert mx.metric.create(lambda label, pred: 1.0).name == "custom(<lambda>)"
    extra = mx.metric.CustomMetric(lambda label, pred: float(pred.sum()), allow_extra_outputs=True)
    extra.update([mx.nd.array([0.0])], [mx.nd.array([2.0]), mx.nd.array([5.0])])
    assert extra.get()[1] == 2.0


def test_values_compare_with_float32_results_at_their_precision():
    # Metric values are Python floats, which NumPy compares with a float32 result in float32.
    acc = mx.metric.create("acc")
    acc.update([mx.nd.array([0, 1, 1])], [mx.nd.array([[0.3, 0.7], [0, 1.0], [0.4, 0.6]])])
    value = acc.get()[1]
    assert type(value) is float and value == np.float32(2) / 3
