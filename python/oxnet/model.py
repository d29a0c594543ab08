"""Checkpoints and the training helpers behind ``Module`` (MXNet's ``mxnet.model``)."""

import logging
import os
from collections import namedtuple

import numpy as np

from . import ndarray as nd
from . import symbol as sym
from . import kvstore as kvs
from .context import cpu

BatchEndParam = namedtuple("BatchEndParams", ["epoch", "nbatch", "eval_metric", "locals"])

# Above this many elements in one parameter, a 'local' store reduces gradients only and the
# workers update (MXNet's threshold: large updates on the store would serialise on one device).
_LOCAL_UPDATE_ON_KVSTORE_LIMIT = 1024 * 1024 * 16


def _create_kvstore(kvstore, num_device, arg_params):
    """The KVStore to use (None for a single device without a distributed store) and whether
    the optimizer runs on it (``MXNET_UPDATE_ON_KVSTORE``, default 1)."""
    update_on_kvstore = bool(int(os.getenv("MXNET_UPDATE_ON_KVSTORE", "1")))
    if kvstore is None:
        kv = None
    elif isinstance(kvstore, kvs.KVStoreBase):
        kv = kvstore
    elif isinstance(kvstore, str):
        # One device of one process needs no store; 'horovod' (like 'dist_*') spans processes.
        if num_device == 1 and "dist" not in kvstore and kvstore != "horovod":
            kv = None
        else:
            kv = kvs.create(kvstore)
            if kvstore == "local" and arg_params:
                max_size = max(int(np.prod(param.shape)) for param in arg_params.values())
                if max_size > _LOCAL_UPDATE_ON_KVSTORE_LIMIT:
                    update_on_kvstore = False
    else:
        raise TypeError("kvstore must be KVStore, str or None")
    if kv is None:
        update_on_kvstore = False
    else:
        update_on_kvstore &= kv.is_capable(kvs.KVStoreBase.OPTIMIZER)
    return kv, update_on_kvstore


def _initialize_kvstore(kvstore, param_arrays, arg_params, param_names, update_on_kvstore):
    """Put every parameter into the store; when the store updates them, also copy its value
    to every device."""
    for idx, param_on_devs in enumerate(param_arrays):
        name = param_names[idx]
        if not update_on_kvstore:
            kvstore.init(name, arg_params[name])
        else:
            kvstore.broadcast(name, arg_params[name], out=param_on_devs)


def _update_params_on_kvstore(param_arrays, grad_arrays, kvstore, param_names):
    """Push each gradient (summed over devices) to the store, whose updater changes the
    weight, and pull the new weight to every device."""
    for index, (arg_list, grad_list) in enumerate(zip(param_arrays, grad_arrays)):
        if grad_list[0] is None:
            continue
        kvstore.pushpull(param_names[index], grad_list, out=arg_list, priority=-index)


def _update_params(param_arrays, grad_arrays, updater, num_device, kvstore=None, param_names=None):
    """Sum the gradients over devices through ``kvstore`` (if any), then let ``updater`` update
    each device's copy; device k of parameter i uses state index ``i * num_device + k``."""
    updates = [[] for _ in range(num_device)]
    for index, (arg_list, grad_list) in enumerate(zip(param_arrays, grad_arrays)):
        if grad_list[0] is None:
            continue
        if kvstore:
            kvstore.pushpull(param_names[index], grad_list, priority=-index)
        for k, (weight, grad) in enumerate(zip(arg_list, grad_list)):
            updates[k].append((index * num_device + k, grad, weight))
    for device_updates in updates:
        if device_updates:
            indices, grads, weights = zip(*device_updates)
            updater(list(indices), list(grads), list(weights))


def save_checkpoint(prefix, epoch, symbol, arg_params, aux_params, remove_amp_cast=True):
    """Write ``prefix-symbol.json`` (unless ``symbol`` is None) and ``prefix-%04d.params``.
    In a distributed job (a 'dist' kvstore was created) only rank 0 writes: every rank holds
    the same parameters, and N writers of one file would race."""
    if kvs.mpi.process_rank() != 0:
        return
    if symbol is not None:
        symbol.save("%s-symbol.json" % prefix, remove_amp_cast=remove_amp_cast)
    save_dict = {("arg:%s" % k): v.as_in_context(cpu()) for k, v in arg_params.items()}
    save_dict.update({("aux:%s" % k): v.as_in_context(cpu()) for k, v in aux_params.items()})
    param_name = "%s-%04d.params" % (prefix, epoch)
    nd.save(param_name, save_dict)
    logging.info('Saved checkpoint to "%s"', param_name)


def load_params(prefix, epoch):
    """(arg_params, aux_params) read from ``prefix-%04d.params``."""
    fname = "%s-%04d.params" % (prefix, epoch)
    save_dict = nd.load(fname)
    arg_params, aux_params = {}, {}
    if not save_dict:
        logging.warning("Params file '%s' is empty", fname)
        return arg_params, aux_params
    for key, value in save_dict.items():
        kind, name = key.split(":", 1)
        if kind == "arg":
            arg_params[name] = value
        elif kind == "aux":
            aux_params[name] = value
    return arg_params, aux_params


def load_checkpoint(prefix, epoch):
    """(symbol, arg_params, aux_params) saved by ``save_checkpoint``."""
    symbol = sym.load("%s-symbol.json" % prefix)
    arg_params, aux_params = load_params(prefix, epoch)
    return symbol, arg_params, aux_params
