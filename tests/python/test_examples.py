"""The README's main job: examples/train_digits.py trains, exports, reloads and checks."""

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_train_digits_reaches_target_and_reloads(tmp_path):
    pytest.importorskip("sklearn")
    out = tmp_path / "digits"
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "train_digits.py"), "--out", str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    final = [line for line in result.stdout.splitlines() if line.startswith("trained")][0]
    assert float(final.rsplit(" ", 1)[1]) >= 0.97
    assert "predictions agree on 100.0%" in result.stdout
    assert (tmp_path / "digits-symbol.json").exists() and (tmp_path / "digits-0000.params").exists()
    # The test split, which the Rust example predict_digits.rs evaluates without Python.
    import oxnet as mx
    test_split = mx.nd.load(str(tmp_path / "digits-test.params"))
    assert test_split["data"].shape == (360, 1, 8, 8) and test_split["label"].shape == (360,)


def _run_example(name, *args):
    result = subprocess.run([sys.executable, str(ROOT / "examples" / name)] + list(args), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _figure(line):
    return float(line.split()[-1])


def test_train_module_checkpoints_and_resumes(tmp_path):
    pytest.importorskip("sklearn")
    prefix = tmp_path / "mlp"
    out = _run_example("train_module.py", "--epochs", "1", "--resume-epochs", "3", "--lr", "0.02",
                       "--prefix", str(prefix)).splitlines()
    first = _figure([line for line in out if line.startswith("first run")][0])
    reloaded = _figure([line for line in out if line.startswith("checkpoint")][0])
    resumed = _figure([line for line in out if line.startswith("resumed")][0])
    assert reloaded == first
    assert resumed > first and resumed >= 0.9
    assert (tmp_path / "mlp-symbol.json").exists()
    assert [(tmp_path / ("mlp-%04d.params" % epoch)).exists() for epoch in range(1, 5)] == [True] * 4


def test_bucketing_lm_perplexity_falls():
    out = _run_example("bucketing_lm.py", "--epochs", "3", "--num-sentences", "1500")
    perplexities = [float(line.split("perplexity ")[1].split()[0]) for line in out.splitlines()
                    if line.startswith("epoch ")]
    assert len(perplexities) == 3
    assert perplexities[0] > perplexities[1] > perplexities[2]
    assert perplexities[2] < 0.8 * perplexities[0]


def test_variable_length_sum_learns_with_buckets():
    out = _run_example("variable_length_sum.py", "--small").splitlines()
    losses = [float(line.split("loss ")[1].split()[0]) for line in out if line.startswith("epoch ")]
    assert len(losses) == 8 and losses[-1] < 0.1 * losses[0]
    buckets = [line for line in out if line.startswith("buckets used:")][0].split(":", 1)[1].split()
    lengths = [int(b.split(":")[0]) for b in buckets]
    assert lengths[0] == 2 and lengths[-1] == 64 and len(lengths) <= 12  # log-rounded: few buckets
    padding = [line for line in out if line.startswith("padding:")][0]
    bucketed, to_longest = (float(word.rstrip("%")) for word in padding.split() if word.endswith("%"))
    assert bucketed < 25 and to_longest > 60
    # Predicting the mean sum is off by about 60; a few seconds of training get within a few units.
    assert _figure([line for line in out if line.startswith("test mean absolute error")][0]) < 10
