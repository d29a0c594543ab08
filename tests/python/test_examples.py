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
