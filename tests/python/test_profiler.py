"""mx.profiler: the engine's trace (lanes, overlap, call sites, waits, memory), aggregate stats,
the host's profiling objects, and MXNet's configuration surface."""

import json
import warnings

import numpy as np
import pytest

import oxnet as mx
from oxnet import profiler


@pytest.fixture(autouse=True)
def stopped_profiler():
    yield
    profiler.set_state("stop")
    # Nothing is left for the exit-time dump to write into the working directory.
    profiler.set_config(continuous_dump=False)
    profiler.dumps(reset=True)


def profile(path, work, **config):
    """Run ``work`` under the profiler; return the trace written to ``path`` and the JSON stats."""
    settings = dict(profile_all=True, aggregate_stats=True, continuous_dump=False)
    settings.update(config)
    profiler.set_config(filename=str(path), **settings)
    profiler.set_state("run")
    profiler.dump(finished=True)  # forget earlier records
    profiler.dumps(reset=True)
    work()
    mx.nd.waitall()
    profiler.set_state("stop")
    profiler.dump(finished=True)
    stats = profiler.dumps(format="json")
    with open(path) as f:
        return json.load(f), (json.loads(stats) if stats else None)


def slices(trace, name=None, cat=None):
    return [e for e in trace["traceEvents"] if e.get("ph") == "X" and (name is None or e["name"] == name)
            and (cat is None or e.get("cat") == cat)]


def lane_names(trace):
    return {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}


def test_independent_dots_overlap_on_two_worker_lanes(tmp_path):
    if mx._core.engine_info()[1] < 2:
        pytest.skip("one engine worker cannot run two operators at once")
    holder = {}

    def work():
        # Both products read outputs of one split, so they become ready at the same instant, when
        # the split ends; two idle workers then take one each.
        source = mx.nd.random.uniform(shape=(2048, 768))
        a, b = mx.nd.split(source, num_outputs=2, axis=0)
        holder["x"] = mx.nd.dot(a, a, transpose_b=True)
        holder["y"] = mx.nd.dot(b, b, transpose_b=True)

    trace, _ = profile(tmp_path / "overlap.json", work)
    dots = slices(trace, "dot")
    assert len(dots) == 2
    (first, second) = sorted(dots, key=lambda e: e["ts"])
    assert first["tid"] != second["tid"], "both products ran on one lane"
    assert second["ts"] < first["ts"] + first["dur"], "the two products did not overlap in time"
    lanes = lane_names(trace)
    assert lanes[first["tid"]].startswith("oxnet-cpu-") and lanes[second["tid"]].startswith("oxnet-cpu-")
    for dot in dots:
        assert "test_profiler.py:" in dot["args"]["pushed from"]
        assert dot["args"]["inputs"] == "(1024, 768) float32, (1024, 768) float32"
        # Pushed while the random fill and the split were still running: each waited in the engine.
        assert dot["args"]["waited in engine (us)"] > 0
    waits = [e for e in trace["traceEvents"] if e.get("cat") == "engine wait" and e["name"] == "dot"]
    assert sorted(e["ph"] for e in waits) == ["b", "b", "e", "e"]


def test_trace_has_call_sites_memory_counters_and_api_calls(tmp_path):
    def work():
        a = mx.nd.ones((64, 64))
        b = mx.nd.sqrt(a)  # the site line below must name this line
        b.asnumpy()

    trace, _ = profile(tmp_path / "trace.json", work)
    sqrt = slices(trace, "sqrt", cat="operator")
    assert len(sqrt) == 1
    line = work.__code__.co_firstlineno + 2
    assert sqrt[0]["args"]["pushed from"] == "%s:%d" % (__file__, line)
    memory = [e for e in trace["traceEvents"] if e.get("ph") == "C" and e["name"] == "Memory: cpu/0"]
    assert memory and all(e["args"]["Memory: cpu/0"] >= 0 for e in memory)
    api = {e["name"] for e in slices(trace, cat="MXNET_C_API")}
    assert {"MXImperativeInvokeEx", "MXNDArraySyncCopyToCPU", "MXNDArrayWaitAll"} <= api
    assert trace["displayTimeUnit"] == "ms"
    # Every event is well formed for trace viewers: a phase, a process, a time (metadata aside).
    for e in trace["traceEvents"]:
        assert "ph" in e and "pid" in e and (e["ph"] == "M" or "ts" in e)


