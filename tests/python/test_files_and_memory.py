"""Files and memory under bad input: saves that never clobber what they should not, clear errors for
corrupt files, and a memory pool that gives memory back.

Whatever could crash or hang (loading corrupt files, opening a FIFO, measuring resident memory)
runs in a child process with a timeout, so that a crash or a hang is a test failure, not a dead
or stuck test session.
"""

import json
import os
import stat
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import oxnet as mx


def _run_child(code, env=None, timeout=120):
    """Run `code` in a fresh Python; returns the completed process (never raises on failure)."""
    child_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=child_env)


def _sample_arrays():
    return {"arg:weight": mx.nd.array(np.arange(6, dtype=np.float32).reshape(2, 3)),
            "aux:counts": mx.nd.array([1, -2, 3], dtype="int64")}


# ---- saves ---------------------------------------------------------------------------------------

def test_save_follows_a_symlink_and_replaces_its_target(tmp_path):
    target = tmp_path / "real.params"
    target.write_bytes(b"old contents")
    link = tmp_path / "link.params"
    link.symlink_to("real.params")
    mx.nd.save(str(link), _sample_arrays())
    assert link.is_symlink() and os.readlink(link) == "real.params", "the link still points where it did"
    assert target.read_bytes() == mx.nd.save_tobuffer(_sample_arrays())
    # A dangling link is followed to the file it names.
    dangling = tmp_path / "dangling.params"
    dangling.symlink_to(tmp_path / "created.params")
    mx.nd.save(str(dangling), [mx.nd.ones((2,))])
    assert dangling.is_symlink() and mx.nd.load(str(tmp_path / "created.params"))[0].shape == (2,)
    # Symbol JSON takes the same path.
    sym_link = tmp_path / "net-symbol.json"
    sym_link.symlink_to("net-real.json")
    mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=3, name="fc").save(str(sym_link))
    assert sym_link.is_symlink() and mx.sym.load(str(tmp_path / "net-real.json")).list_arguments()[0] == "data"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "created.params", "dangling.params", "link.params", "net-real.json", "net-symbol.json", "real.params"]


def test_save_to_dev_null_writes_in_place():
    mx.nd.save("/dev/null", _sample_arrays())
    mx.sym.var("x").save("/dev/null")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode), "/dev/null is still the character device"


def test_save_to_a_fifo_writes_in_place(tmp_path):
    fifo = tmp_path / "pipe.params"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    try:
        writer = _run_child("""
            import oxnet as mx, numpy as np
            mx.nd.save(%r, {"arg:w": mx.nd.array(np.arange(6, dtype=np.float32).reshape(2, 3))})
        """ % str(fifo), timeout=60)
        received, _ = reader.communicate(timeout=60)
    finally:
        if reader.poll() is None:
            reader.kill()
    assert writer.returncode == 0, writer.stderr
    assert received == mx.nd.save_tobuffer({"arg:w": mx.nd.array(np.arange(6, dtype=np.float32).reshape(2, 3))})
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode), "the FIFO was not replaced by a regular file"


def test_save_keeps_the_old_file_and_its_permissions(tmp_path):
    f = tmp_path / "private.params"
    mx.nd.save(str(f), [mx.nd.ones((2,))])
    os.chmod(f, 0o600)
    mx.nd.save(str(f), _sample_arrays())
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o600
    with pytest.raises(mx.MXNetError, match="is a directory"):
        mx.nd.save(str(tmp_path), [mx.nd.ones((2,))])


def test_a_save_that_fails_midway_leaves_the_old_file_intact(tmp_path):
    """A write that fails after part of the data went out (the file size limit here, which works
    even for root, unlike permissions) must leave the previous file as it was."""
    f = tmp_path / "model.params"
    mx.nd.save(str(f), [mx.nd.ones((4,))])
    before = f.read_bytes()
    child = _run_child("""
        import resource, signal
        import oxnet as mx
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # report EFBIG instead of being killed
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        for save in (lambda: mx.nd.save(%(f)r, [mx.nd.ones((100000,))]),
                     lambda: mx.sym.var("x" * 10000).save(%(f)r)):
            try:
                save()
            except mx.MXNetError as e:
                print("ERROR", e)
            else:
                print("SAVED")
    """ % {"f": str(f)})
    assert child.returncode == 0, child.stderr
    lines = child.stdout.splitlines()
    assert len(lines) == 2 and all(l.startswith("ERROR") and str(f) in l for l in lines), child.stdout
    assert f.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.params"], "no temporary file left behind"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_save_into_a_read_only_directory_fails_and_keeps_the_file(tmp_path):
    f = tmp_path / "model.params"
    mx.nd.save(str(f), [mx.nd.ones((4,))])
    before = f.read_bytes()
    os.chmod(tmp_path, 0o555)
    try:
        with pytest.raises(mx.MXNetError, match="cannot write '%s'" % f):
            mx.nd.save(str(f), [mx.nd.ones((8,))])
    finally:
        os.chmod(tmp_path, 0o755)
    assert f.read_bytes() == before


