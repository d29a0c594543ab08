"""Every MXNet 1.9.1 fixture graph loads, binds with its parameters and reproduces MXNet's
outputs (inference and training) and gradients."""


import numpy as np
import pytest

import oxnet as mx

MODELS = ["mlp", "lenet", "resblock", "lstm", "wolfram", "gluon_mlp"]


def _load_model(fixtures_dir, name, symbol_file=None):
    sym = mx.sym.load(str(fixtures_dir / (symbol_file or "%s-symbol.json" % name)))
    params = mx.nd.load(str(fixtures_dir / ("%s-0000.params" % name)))
    io = mx.nd.load(str(fixtures_dir / ("%s-io.params" % name)))
    if isinstance(params, list):  # a file without parameters loads as an empty list, as in MXNet
        assert not params
        params = {}
    arg_params = {k[4:]: v for k, v in params.items() if k.startswith("arg:")}
    aux_params = {k[4:]: v for k, v in params.items() if k.startswith("aux:")}
    return sym, arg_params, aux_params, io


def _bind(sym, arg_params, aux_params, io, grad_req="write"):
    arg_shapes, _, aux_shapes = sym.infer_shape(**{k: v.shape for k, v in io.items() if ":" not in k})
    args = {}
    for name, shape in zip(sym.list_arguments(), arg_shapes):
        source = arg_params.get(name, io.get(name))
        args[name] = source.copy() if source is not None else mx.nd.zeros(shape)
    grads = {name: mx.nd.zeros(a.shape) for name, a in args.items()}
    aux = [aux_params[name].copy() for name in sym.list_auxiliary_states()]
    return sym.bind(mx.cpu(), args, args_grad=grads, grad_req=grad_req, aux_states=aux)


def _tolerance(name):
    return dict(rtol=1e-3, atol=1e-5) if name in ("lenet", "resblock", "lstm") else dict(rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", MODELS)
def test_fixture_inference_matches_mxnet(fixtures_dir, name):
    sym, arg_params, aux_params, io = _load_model(fixtures_dir, name)
    exe = _bind(sym, arg_params, aux_params, io)
    outputs = exe.forward(is_train=False)
    for i, out in enumerate(outputs):
        np.testing.assert_allclose(out.asnumpy(), io["out:%d" % i].asnumpy(), **_tolerance(name))


@pytest.mark.parametrize("name", [m for m in MODELS if m != "gluon_mlp"])
def test_fixture_training_outputs_and_gradients_match_mxnet(fixtures_dir, name):
    sym, arg_params, aux_params, io = _load_model(fixtures_dir, name)
    exe = _bind(sym, arg_params, aux_params, io)
    outputs = exe.forward(is_train=True)
    for i, out in enumerate(outputs):
        np.testing.assert_allclose(out.asnumpy(), io["train_out:%d" % i].asnumpy(), **_tolerance(name))
    exe.backward([mx.nd.ones(o.shape) for o in outputs])
    checked = 0
    for key, expected in io.items():
        if key.startswith("grad:"):
            got = exe.grad_dict[key[5:]].asnumpy()
            np.testing.assert_allclose(got, expected.asnumpy(), err_msg=key, **_tolerance(name))
            checked += 1
    assert checked > 0


def test_legacy_json_layout_loads_and_matches(fixtures_dir):
    legacy, _, _, io = _load_model(fixtures_dir, "wolfram", "wolfram-legacy-symbol.json")
    current = mx.sym.load(str(fixtures_dir / "wolfram-symbol.json"))
    assert legacy.list_arguments() == current.list_arguments() == ["Input"]
    out = legacy.eval(Input=io["Input"])[0]
    np.testing.assert_allclose(out.asnumpy(), io["out:0"].asnumpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", MODELS)
def test_saved_json_reloads_to_the_same_graph(fixtures_dir, name, tmp_path):
    sym = mx.sym.load(str(fixtures_dir / ("%s-symbol.json" % name)))
    path = tmp_path / "resaved-symbol.json"
    sym.save(str(path))
    again = mx.sym.load(str(path))
    assert again.list_arguments() == sym.list_arguments()
    assert again.list_auxiliary_states() == sym.list_auxiliary_states()
    assert again.list_outputs() == sym.list_outputs()
    assert again.tojson() == sym.tojson()
