"""mx.nd.save / mx.nd.load against files written by MXNet 1.9.1, both ways."""

import os
import struct

import numpy as np
import pytest

import oxnet as mx
from oxnet.test_utils import same

FLAG_TO_NP = {0: np.float32, 1: np.float64, 2: np.float16, 3: np.uint8, 4: np.int32, 5: np.int8, 6: np.int64, 7: np.bool_}


def independent_parse(raw):
    """A reader written from the format description, independent of oxnet's Rust reader."""
    magic, _reserved, count = struct.unpack_from("<QQQ", raw, 0)
    assert magic == 0x112
    pos, arrays = 24, []
    for _ in range(count):
        amagic, stype, ndim = struct.unpack_from("<IiI", raw, pos)
        assert amagic == 0xF993FAC9 and stype == 0
        pos += 12
        shape = struct.unpack_from("<%dq" % ndim, raw, pos)
        pos += 8 * ndim
        dev_type, _dev_id, flag = struct.unpack_from("<iii", raw, pos)
        assert dev_type == 1
        pos += 12
        dtype = np.dtype(FLAG_TO_NP[flag])
        n = int(np.prod(shape)) * dtype.itemsize
        arrays.append(np.frombuffer(raw, dtype=dtype, count=int(np.prod(shape)), offset=pos).reshape(shape))
        pos += n
    (nnames,) = struct.unpack_from("<Q", raw, pos)
    pos += 8
    names = []
    for _ in range(nnames):
        (ln,) = struct.unpack_from("<Q", raw, pos)
        names.append(raw[pos + 8:pos + 8 + ln].decode())
        pos += 8 + ln
    assert pos == len(raw)
    return arrays, names


def param_files(fixtures_dir):
    return sorted(p for p in fixtures_dir.iterdir() if p.suffix == ".params")


def test_every_mxnet_params_file_loads_with_the_right_values(fixtures_dir):
    files = param_files(fixtures_dir)
    assert len(files) >= 12
    for path in files:
        raw = path.read_bytes()
        expected, names = independent_parse(raw)
        loaded = mx.nd.load(str(path))
        if names:
            assert isinstance(loaded, dict) and list(loaded) == names
            values = list(loaded.values())
        else:
            assert isinstance(loaded, list)
            values = loaded
        assert len(values) == len(expected)
        for got, exp in zip(values, expected):
            assert got.shape == exp.shape and got.dtype == exp.dtype, path.name
            assert same(got, exp), path.name


def test_saving_what_mxnet_wrote_reproduces_its_bytes(fixtures_dir, tmp_path):
    for path in param_files(fixtures_dir):
        loaded = mx.nd.load(str(path))
        out = tmp_path / path.name
        mx.nd.save(str(out), loaded)
        assert out.read_bytes() == path.read_bytes(), path.name
        assert mx.nd.save_tobuffer(loaded) == path.read_bytes()


def test_known_fixture_content(fixtures_dir):
    io = mx.nd.load(str(fixtures_dir / "wolfram-io.params"))
    assert sorted(io) == ["Input", "grad:Input", "out:0", "train_out:0"]
    x = io["Input"].asnumpy().astype(np.float64)
    # wolfram: y = tanh(sin x) * sin x + tanh(sin x)
    s = np.sin(x)
    np.testing.assert_allclose(io["out:0"].asnumpy(), np.tanh(s) * s + np.tanh(s), rtol=1e-5, atol=1e-6)
    params = mx.nd.load(str(fixtures_dir / "mlp-0000.params"))
    assert all(k.startswith(("arg:", "aux:")) for k in params)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "uint8", "int8", "int32", "int64", "bool", "bfloat16"])
def test_round_trip_lists_and_dicts(dtype, tmp_path, ctx):
    a = mx.nd.array(np.arange(12).reshape(3, 4) % 5, ctx=ctx).astype(dtype)
    b = mx.nd.array([[1.5]], ctx=ctx).astype(dtype)
    f = str(tmp_path / "x.params")
    mx.nd.save(f, [a, b])
    la, lb = mx.nd.load(f)
    assert la.dtype == a.dtype and same(la.astype("float64"), a.astype("float64").asnumpy())
    assert lb.shape == (1, 1)
    mx.nd.save(f, {"arg:a": a, "aux:b": b})
    d = mx.nd.load(f)
    assert list(d) == ["arg:a", "aux:b"] and same(d["arg:a"].astype("float64"), a.astype("float64").asnumpy())
    mx.nd.save(f, a)
    assert len(mx.nd.load(f)) == 1
    assert mx.nd.load_frombuffer(mx.nd.save_tobuffer({"k": a}))["k"].shape == (3, 4)


def test_corrupt_files_raise_clear_errors(fixtures_dir, tmp_path):
    raw = (fixtures_dir / "lenet-0000.params").read_bytes()
    bad = tmp_path / "bad.params"
    for cut in (0, 7, 24, 30, 60, 200, len(raw) // 2, len(raw) - 1):
        bad.write_bytes(raw[:cut])
        with pytest.raises(mx.MXNetError, match="corrupt NDArray file|unexpected end"):
            mx.nd.load(str(bad))
    bad.write_bytes(b"not a params file at all, just text")
    with pytest.raises(mx.MXNetError, match="not an MXNet NDArray file"):
        mx.nd.load(str(bad))
    huge = bytearray(raw[:48])
    huge[16:24] = struct.pack("<Q", 1 << 60)  # absurd array count
    bad.write_bytes(bytes(huge))
    with pytest.raises(mx.MXNetError, match="corrupt"):
        mx.nd.load(str(bad))
    with pytest.raises(mx.MXNetError, match="cannot read"):
        mx.nd.load(str(tmp_path / "missing.params"))


def test_failed_save_leaves_existing_file_untouched(tmp_path):
    f = tmp_path / "keep.params"
    mx.nd.save(str(f), [mx.nd.ones((2,))])
    before = f.read_bytes()
    with pytest.raises(TypeError):
        mx.nd.save(str(f), {"a": np.ones(2)})
    with pytest.raises(mx.MXNetError, match="cannot write"):
        mx.nd.save(str(tmp_path / "no_such_dir" / "x.params"), [mx.nd.ones((2,))])
    assert f.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["keep.params"]
