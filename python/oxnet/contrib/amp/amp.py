"""Automatic mixed precision (MXNet's ``mxnet.contrib.amp.amp``).

Training: ``init()`` makes the operators AMP's lists name cast their inputs (convolutions and
fully connected layers run in float16 or bfloat16, numerically delicate operators in float32),
``init_trainer(trainer)`` and ``scale_loss(loss, trainer)`` add dynamic loss scaling (a step whose
gradients overflow is skipped). Inference: ``convert_symbol``, ``convert_model`` and
``convert_hybrid_block`` rewrite a float32 graph with ``amp_cast``/``amp_multicast`` nodes.
"""

import contextlib
import logging

import numpy as np

from ... import optimizer as opt
from ...base import bfloat16
from ...context import gpu
from ...gluon import trainer
from ...symbol import Symbol
from ...symbol.symbol import _DTYPE_FLAGS
from . import lists
from . import operator_casts
from . import reduce_precision
from .loss_scaler import LossScaler

__all__ = ["init", "init_trainer", "scale_loss", "unscale", "convert_model", "convert_hybrid_block", "list_lp16_ops",
           "list_fp32_ops", "list_lp16_fp32_ops", "list_conditional_fp32_ops", "list_widest_type_cast",
           "list_loss_output_functions", "list_lp16_use_fp32_params", "convert_symbol"]

_DTYPE_OF_FLAG = {flag: name for name, flag in _DTYPE_FLAGS.items()}

_amp_initialized = False
_amp_loss_scale_initialized = False
_loss_scaler = None


def _lists_of(target_dtype):
    """The list module of a target dtype: 'float16' / np.float16, or 'bfloat16' / MXNet's
    bfloat16 record dtype."""
    if target_dtype in ("float16", np.float16):
        return lists.symbol_fp16
    if (isinstance(target_dtype, str) and target_dtype == "bfloat16") or target_dtype == bfloat16:
        return lists.symbol_bf16
    raise AssertionError("not supported type: %r (AMP supports float16 and bfloat16)" % (target_dtype,))


def _is_bfloat16(target_dtype):
    return _lists_of(target_dtype) is lists.symbol_bf16


def list_lp16_ops(target_dtype):
    """The operators that run in the low precision ``target_dtype``."""
    module = _lists_of(target_dtype)
    return module.BF16_FUNCS if _is_bfloat16(target_dtype) else module.FP16_FUNCS


def list_fp32_ops(target_dtype):
    """The operators that run in float32."""
    return _lists_of(target_dtype).FP32_FUNCS


def list_lp16_fp32_ops(target_dtype):
    """The operators that run in either precision."""
    module = _lists_of(target_dtype)
    return module.BF16_FP32_FUNCS if _is_bfloat16(target_dtype) else module.FP16_FP32_FUNCS


def list_conditional_fp32_ops(target_dtype):
    """(operator, parameter, values): the operators that run in float32 for those values."""
    return _lists_of(target_dtype).CONDITIONAL_FP32_FUNCS


def list_widest_type_cast(target_dtype):
    """The operators whose inputs are cast to the widest float type among them."""
    return _lists_of(target_dtype).WIDEST_TYPE_CASTS


def list_loss_output_functions(target_dtype):
    """The output layers whose gradient AMP scales by the loss scale."""
    return _lists_of(target_dtype).LOSS_OUTPUT_FUNCTIONS


def list_lp16_use_fp32_params(target_dtype):
    """{operator: inputs kept in float32} for bfloat16; None for float16."""
    return lists.symbol_bf16.BF16_USE_FP32_PARAMS if _is_bfloat16(target_dtype) else None