# ---- corrupt .params files -----------------------------------------------------------------------

# Loads each file named on stdin (a JSON list) and prints one JSON line per file: {"start": i} before
# the load, then its outcome and the peak resident memory so far.
_LOAD_CHILD = """
    import json, resource, sys
    import oxnet as mx
    for i, path in enumerate(json.load(sys.stdin)):
        print(json.dumps({"start": i}), flush=True)
        try:
            loaded = mx.nd.load(path)
            arrays = loaded.values() if isinstance(loaded, dict) else loaded
            for a in arrays:
                a.asnumpy()
            outcome = {"case": i, "ok": True}
        except mx.MXNetError as e:
            outcome = {"case": i, "ok": False, "error": str(e)}
        outcome["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        print(json.dumps(outcome), flush=True)
"""


def _load_in_child(paths):
    """The outcome of loading each path in one child process; a crash names the case it hit."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_LOAD_CHILD)], input=json.dumps([str(p) for p in paths]),
                          capture_output=True, text=True, timeout=300)
    lines = [json.loads(l) for l in proc.stdout.splitlines() if l.startswith("{")]
    outcomes = [l for l in lines if "case" in l]
    if proc.returncode != 0 or len(outcomes) != len(paths):
        started = [l["start"] for l in lines if "start" in l]
        crashed = paths[started[-1]] if started else None
        pytest.fail("loading %s ended the process (exit %s): %s" % (crashed, proc.returncode, proc.stderr[-2000:]))
    return outcomes


def _assert_clear(outcome, path):
    """A load either succeeds or raises MXNetError naming the file, the offset and what was wrong."""
    if outcome["ok"]:
        return
    message = outcome["error"]
    assert str(path) in message, message
    assert "corrupt NDArray file or not an MXNet NDArray file: at byte " in message or "not supported" in message, message
    assert outcome["peak_rss_mb"] < 1024, "a corrupt count made the loader allocate: %s" % outcome


def _valid_file_bytes():
    return bytes(mx.nd.save_tobuffer(_sample_arrays()))


def test_corrupt_params_name_the_file_the_offset_and_the_expectation(tmp_path):
    good = _valid_file_bytes()
    # Layout: header 24 bytes; array 0 at 24: magic, storage type (28), ndim (32), two dims (36),
    # device type and id (52), dtype flag (60), data; ...; then the names: a count and each name's
    # length and bytes.
    names_at = len(good) - (8 + sum(8 + len(n) for n in _sample_arrays()))
    cases = {
        "empty": (b"", "at byte 0 of 0, expected the file header (8 bytes) but only 0 bytes remain"),
        "truncated": (good[:40], "at byte 36 of 40, expected a dimension (8 bytes) but only 4 bytes remain"),
        "text": (b"just some text, not parameters", "the header is 0x6d6f73207473756a, expected the magic number 0x112"),
        "array count": (good[:16] + struct.pack("<Q", 7451598621833782118) + good[24:],
                        "at byte 16 of %d, the number of arrays is 7451598621833782118" % len(good)),
        "dimensions": (good[:32] + struct.pack("<I", 305419896) + good[36:],
                       "at byte 32 of %d, the number of dimensions is 305419896, expected at most 32" % len(good)),
        "negative dim": (good[:36] + struct.pack("<q", -5) + good[44:], "dimension 0 is -5, expected a size >= 0"),
        "storage type": (good[:28] + struct.pack("<i", 9) + good[32:],
                         "at byte 28 of %d, the storage type is 9, expected 0 (dense)" % len(good)),
        "array magic": (good[:24] + b"\xde\xad\xbe\xef" + good[28:], "an array starts with 0xefbeadde, expected the magic number"),
        "dtype": (good[:60] + struct.pack("<i", 77) + good[64:], "at byte 60 of %d, the dtype flag is 77, expected one of 0 float32" % len(good)),
        "data size": (good[:36] + struct.pack("<q", 1 << 40) + good[44:],
                      "at byte 64 of %d, an array of shape (1099511627776, 3) and dtype float32 needs 13194139533312 bytes" % len(good)),
        "empty but unaddressable": (good[:36] + struct.pack("<qq", 1 << 61, 0) + good[52:],
                                    "at byte 32 of %d, the dimensions (2305843009213693952, 0) multiply past the address space" % len(good)),
        "name count": (good[:names_at] + struct.pack("<Q", 5) + good[names_at + 8:],
                       "at byte %d of %d, the number of names is 5, expected 0 or 2 (one per array)" % (names_at, len(good))),
        "name length": (good[:names_at + 8] + struct.pack("<Q", 1 << 62) + good[names_at + 16:],
                        "at byte %d of %d, a name length is 4611686018427387904" % (names_at + 8, len(good))),
    }
    paths = []
    for i, (data, _) in enumerate(cases.values()):
        paths.append(tmp_path / ("case%d.params" % i))
        paths[-1].write_bytes(data)
    for (name, (_, expected)), path, outcome in zip(cases.items(), paths, _load_in_child(paths)):
        assert not outcome["ok"], "%s: a corrupt file loaded" % name
        _assert_clear(outcome, path)
        assert expected in outcome["error"], "%s: %s" % (name, outcome["error"])


def test_every_truncation_of_a_params_file_is_a_clear_error(tmp_path):
    good = _valid_file_bytes()
    paths = []
    for cut in range(len(good)):
        paths.append(tmp_path / ("cut%d.params" % cut))
        paths[-1].write_bytes(good[:cut])
    for path, outcome in zip(paths, _load_in_child(paths)):
        assert not outcome["ok"], "%s loaded" % path.name
        _assert_clear(outcome, path)


_MUTATION = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10 ** 6), st.integers(0, 7)),
    st.tuples(st.just("u64"), st.integers(0, 10 ** 6), st.integers(0, 2 ** 64 - 1)),
    st.tuples(st.just("cut"), st.integers(0, 10 ** 6), st.just(0)),
)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(st.lists(_MUTATION, min_size=1, max_size=3), min_size=40, max_size=40))
def test_randomly_corrupted_params_never_crash(tmp_path, mutation_sets):
    """Bit flips, overwritten 8-byte fields and truncations, a few at a time, in one child per example."""
    good = _valid_file_bytes()
    paths = []
    for i, mutations in enumerate(mutation_sets):
        data = bytearray(good)
        for kind, where, value in mutations:
            if not data:
                break
            at = where % len(data)
            if kind == "flip":
                data[at] ^= 1 << value
            elif kind == "u64":
                data[at:at + 8] = struct.pack("<Q", value)[:len(data) - at]
            else:
                del data[at:]
        paths.append(tmp_path / ("mutated%d.params" % i))
        paths[-1].write_bytes(bytes(data))
    for path, outcome in zip(paths, _load_in_child(paths)):
        _assert_clear(outcome, path)


# ---- symbol files and losses ---------------------------------------------------------------------

def _graph(inputs_of_sin, heads):
    return json.dumps({"nodes": [{"op": "null", "name": "x", "inputs": []},
                                 {"op": "sin", "name": "s", "inputs": inputs_of_sin}],
                       "arg_nodes": [0], "heads": heads})


def test_bad_symbol_json_names_the_node_and_the_problem(tmp_path):
    for inputs, heads, expected in [
        ([[5, 0, 0]], [[1, 0, 0]], ["node 1 ('s')", "refers to node 5"]),
        ([[-1, 0, 0]], [[1, 0, 0]], ["node 1 ('s')", "non-negative"]),
        ([[0, 3, 0]], [[1, 0, 0]], ["node 1 ('s')", "output 3 of node 'x'"]),
        ([[0, 0, 0]], [[9, 0, 0]], ["heads", "refers to node 9"]),
    ]:
        with pytest.raises(mx.MXNetError) as info:
            mx.sym.load_json(_graph(inputs, heads))
        assert all(part in str(info.value) for part in expected), str(info.value)
    f = tmp_path / "bad-symbol.json"
    f.write_text(_graph([[5, 0, 0]], [[1, 0, 0]]))
    with pytest.raises(mx.MXNetError, match="load '%s': .*refers to node 5" % f):
        mx.sym.load(str(f))


def test_a_symbol_file_that_is_not_text_names_the_file(tmp_path):
    f = tmp_path / "model-symbol.json"
    f.write_bytes(b'{"nodes": [\xff\xfe]}')
    with pytest.raises(mx.MXNetError, match=r"load '%s': not a symbol JSON file: the byte at offset 11 \(0xff\)" % f):
        mx.sym.load(str(f))


def test_loss_with_mismatched_shapes_names_the_loss_and_both_shapes():
    with pytest.raises(mx.MXNetError, match=r"L2Loss: label of shape \(4, 2\) does not match pred of shape \(4, 3\)"):
        mx.gluon.loss.L2Loss()(mx.nd.ones((4, 3)), mx.nd.ones((4, 2)))
    # A label of the same size in another layout is reshaped, as in MXNet.
    assert mx.gluon.loss.L2Loss()(mx.nd.ones((4, 3)), mx.nd.ones((12,))).shape == (4,)
    hybrid = mx.gluon.loss.L2Loss()
    hybrid.hybridize()
    with pytest.raises(mx.MXNetError, match=r"reshape_like.*\(4, 2\).*\(4, 3\)"):
        hybrid(mx.nd.ones((4, 3)), mx.nd.ones((4, 2))).wait_to_read()


# ---- memory goes back ----------------------------------------------------------------------------

# 1000 arrays of 1 MiB created and deleted; prints the resident memory (MB, from /proc/self/status)
# at the start, at the peak, after the arrays are gone, and after what EXTRA does.
_RSS_CHILD = """
    import json, os, time
    def rss_mb():
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) // 1024 for l in f if l.startswith("VmRSS:"))
    import oxnet as mx
    mx.nd.ones((1,)).wait_to_read()
    start = rss_mb()
    arrays = [mx.nd.ones((256 * 1024,)) for _ in range(1000)]
    mx.nd.waitall()
    peak = rss_mb()
    del arrays
    mx.nd.waitall()
    deleted = rss_mb()
    %s
    print(json.dumps({"start": start, "peak": peak, "deleted": deleted, "after": rss_mb(),
                      "pooled": mx._core.cpu_pool_stats()[1]}))
