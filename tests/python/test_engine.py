"""The dependency engine as Python sees it: asynchronous errors, waits, threads, engine selection."""

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import oxnet as mx
from oxnet.test_utils import same


def _failing_take(ctx):
    data = mx.nd.ones((4, 3), ctx=ctx)
    return mx.nd.take(data, mx.nd.array([0, 7], ctx=ctx), mode="raise")


def test_kernel_error_is_raised_at_the_sync_point_with_op_shapes_and_site(ctx):
    out = _failing_take(ctx)  # pushing succeeds: the kernel fails later, on a worker
    with pytest.raises(mx.MXNetError) as info:
        out.asnumpy()
    msg = str(info.value)
    assert "index 7 is out of bounds" in msg
    assert "operator take((4, 3) float32, (2,) float32)" in msg
    assert "test_engine.py:" in msg  # where the failing op was pushed from

    # A reader of a failed array inherits its error while it is unreported. An error is raised
    # once (as in MXNet): not again by waitall, nor by the array it was raised through.
    failed = _failing_take(ctx)
    dependent = failed + 1
    with pytest.raises(mx.MXNetError, match="out of bounds"):
        dependent.wait_to_read()
    mx.nd.waitall()
    failed.wait_to_read()
    _failing_take(ctx)
    with pytest.raises(mx.MXNetError, match="out of bounds"):
        mx.nd.waitall()
    mx.nd.waitall()
    # Overwriting the array makes it valid again.
    out[:] = 2
    assert same(out, np.full((2, 3), 2))


def test_a_queued_kernel_error_names_the_line_that_pushed_it(ctx):
    # Big enough to be queued for a worker rather than run at once: the push site must be taken
    # when the op is pushed, not when it fails.
    data = mx.nd.ones((4, 3), ctx=ctx)
    indices = mx.nd.array(np.full(20000, 7), ctx=ctx)
    line = sys._getframe().f_lineno + 1
    out = mx.nd.take(data, indices, mode="raise")
    with pytest.raises(mx.MXNetError) as info:
        out.asnumpy()
    assert "test_engine.py:%d" % line in str(info.value)


def test_invalid_sampler_parameters_fail_at_the_sync_point_not_at_the_call(ctx):
    bad = mx.nd.random.normal(0, -1, shape=(2, 2), ctx=ctx)  # pushing succeeds, as in MXNet
    first_row, second_row = bad                                # views share the failed array
    with pytest.raises(mx.MXNetError, match="scale must be >= 0"):
        first_row.asnumpy()
    second_row.asnumpy()  # reported once: the other view of the same array no longer raises
    mx.nd.waitall()


def test_waitall_reports_an_unseen_error_once_and_clears_it_everywhere(ctx):
    bad = mx.nd.random.uniform(1, 0, shape=(3,), ctx=ctx)
    reader = mx.nd.dot(bad, bad)
    with pytest.raises(mx.MXNetError, match="must not exceed"):
        mx.nd.waitall()
    mx.nd.waitall()
    reader.wait_to_read()
    bad.asnumpy()


def test_an_unreported_random_failure_fails_later_random_ops_until_reported(ctx):
    # Random operators share the generator's engine var (MXNet's random resource), so a later
    # random op inherits an earlier one's unreported failure; reporting it once clears it.
    mx.nd.random.normal(0, -1, shape=(2,), ctx=ctx)
    later = mx.nd.random.normal(0, 1, shape=(2,), ctx=ctx)
    with pytest.raises(mx.MXNetError, match="scale must be >= 0"):
        later.asnumpy()
    mx.nd.waitall()
    assert mx.nd.random.normal(0, 1, shape=(2,), ctx=ctx).asnumpy().shape == (2,)


def _fail_into(out):
    """Push an op that fails on a worker while writing `out` (as `take(..., out=out)` with a bad index)."""
    data = mx.nd.ones((4, 3), ctx=out.context)
    mx.nd.take(data, mx.nd.array([0, 7], ctx=out.context), mode="raise", out=out)


def _raises_once(array):
    """`array` raises its inherited error at the next sync point, and only there (as in MXNet)."""
    with pytest.raises(mx.MXNetError, match="index 7 is out of bounds"):
        array.asnumpy()
    array.asnumpy()
    mx.nd.waitall()


def test_in_place_add_on_a_failed_array_raises_instead_of_succeeding_on_garbage(ctx):
    x = mx.nd.zeros((2, 3), ctx=ctx)
    _fail_into(x)
    x += 1                 # reads and writes x: inherits the failure, does not clear it
    _raises_once(x)
    x[:] = 5               # once raised, fresh data makes x valid again
    x += 1
    assert same(x, np.full((2, 3), 6))


def test_out_into_a_failed_array_raises_at_the_next_sync_point(ctx):
    y = mx.nd.zeros((2, 3), ctx=ctx)
    _fail_into(y)
    ones = mx.nd.ones((2, 3), ctx=ctx)
    mx.nd.elemwise_add(ones, ones, out=y)  # MXNet fails an op whose output holds an unraised error
    _raises_once(y)
    mx.nd.elemwise_add(ones, ones, out=y)
    assert same(y, np.full((2, 3), 2))