def init(target_dtype="float16", target_precision_ops=None, conditional_fp32_ops=None, fp32_ops=None):
    """Turn AMP on (once; later calls change nothing): from now on the operators of
    ``target_precision_ops`` (default ``list_lp16_ops``) cast their float inputs to
    ``target_dtype`` ('float16' or 'bfloat16'), those of ``fp32_ops`` (default
    ``list_fp32_ops``) to float32, those of ``conditional_fp32_ops`` ((operator, parameter,
    values), default ``list_conditional_fp32_ops``) to float32 when called with one of the
    values, and those of ``list_widest_type_cast`` to the widest float type among their inputs.
    Call it before building the model."""
    global _amp_initialized, _loss_scaler
    if _amp_initialized:
        return
    if not (target_dtype in ("float16", np.float16, "bfloat16") or
            (not isinstance(target_dtype, str) and target_dtype == bfloat16)):
        raise AssertionError("AMP currently supports only float16 or bfloat16 as a target_dtype, got %r"
                             % (target_dtype,))
    _amp_initialized = True
    logging.info("Using AMP")
    dtype = bfloat16 if _is_bfloat16(target_dtype) else np.dtype(np.float16)
    _loss_scaler = LossScaler()
    operator_casts.install(
        dtype,
        target_ops=list_lp16_ops(dtype) if target_precision_ops is None else target_precision_ops,
        fp32_ops=list_fp32_ops(dtype) if fp32_ops is None else fp32_ops,
        conditional_fp32_ops=list_conditional_fp32_ops(dtype) if conditional_fp32_ops is None else conditional_fp32_ops,
        widest_ops=list_widest_type_cast(dtype),
        fp32_params=list_lp16_use_fp32_params(dtype),
        loss_outputs=list_loss_output_functions(dtype),
        loss_scaler=_loss_scaler)


def init_trainer(optimizer_or_trainer):
    """Give a Gluon Trainer dynamic loss scaling (``amp.init`` first): its steps then skip
    updates whose gradients overflow. The first trainer shares the scaler of the imperative
    loss output layers; later ones get their own."""
    global _amp_loss_scale_initialized
    if not _amp_initialized:
        raise AssertionError("AMP not initialized, did you forget to call amp.init()?")
    if not _amp_loss_scale_initialized:
        _amp_loss_scale_initialized = True
        loss_scaler = _loss_scaler
    else:
        loss_scaler = LossScaler()
    if isinstance(optimizer_or_trainer, trainer.Trainer):
        optimizer_or_trainer._amp_loss_scaler = loss_scaler
        optimizer_or_trainer._amp_original_scale = optimizer_or_trainer._scale
    elif isinstance(optimizer_or_trainer, opt.Optimizer):
        raise TypeError("AMP is currently only compatible with Gluon Trainer")
    else:
        raise TypeError("optimizer_or_trainer should be a Gluon Trainer or an optimizer, instead is %s"
                        % type(optimizer_or_trainer))


@contextlib.contextmanager
def scale_loss(loss, optimizer_or_trainer):
    """``with amp.scale_loss(loss, trainer) as scaled: autograd.backward(scaled)``: the loss (or
    list of losses) multiplied by the current loss scale; the trainer's next step divides the
    gradients by it again."""
    if getattr(optimizer_or_trainer, "_amp_loss_scaler", None) is None:
        raise AssertionError("Loss scaler is not initialized, did you forget to call amp.init_trainer()?")
    scale = optimizer_or_trainer._amp_loss_scaler.loss_scale
    optimizer_or_trainer._scale = optimizer_or_trainer._amp_original_scale / scale
    if isinstance(loss, (list, tuple)):
        yield [l * scale for l in loss]
    else:
        yield scale * loss


def unscale(optimizer_or_trainer):
    """Divide the trainer's gradients by the loss scale now (for gradient clipping and other
    uses of the gradients before ``step``)."""
    if isinstance(optimizer_or_trainer, trainer.Trainer):
        for param in optimizer_or_trainer._params:
            for grad in param._grad or []:
                grad[:] *= optimizer_or_trainer._scale
        optimizer_or_trainer._scale = 1.0
    elif isinstance(optimizer_or_trainer, opt.Optimizer):
        raise TypeError("AMP is currently only compatible with Gluon Trainer")
    else:
        raise TypeError("optimizer_or_trainer should be a Gluon Trainer or an optimizer, instead is %s"
                        % type(optimizer_or_trainer))


