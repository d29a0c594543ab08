"""Child process of the bad-input tests: runs operator calls and reports each outcome as a JSON line.

A crash of the process (a Rust panic that aborts, a segfault) must be a test failure, not a dead
pytest, so the tests run this file with ``python bad_input_worker.py <mode> ...`` and read its
output. Before each call it prints ``{"start": case}``, so the parent knows which case was running
when the process died.

Modes:
  sweep FIRST: every registered operator (from index FIRST of ``mx._core.list_ops()``) called with
    zero-size inputs; a call must raise MXNetError or return a result that does not depend on what
    the memory it was given held before (checked by running it again after filling the memory pool
    with two different patterns).
  cases: Python snippets read as a JSON list from stdin, each run on its own; a snippet must raise
    MXNetError or finish.
"""

import json
import sys

import numpy as np

import oxnet as mx
from oxnet.base import MXNetError

# Values for parameters an operator requires (no default), by parameter name; chosen small and
# valid so that the calls reach shape inference and the kernel.
REQUIRED_PARAMS = {
    "N": 2, "a_max": 1.0, "a_min": -1.0, "act_type": "relu", "alpha": (0.1, 0.1, 0.1),
    "block_size": 2, "brightness": 0.1, "contrast": 0.1, "depth": 3, "dtype": "float32", "eps": 1e-5,
    "eta": 1.0, "height": 1, "hue": 0.1, "input_dim": 3, "kernel": (1, 1), "kind": "linear", "lr": 0.1,
    "lrs": (0.1,), "max_factor": 1.5, "min_factor": 0.5, "mode": "rnn_tanh", "nsize": 3, "num": 3,
    "num_args": 2, "num_arrays": 2, "num_filter": 2, "num_hidden": 2, "num_layers": 1, "num_outputs": 1,
    "output_dim": 2, "pad_width": (0, 0, 0, 0, 1, 1, 1, 1), "repeats": 2, "reps": (2,),
    "sample_type": "nearest", "saturation": 0.1, "scale": 2, "shape": (2, 0), "start": 0.0,
    "state_size": 2, "stop": 1.0, "t": 1, "value": 1.0, "wd": 0.0, "wds": (0.0,), "width": 1, "x": 0, "y": 0,
}
# Parameters whose required value depends on its type (an int axis or a tuple of them).
REQUIRED_BY_TYPE = {
    ("axis", "int"): 0, ("axis", "tuple of int"): (0,), ("begin", "int"): 0, ("end", "int"): 1,
    ("begin", "tuple of int or None"): (0,), ("end", "tuple of int or None"): (1,),
}
# Operators that run user code (no sample makes sense without registering a Python class).
SKIPPED = {"Custom", "_CachedOp"}

ZERO_SIZE_SHAPES = [(0,), (2, 0), (0, 3), (2, 0, 3), (0, 2, 4, 4), (2, 2, 0, 4), (1, 2, 3, 0)]


def required_params(params):
    values = {}
    for name, type_name, default, _doc in params:
        if default is not None:
            continue
        if (name, type_name) in REQUIRED_BY_TYPE:
            values[name] = REQUIRED_BY_TYPE[(name, type_name)]
        elif name in REQUIRED_PARAMS:
            values[name] = REQUIRED_PARAMS[name]
        else:
            return None
    return values


def num_inputs(name, params):
    """The operator's input count, as a symbol built with these parameters lists them."""
    sym = getattr(mx.sym, name, None) or getattr(mx.sym._internal, name, None)
    if sym is None:
        return None
    built = sym(**params)
    return len(built.list_arguments()) + len(built.list_auxiliary_states())


def input_sets(count):
    """Zero-size input combinations: all inputs alike, and a zero-size first input with small or
    empty companions (weights, biases, indices)."""
    for shape in ZERO_SIZE_SHAPES:
        yield [shape] * count
        if count > 1:
            yield [shape] + [(2,)] * (count - 1)
            yield [shape] + [(shape[-1],)] * (count - 1)


def fill_pool(value):
    """Leave freed buffers of every small size class in the memory pool, holding `value`."""
    arrays = [mx.nd.full((n,), value) for n in range(16, 16 * 65, 16) for _copy in range(4)]
    arrays += [mx.nd.full((n,), value) for n in (2048, 4096, 8192, 16384) for _copy in range(2)]
    mx.nd.waitall()
    del arrays


def call(name, shapes, params):
    mx.random.seed(7)
    inputs = [mx.nd.array(np.full(s, 0.5, dtype=np.float32)) for s in shapes]
    out = getattr(mx.nd, name, None) or getattr(mx.nd._internal, name)
    result = out(*inputs, **params)
    results = result if isinstance(result, (list, tuple)) else [result]
    return [r.asnumpy() for r in results]


def report(**fields):
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def outcome(name, shapes, params):
    """'error' (MXNetError), 'empty', 'value' (the same result whatever the pool held before) or
    a failure description."""
    try:
        first = call(name, shapes, params)
    except (MXNetError, IndexError) as e:
        # IndexError is what oxnet (like MXNet's Python layer) raises for an index out of range.
        # A panic caught in a worker surfaces as an MXNetError, but it is a bug all the same.
        return "panicked: " + str(e).splitlines()[0][:300] if "panicked" in str(e) else "error"
    except Exception as e:  # noqa: BLE001 - any other exception type is what the test reports
        return "raised %s: %s" % (type(e).__name__, str(e).splitlines()[0][:200] if str(e) else "")
    if all(r.size == 0 for r in first):
        return "empty"
    runs = []
    for poison in (np.nan, 12345.0):
        fill_pool(poison)
        runs.append(call(name, shapes, params))
    for a, b in zip(*runs):
        if a.shape != b.shape or not np.array_equal(a, b, equal_nan=True):
            return "uninitialised: results differ with the memory pool's previous contents: %r vs %r" % (
                a.ravel()[:4].tolist(), b.ravel()[:4].tolist())
    return "value"


def sweep(first):
    ops = sorted(mx._core.list_ops())
    for index in range(first, len(ops)):
        name, _aliases, _doc, _variadic, params = ops[index]
        if name in SKIPPED:
            continue
        values = required_params(params)
        if values is None:
            report(index=index, op=name, skipped="no sample for a required parameter")
            continue
        try:
            count = num_inputs(name, values)
        except MXNetError:
            count = None
        if count is None:
            report(index=index, op=name, skipped="no symbol")
            continue
        for shapes in input_sets(count) if count else [[]]:
            case = {"index": index, "op": name, "shapes": shapes, "params": {k: repr(v) for k, v in values.items()}}
            report(start=case)
            report(case=case, outcome=outcome(name, shapes, values))


def cases():
    for snippet in json.load(sys.stdin):
        report(start=snippet)
        try:
            exec(compile(snippet, "<case>", "exec"), {"mx": mx, "np": np})
            result = "ok"
        except (MXNetError, IndexError) as e:
            message = str(e).splitlines()[0][:300]
            result = ("panicked: " if "panicked" in message else "error: ") + message
        except Exception as e:  # noqa: BLE001 - reported to the parent, which judges it
            result = "raised %s: %s" % (type(e).__name__, str(e).splitlines()[0][:300] if str(e) else "")
        report(case=snippet, outcome=result)


if __name__ == "__main__":
    if sys.argv[1] == "sweep":
        sweep(int(sys.argv[2]))
    else:
        cases()