def test_in_place_optimizer_update_with_a_failed_gradient_raises_once(ctx):
    weight = mx.nd.ones((2, 3), ctx=ctx)
    grad = mx.nd.zeros((2, 3), ctx=ctx)
    _fail_into(grad)
    mx.nd.sgd_update(weight, grad, out=weight, lr=0.1)
    _raises_once(weight)
    grad.asnumpy()  # the same failure, already raised through the weight
    # A momentum update writes two arrays: the failure reaches both, and is raised once for both.
    mom = mx.nd.zeros((2, 3), ctx=ctx)
    _fail_into(grad)
    mx.nd.sgd_mom_update(weight, grad, mom, out=weight, lr=0.1, momentum=0.9)
    _raises_once(mom)
    weight.asnumpy()
    grad[:] = 1
    weight[:] = 1
    mx.nd.sgd_update(weight, grad, out=weight, lr=0.5)
    assert same(weight, np.full((2, 3), 0.5))


def test_scopes_assigned_on_the_class_are_per_thread():
    from oxnet.attribute import AttrScope
    from oxnet.name import NameManager
    previous_attr, previous_names = AttrScope.current, NameManager.current
    try:
        AttrScope.current = AttrScope(group="main")
        NameManager.current = NameManager()
        NameManager.current.get(None, "main_thread")
        seen = {}

        def worker():
            seen["attr"] = dict(AttrScope.current._attr)
            seen["names"] = dict(NameManager.current._counter)
            AttrScope.current = AttrScope(group="worker")
            with mx.name.Prefix("w_"):
                seen["symbol"] = mx.sym.FullyConnected(mx.sym.var("x"), num_hidden=2).name

        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
        assert seen == {"attr": {}, "names": {}, "symbol": "w_fullyconnected0"}
        assert AttrScope.current._attr == {"group": "main"}
        assert "main_thread" in NameManager.current._counter
    finally:
        AttrScope.current, NameManager.current = previous_attr, previous_names


def test_read_after_write_and_write_after_read_through_views(ctx):
    x = mx.nd.zeros((256, 256), ctx=ctx)
    total = mx.nd.zeros((1,), ctx=ctx)
    for i in range(50):
        x[i % 256] = float(i)          # write through a view of x
        mx.nd.sum(x, out=total)       # read of x ordered after the write
        x += 1                        # write ordered after the read
    expected = np.zeros((256, 256))
    for i in range(50):
        expected[i % 256] = i
        s = expected.sum()
        expected += 1
    assert same(x, expected)
    assert total.asscalar() == pytest.approx(s)


def test_pushes_from_many_python_threads(ctx):
    results = {}

    def work(k):
        acc = mx.nd.zeros((64,), ctx=ctx)
        one = mx.nd.ones((64,), ctx=ctx)
        for _ in range(300):
            acc += one * k
        results[k] = acc.asnumpy()

    threads = [threading.Thread(target=work, args=(k,)) for k in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in range(1, 5):
        assert np.array_equal(results[k], np.full(64, 300.0 * k))


def test_waiting_releases_the_gil(ctx):
    a = mx.nd.random.uniform(shape=(1024, 1024), ctx=ctx)
    mx.nd.waitall()
    outs = [mx.nd.dot(a, a) for _ in range(8)]
    ticks = 0
    done = threading.Event()

    def waiter():
        outs[-1].wait_to_read()
        done.set()

    t = threading.Thread(target=waiter)
    t.start()
    while not done.is_set():
        ticks += 1  # runs only if the waiting thread let go of the GIL
        time.sleep(0)
    t.join()
    assert ticks > 0


def _run(code, **env):
    full_env = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=120)


def test_engine_selection_and_thread_count_from_environment():
    code = "import oxnet as mx; print(*mx._core.engine_info())"
    assert _run(code, OXNET_ENGINE_TYPE="NaiveEngine").stdout.split() == ["NaiveEngine", _run(code).stdout.split()[1]]
    assert _run(code, MXNET_ENGINE_TYPE="NaiveEngine").stdout.split()[0] == "NaiveEngine"
    assert _run(code, MXNET_CPU_WORKER_NTHREADS="3").stdout.split() == ["ThreadedEngine", "3"]
    assert _run(code, OMP_NUM_THREADS="1").stdout.split()[1] == "1"
    default = int(_run(code, OMP_NUM_THREADS="", MXNET_CPU_WORKER_NTHREADS="").stdout.split()[1])
    assert default == os.cpu_count()


def test_naive_engine_raises_at_the_failing_call():
    code = (
        "import oxnet as mx\n"
        "d = mx.nd.ones((4, 3))\n"
        "try:\n"
        "    mx.nd.take(d, mx.nd.array([9]), mode='raise')\n"
        "    print('no error')\n"
        "except mx.MXNetError as e:\n"
        "    print('raised', 'out of bounds' in str(e))\n"
        "print((d + 1).asnumpy().sum())\n"
    )
    r = _run(code, OXNET_ENGINE_TYPE="NaiveEngine")
    assert r.stdout.split() == ["raised", "True", "24.0"], r.stderr


def test_many_small_ops_then_waitall(ctx):
    x = mx.nd.ones((2, 2), ctx=ctx)
    for _ in range(2000):
        x = x + 1
    mx.nd.waitall()
    assert same(x, np.full((2, 2), 2001))