def _check_list(value, what):
    if not isinstance(value, list):
        raise AssertionError("%s should be a list, got %s" % (what, type(value)))


def convert_symbol(sym, target_dtype="float16", target_dtype_ops=None, fp32_ops=None, conditional_fp32_ops=None,
                   excluded_sym_names=None, data_names=None, cast_optional_params=False):
    """``sym`` (a float32 graph) with ``amp_cast``/``amp_multicast`` nodes so that the operators of
    ``target_dtype_ops`` run in ``target_dtype`` ('float16' or 'bfloat16') and those of
    ``fp32_ops`` and ``conditional_fp32_ops`` in float32 (each list defaults to AMP's). Nodes
    named in ``excluded_sym_names`` run in float32. ``data_names`` are the data inputs (default:
    the inputs without a ``__dtype__``); the other inputs get the ``__dtype__`` they need. With
    ``cast_optional_params`` parameters read only in the low precision are stored in it instead
    of being cast at every run."""
    if not isinstance(sym, Symbol):
        raise AssertionError("First argument to convert_symbol should be Symbol")
    if target_dtype not in ("float16", "bfloat16"):
        raise AssertionError("Only target_dtype float16 and bfloat16 are supported currently")
    if target_dtype_ops is not None:
        _check_list(target_dtype_ops, "target_dtype_ops")
    else:
        target_dtype_ops = list_lp16_ops(target_dtype)
    if fp32_ops is not None:
        _check_list(fp32_ops, "fp32_ops")
    else:
        fp32_ops = list_fp32_ops(target_dtype)
    if conditional_fp32_ops is not None:
        _check_list(conditional_fp32_ops, "conditional_fp32_ops")
    else:
        conditional_fp32_ops = list_conditional_fp32_ops(target_dtype)
    conditions = {}
    for entry in conditional_fp32_ops:
        if not (len(entry) == 3 and isinstance(entry[0], str) and isinstance(entry[1], str)
                and isinstance(entry[2], list)):
            raise AssertionError("conditional_fp32_ops should be a list of (str, str, list of str)")
        conditions.setdefault(entry[0], {}).setdefault(entry[1], []).extend(entry[2])
    if excluded_sym_names is not None:
        _check_list(excluded_sym_names, "excluded_sym_names")
    else:
        excluded_sym_names = []

    for (first, a), (second, b) in [(("target_dtype_ops", target_dtype_ops), ("fp32_ops", fp32_ops)),
                                    (("target_dtype_ops", target_dtype_ops), ("conditional_fp32_ops", conditions)),
                                    (("fp32_ops", fp32_ops), ("conditional_fp32_ops", conditions))]:
        common = set(a) & set(b)
        if common:
            raise AssertionError("Ops cannot be in two or more lists. Common ops in %s and %s %s"
                                 % (first, second, common))
    allowed = set(list_lp16_ops(target_dtype) + list_fp32_ops(target_dtype) + list_lp16_fp32_ops(target_dtype)
                  + [entry[0] for entry in list_conditional_fp32_ops(target_dtype)])
    illegal = set(target_dtype_ops) | set(fp32_ops) | set(conditions)
    illegal -= allowed
    if illegal:
        raise AssertionError("Can only choose ops from one of the lists amp.list_lp16_ops, amp.list_fp32_ops, "
                             "amp.list_lp16_fp32_ops and amp.list_conditional_fp32_ops (for %s); "
                             "op %s not in any of them" % (target_dtype, illegal))

    attrs = sym.attr_dict()
    if data_names is None:
        data_names = [n for n in sym.list_inputs() if "__dtype__" not in attrs.get(n, {})]
    model_param_names = sorted(set(sym.list_inputs()) - set(data_names))
    return reduce_precision.convert(sym, target_dtype, target_dtype_ops, fp32_ops, list_widest_type_cast(target_dtype),
                                    conditions, excluded_sym_names, data_names, model_param_names,
                                    cast_optional_params)


def _dtype_from_attrs(attrs, name):
    """The dtype name the converted graph's ``__dtype__`` gives input ``name``, or None."""
    flag = attrs.get(name, {}).get("__dtype__")
    if flag is None or flag == "-1":
        return None
    return _DTYPE_OF_FLAG[int(flag)]


