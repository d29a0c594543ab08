"""The Gluon Trainer (MXNet's ``mxnet.gluon.Trainer``): applies an optimizer to parameters."""

from .. import _core
from .. import optimizer as opt
from ..model import _create_kvstore
from ..ndarray import NDArray
from .parameter import Parameter, ParameterDict


class Trainer:
    """Updates ``params`` with ``optimizer`` after each backward pass: ``step(batch_size)``
    rescales gradients by 1/batch_size, sums them across contexts and runs the fused update
    operators in place.

    With parameters on several contexts a KVStore (``kvstore``: a name such as 'device' or
    'local', or a KVStore) sums the gradients; with ``update_on_kvstore`` (default: the
    ``MXNET_UPDATE_ON_KVSTORE`` variable, 1) the store also runs the optimizer on its copy of
    the weights and sends the result to every context. One context needs no store."""

    def __init__(self, params, optimizer, optimizer_params=None, kvstore="device", compression_params=None,
                 update_on_kvstore=None):
        if isinstance(params, (dict, ParameterDict)):
            params = [params[key] for key in sorted(params.keys())]
        if not isinstance(params, (list, tuple)):
            raise ValueError("First argument must be a list or dict of Parameters, got %s." % (type(params)))
        self._params = []
        self._param2idx = {}
        for i, param in enumerate(params):
            if not isinstance(param, Parameter):
                raise ValueError("First argument must be a list or dict of Parameters, got list of %s."
                                 % (type(param)))
            if param.name in self._param2idx:
                raise ValueError("Parameter %s is given twice" % param.name)
            self._param2idx[param.name] = i
            self._params.append(param)
            param._set_trainer(self)
        self._compression_params = compression_params
        self._contexts = self._check_contexts() or []
        self._init_optimizer(optimizer, dict(optimizer_params or {}))
        self._scale = self._optimizer.rescale_grad
        self._kvstore_params = {"kvstore": kvstore, "update_on_kvstore": update_on_kvstore}
        self._kv_initialized = False
        self._kvstore = None
        self._update_on_kvstore = None
        self._distributed = None
        self._params_to_init = []
        self._reset_kvstore()

    def _check_contexts(self):
        contexts = None
        for param in self._params:
            ctx = param.list_ctx()
            assert contexts is None or contexts == ctx, (
                "All Parameters must be initialized on the same set of contexts, but Parameter %s is initialized "
                "on %s while previous Parameters are initialized on %s." % (param.name, str(ctx), str(contexts)))
            contexts = ctx
        return contexts

    def _init_optimizer(self, optimizer, optimizer_params):
        param_dict = dict(enumerate(self._params))
        if isinstance(optimizer, opt.Optimizer):
            if optimizer_params:
                raise AssertionError("optimizer_params must be None if optimizer is an instance of Optimizer "
                                     "instead of str")
            self._optimizer = optimizer
            self._optimizer.param_dict = param_dict
        else:
            self._optimizer = opt.create(optimizer, param_dict=param_dict, **optimizer_params)
        # One updater (with its own states) per context.
        self._updaters = [opt.get_updater(self._optimizer) for _ in self._contexts]

    # ---- the key-value store ------------------------------------------------------------------
    def _reset_kvstore(self):
        """Forget the store: it is created again, from the current values, at the next step."""
        if self._kvstore and "dist" in self._kvstore.type:
            raise RuntimeError("Cannot reset distributed KVStore.")
        self._kv_initialized = False
        self._kvstore = None
        self._distributed = None
        self._update_on_kvstore = None
        self._params_to_init = list(self._params)

    def _init_kvstore(self):
        """Create the store and decide whether it runs the optimizer."""
        config = self._kvstore_params
        arg_arrays = {param.name: param.data(self._contexts[0]) for param in self._params}
        kvstore, update_on_kvstore = _create_kvstore(config["kvstore"], len(self._contexts), arg_arrays)
        self._distributed = "dist" in kvstore.type if kvstore else False
        if config["update_on_kvstore"] is not None:
            update_on_kvstore = config["update_on_kvstore"]
        if kvstore and update_on_kvstore and not kvstore.is_capable("optimizer"):
            if config["update_on_kvstore"]:
                raise ValueError("Please set update_on_kvstore=False when training with {}".format(type(kvstore)))
            update_on_kvstore = False
        if kvstore:
            if self._compression_params:
                kvstore.set_gradient_compression(self._compression_params)
            if update_on_kvstore:
                kvstore.set_optimizer(self._optimizer)
            self._kvstore = kvstore
            self._update_on_kvstore = update_on_kvstore
        else:
            self._kvstore = None
            self._update_on_kvstore = None
        self._kv_initialized = True

    def _init_params(self):
        """Put the parameters not yet in the store into it (deferred ones wait for their
        first forward pass)."""
        assert self._kv_initialized, "Cannot initialize parameters in KVStore when KVStore is not initialized."
        still_deferred = []
        if self._kvstore:
            for param in self._params_to_init:
                if param._deferred_init:
                    still_deferred.append(param)
                    continue
                arrays = param.list_data()
                self._kvstore.broadcast(self._param2idx[param.name], arrays[0], arrays)
        self._params_to_init = still_deferred

    def _prepare_kvstore(self):
        if not self._kv_initialized:
            self._init_kvstore()
        if self._params_to_init:
            self._init_params()

    # ---- learning rate ------------------------------------------------------------------------
    @property
    def learning_rate(self):
        return self._optimizer.learning_rate

    @property
    def optimizer(self):
        return self._optimizer

    def set_learning_rate(self, lr):
        self._optimizer.set_learning_rate(lr)

    # ---- updates ------------------------------------------------------------------------------
    def step(self, batch_size, ignore_stale_grad=False):
        """One update with gradients scaled by 1/batch_size (after summing across contexts)."""
        self._optimizer.rescale_grad = self._scale / batch_size
        self._prepare_kvstore()
        trained = self._trained_arrays()
        self._check_fresh_grads(trained, ignore_stale_grad)
        self._allreduce_grads()
        self._update(trained, ignore_stale_grad)

    def allreduce_grads(self):
        """Sum each parameter's gradients over its contexts, leaving the sum on every context
        (for ``update``; not available when the store runs the optimizer)."""
        self._prepare_kvstore()
        assert not (self._kvstore and self._update_on_kvstore), (
            "allreduce_grads() when parameters are updated on kvstore is not supported. Try setting "
            "`update_on_kvstore` to False when creating trainer.")
        self._allreduce_grads()

    def update(self, batch_size, ignore_stale_grad=False):
        """``step`` without the cross-context reduction (call ``allreduce_grads`` first)."""
        self._prepare_kvstore()
        assert not (self._kvstore and self._update_on_kvstore), (
            "update() when parameters are updated on kvstore is not supported. Try setting "
            "`update_on_kvstore` to False when creating trainer.")
        self._optimizer.rescale_grad = self._scale / batch_size
        trained = self._trained_arrays()
        self._check_fresh_grads(trained, ignore_stale_grad)
        self._update(trained, ignore_stale_grad)

    def _trained(self):
        return [(i, param) for i, param in enumerate(self._params) if param.grad_req != "null"]

    def _trained_arrays(self):
        """(index, parameter, its arrays, its gradients) of every parameter with a gradient, the
        arrays gathered once for a step's check and update."""
        return [(i, param, param.list_data(), param.list_grad()) for i, param in self._trained()]

    def _check_fresh_grads(self, trained, ignore_stale_grad):
        # Every parameter is checked before any is touched, so a raised error leaves all of
        # them (and their fresh-gradient flags) as they were.
        if ignore_stale_grad:
            return
        for _, param, datas, _ in trained:
            stale = next((d for d in datas if not d._fresh_grad), None)
            if stale is not None:
                raise UserWarning(
                    "Gradient of Parameter `%s` on context %s has not been updated by backward "
                    "since last `step`. This could mean a bug in your model that made it only use "
                    "a subset of the Parameters (Blocks) for this iteration. If you are "
                    "intentionally only using a subset, call step with ignore_stale_grad=True to "
                    "suppress this warning and skip updating of Parameters with stale gradient"
                    % (param.name, str(stale.context)))

    def _allreduce_grads(self):
        if not self._kvstore:
            return
        for i, param in self._trained():
            if self._update_on_kvstore:
                # The store sums the gradients, updates its weight and sends it back.
                self._kvstore.pushpull(i, param.list_grad(), out=param.list_data(), priority=-i)
            else:
                self._kvstore.pushpull(i, param.list_grad(), priority=-i)

    def _update(self, trained, ignore_stale_grad=False):
        # With AMP's dynamic loss scaling (amp.init_trainer), gradients that overflowed skip
        # the update.
        loss_scaler = getattr(self, "_amp_loss_scaler", None)
        if loss_scaler is not None and loss_scaler.has_overflow(self._params):
            return
        # Per context, every parameter goes to that context's updater in one call, so
        # optimizers with multi-weight update ops can fuse them.
        updates = [[] for _ in self._updaters]
        for i, _, datas, grads in trained:
            for device, (data, grad) in enumerate(zip(datas, grads)):
                if ignore_stale_grad and not data._fresh_grad:
                    continue
                data._fresh_grad = False
                updates[device].append((i, grad, data))
        if self._kvstore and self._update_on_kvstore:
            return
        for updater, device_updates in zip(self._updaters, updates):
            if device_updates:
                indices, grads, weights = zip(*device_updates)
                updater(list(indices), list(grads), list(weights))

    # ---- optimizer states ---------------------------------------------------------------------
    def save_states(self, fname):
        """Save the optimizer and its per-parameter states (in a distributed job, rank 0 writes
        them and every rank returns once they are written)."""
        self._prepare_kvstore()
        if self._distributed and not self._update_on_kvstore:
            if self._kvstore.rank == 0:
                _core.write_file(fname, self._updaters[0].get_states(dump_optimizer=True))
            self._kvstore._barrier()
        elif self._update_on_kvstore:
            assert not self._params_to_init, ("Cannot save trainer states when some parameters are not yet "
                                              "initialized in kvstore.")
            self._kvstore.save_optimizer_states(fname, dump_optimizer=True)
        else:
            _core.write_file(fname, self._updaters[0].get_states(dump_optimizer=True))

    def load_states(self, fname):
        """Load what ``save_states`` wrote (the optimizer included)."""
        self._prepare_kvstore()
        if self._update_on_kvstore:
            self._kvstore.load_optimizer_states(fname)
            self._optimizer = self._kvstore._updater.optimizer
        else:
            with open(fname, "rb") as f:
                states = f.read()
            for updater, ctx in zip(self._updaters, self._contexts):
                updater.set_states(states)
                updater.optimizer = self._updaters[0].optimizer
                for state_key, state in list(updater.states.items()):
                    updater.states[state_key] = _to_context(state, ctx)
            self._optimizer = self._updaters[0].optimizer
        self._optimizer.param_dict = dict(enumerate(self._params))


def _to_context(state, ctx):
    if isinstance(state, NDArray):
        return state.as_in_context(ctx)
    if isinstance(state, (tuple, list)):
        return type(state)(_to_context(s, ctx) for s in state)
    return state