def test_aggregate_json_and_table(tmp_path):
    def work():
        a = mx.nd.ones((10, 10))
        for _ in range(3):
            mx.nd.sqrt(a)
        a + 1

    _, stats = profile(tmp_path / "agg.json", work)
    sqrt = stats["Time"]["operator"]["sqrt"]
    assert sqrt["Count"] == 3
    assert sqrt["Min"] <= sqrt["Avg"] <= sqrt["Max"]
    assert sqrt["Total"] == pytest.approx(sqrt["Avg"] * 3, rel=1e-3, abs=1e-5)
    assert stats["Time"]["operator"]["_plus_scalar"]["Count"] == 1
    assert stats["Time"]["MXNET_C_API"]["MXImperativeInvokeEx"]["Count"] >= 5
    assert stats["Memory"]["Device Storage"]["Memory: cpu/0"]["Count"] > 0
    assert stats["Unit"] == {"Time": "ms", "Memory": "kB"}

    table = profiler.dumps(sort_by="count")
    lines = table.splitlines()
    assert lines[1] == "Profile Statistics:"
    at = lines.index("operator")
    assert lines[at + 1] == "================="
    assert lines[at + 2].split() == ["Name", "Total", "Count", "Time", "(ms)", "Min", "Time", "(ms)", "Max", "Time",
                                     "(ms)", "Avg", "Time", "(ms)"]
    row = next(l for l in lines[at:] if l.startswith("sqrt "))
    assert row[25:41].strip() == "3" and len(row) == 25 + 16 + 4 * 17
    # Sorted by count, descending: sqrt (3) comes before _plus_scalar (1).
    block = lines[at + 4:lines.index("", at)]
    assert [l.split()[0] for l in block].index("sqrt") < [l.split()[0] for l in block].index("_plus_scalar")
    memory = lines.index("Device Storage")
    assert lines[memory + 2].split()[-3:] == ["Avg", "Use", "(kB)"]


def test_dumps_is_empty_without_aggregate_stats(tmp_path):
    profile(tmp_path / "none.json", lambda: mx.nd.ones((2, 2)), aggregate_stats=False)
    assert profiler.dumps() == ""


def test_host_objects_pause_and_resume(tmp_path):
    def work():
        domain = profiler.Domain("test-domain")
        task = domain.new_task("task")
        task.start()
        frame = domain.new_frame("frame")
        frame.start()
        frame.stop()
        task.stop()
        with profiler.Event("event"):
            pass
        counter = domain.new_counter("counter", 5)
        counter += 3
        counter -= 1
        domain.new_marker("marker").mark("thread")
        profiler.pause()
        mx.nd.ones((3, 3)) * 7  # not recorded
        profiler.Event("paused-event").start()
        profiler.resume()

    trace, stats = profile(tmp_path / "objects.json", work)
    events = trace["traceEvents"]
    assert [e["ph"] for e in events if e["name"] == "task"] == ["b", "e"]
    assert [e["ph"] for e in events if e["name"] == "frame" and e["cat"] == "test-domain,frame"] == ["b", "e"]
    assert len(slices(trace, "event", cat="event")) == 1
    assert [e["args"]["counter"] for e in events if e["name"] == "counter"] == [5, 8, 7]
    assert [e["s"] for e in events if e["name"] == "marker" and e["ph"] == "i"] == ["t"]
    assert not slices(trace, "_mul_scalar")
    assert stats["Time"]["test-domain"]["task"]["Count"] == 1
    assert stats["Time"]["test-domain"]["counter"]["Max"] == 8