def _cast_param(array, dtype):
    if dtype == "bfloat16":
        return operator_casts.cast_array(array, bfloat16)
    return array.astype(dtype)


def convert_model(sym, arg_params, aux_params, target_dtype="float16", target_dtype_ops=None, fp32_ops=None,
                  conditional_fp32_ops=None, excluded_sym_names=None, cast_optional_params=False):
    """A float32 model converted for mixed-precision inference: (symbol, arg_params,
    aux_params), the symbol as ``convert_symbol`` makes it (the inputs not in the parameters
    being the data) and the parameters cast to the dtypes it gives them (the dictionaries given
    are updated and returned)."""
    if excluded_sym_names is not None and not isinstance(excluded_sym_names, list):
        raise ValueError("excluded_sym_names must be a list of strings representing the names of the symbols that "
                         "should not be casted, while received type %s" % str(type(excluded_sym_names)))
    if target_dtype not in ("float16", "bfloat16"):
        raise AssertionError("Only target_dtype float16 and bfloat16 are supported currently")
    if not isinstance(sym, Symbol):
        raise AssertionError("First argument to convert_model should be Symbol")
    if not isinstance(arg_params, dict):
        raise AssertionError("Second argument to convert_model should be a dict of name to ndarray")
    if not isinstance(aux_params, dict):
        raise AssertionError("Third argument to convert_model should be a dict of name to ndarray")
    param_names = set(arg_params) | set(aux_params)
    data_names = [n for n in sym.list_inputs() if n not in param_names]
    sym = convert_symbol(sym, target_dtype, target_dtype_ops, fp32_ops, conditional_fp32_ops, excluded_sym_names,
                         data_names, cast_optional_params)
    attrs = sym.attr_dict()
    for names, params in [(sym.list_arguments(), arg_params), (sym.list_auxiliary_states(), aux_params)]:
        for name in names:
            dtype = _dtype_from_attrs(attrs, name)
            if dtype is not None and name in params:
                params[name] = _cast_param(params[name], dtype)
    return sym, arg_params, aux_params


def convert_hybrid_block(block, target_dtype="float16", target_dtype_ops=None, fp32_ops=None,
                         conditional_fp32_ops=None, excluded_sym_names=None, ctx=gpu(0), cast_optional_params=False):
    """A SymbolBlock running the hybridized ``block`` (called at least once) in mixed precision,
    its graph converted as by ``convert_symbol`` and its parameters, on ``ctx``, in the dtypes
    the conversion gives them."""
    from ...gluon import HybridBlock, SymbolBlock
    if not isinstance(block, HybridBlock):
        raise AssertionError("block input should be a HybridBlock")
    if not block._cached_graph:
        raise RuntimeError("Please first call block.hybridize() and then run forward with this block at least once "
                           "before calling export.")
    inputs, sym = block._cached_graph
    converted = convert_symbol(sym, target_dtype, target_dtype_ops, fp32_ops, conditional_fp32_ops,
                               excluded_sym_names, data_names=[i.name for i in inputs],
                               cast_optional_params=cast_optional_params)
    arg_names, aux_names = set(converted.list_arguments()), set(converted.list_auxiliary_states())
    attrs = converted.attr_dict()
    values = {}
    for name, param in block.collect_params().items():
        kind = "arg" if name in arg_names else "aux"
        if kind == "aux" and name not in aux_names:
            raise AssertionError("parameter %s is no input of the converted graph" % name)
        value = param._reduce()
        dtype = _dtype_from_attrs(attrs, name)
        values["%s:%s" % (kind, name)] = value if dtype is None else _cast_param(value, dtype)
    result = SymbolBlock(converted, inputs)
    for name, param in result.collect_params().items():
        for kind in ("arg", "aux"):
            value = values.get("%s:%s" % (kind, name))
            if value is not None and param.dtype != value.dtype:
                param.cast(value.dtype)
    result.collect_params().load_dict(values, ctx=ctx)
    return result