"""


def _rss_run(extra, env=None):
    child = _run_child(_RSS_CHILD % extra, env=env)
    assert child.returncode == 0, child.stderr
    return json.loads(child.stdout.splitlines()[-1])


def test_empty_cache_gives_the_memory_back():
    rss = _rss_run("mx.cpu().empty_cache()", env={"OXNET_CPU_MEM_POOL_IDLE_MS": "0"})
    assert rss["peak"] - rss["start"] > 900, rss
    assert rss["deleted"] - rss["start"] > 900, "without idle release the pool keeps the blocks: %s" % rss
    assert rss["after"] - rss["start"] < 100 and rss["pooled"] == 0, rss


def test_idle_blocks_go_back_without_being_asked():
    rss = _rss_run("time.sleep(1.5)", env={"OXNET_CPU_MEM_POOL_IDLE_MS": "200"})
    assert rss["after"] - rss["start"] < 100 and rss["pooled"] == 0, rss


def test_the_pool_limit_caps_what_is_kept():
    rss = _rss_run("", env={"OXNET_CPU_MEM_POOL_IDLE_MS": "0", "OXNET_CPU_MEM_POOL_LIMIT_MB": "64"})
    assert rss["pooled"] <= 64 << 20, rss
    assert rss["deleted"] - rss["start"] < 100, rss


def test_the_reserve_returns_free_blocks_before_taking_more():
    """With MXNET_CPU_MEM_POOL_RESERVE=100 no new memory can be taken without eating into the
    reserve, so the pool returns its free blocks first, whatever their size."""
    child = _run_child("""
        import oxnet as mx
        a = mx.nd.ones((1 << 18,)); a.wait_to_read(); del a
        before = mx._core.cpu_pool_stats()[1]
        b = mx.nd.ones((1 << 20,)); b.wait_to_read()
        print(before, mx._core.cpu_pool_stats()[1])
    """, env={"OXNET_CPU_MEM_POOL_IDLE_MS": "0", "MXNET_CPU_MEM_POOL_RESERVE": "100"})
    assert child.returncode == 0, child.stderr
    before, after = map(int, child.stdout.split())
    assert before >= 1 << 20 and after < 1 << 20, child.stdout