def test_symbolic_only_skips_imperative_operators(tmp_path):
    x = mx.sym.Variable("x")
    executor = mx.sym.sqrt(x, name="root").simple_bind(mx.cpu(), x=(4, 4))
    dense = mx.gluon.nn.Dense(3)
    dense.initialize()
    dense.hybridize()
    dense(mx.nd.ones((2, 4)))

    def work():
        mx.nd.ones((4, 4)).exp()
        executor.forward()
        dense(mx.nd.ones((2, 4)))  # a hybridized block runs its cached graph

    trace, _ = profile(tmp_path / "symbolic.json", work, profile_all=False, profile_symbolic=True,
                       profile_imperative=False)
    names = {e["name"] for e in slices(trace, cat="operator")}
    assert {"sqrt", "FullyConnected"} <= names and not names & {"exp", "_ones"}


def test_custom_operator_domain(tmp_path):
    class Double(mx.operator.CustomOp):
        def forward(self, is_train, req, in_data, out_data, aux):
            mx.nd.zeros((2, 2))
            self.assign(out_data[0], req[0], in_data[0] * 2)

        def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
            self.assign(in_grad[0], req[0], out_grad[0] * 2)

    @mx.operator.register("profiled_double")
    class DoubleProp(mx.operator.CustomOpProp):
        def __init__(self):
            super(DoubleProp, self).__init__(need_top_grad=True)

        def infer_shape(self, in_shape):
            return in_shape, in_shape, []

        def create_operator(self, ctx, shapes, dtypes):
            return Double()

    def work():
        x = mx.nd.ones((2, 2))
        x.attach_grad()
        with mx.autograd.record():
            y = mx.nd.Custom(x, op_type="profiled_double")
        y.backward()

    _, stats = profile(tmp_path / "custom.json", work)
    custom = stats["Time"]["Custom Operator"]
    assert {"profiled_double::pure_python", "_backward_profiled_double::pure_python",
            "profiled_double::_zeros", "profiled_double::_mul_scalar"} <= set(custom)
    assert custom["profiled_double::_zeros"]["Count"] == 1


def test_scope_tags_operators(tmp_path):
    def work():
        with profiler.scope("encoder") as outer:
            assert outer == "encoder:"
            mx.nd.ones((2, 2)).exp()
            with profiler.scope("layer1", append_mode=True) as inner:
                assert inner == "encoder:layer1:"
                mx.nd.ones((2, 2)).log()
        mx.nd.ones((2, 2)).sin()

    trace, _ = profile(tmp_path / "scope.json", work)
    scope_of = {e["name"]: e["args"].get("scope") for e in slices(trace, cat="operator")}
    assert scope_of["exp"] == "encoder:" and scope_of["log"] == "encoder:layer1:" and scope_of["sin"] is None


def test_configuration_errors_and_deprecated_aliases(tmp_path):
    with pytest.raises(mx.MXNetError, match="bogus"):
        profiler.set_config(bogus=True)
    with pytest.raises(mx.MXNetError, match="profile_api expects a boolean"):
        profiler.set_config(profile_api="sometimes")
    with pytest.raises(KeyError):
        profiler.set_state("go")
    with pytest.raises(AssertionError):
        profiler.dumps(format="xml")
    with pytest.raises(mx.MXNetError, match="scope"):
        profiler.Marker(profiler.Domain("d"), "m").mark("galaxy")
    path = tmp_path / "deprecated.json"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        profiler.profiler_set_config(mode="all", filename=str(path))
        profiler.profiler_set_state("run")
        mx.nd.ones((2, 2)).asnumpy()
        profiler.profiler_set_state("stop")
    assert len(caught) == 3 and all("deprecated" in str(w.message) for w in caught)
    profiler.dump()
    assert slices(json.load(open(path)), "_ones")


def test_profiling_does_not_change_results(tmp_path):
    data = np.random.RandomState(0).rand(16, 16).astype(np.float32)
    expected = np.tanh(data @ data)
    result = {}
    profile(tmp_path / "same.json", lambda: result.setdefault("y", mx.nd.tanh(mx.nd.dot(mx.nd.array(data), mx.nd.array(data)))))
    np.testing.assert_allclose(result["y"].asnumpy(), expected, rtol=1e-5)
