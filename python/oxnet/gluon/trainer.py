"""The Gluon Trainer (MXNet's ``mxnet.gluon.Trainer``): applies an optimizer to parameters."""

from .. import optimizer as opt
from ..ndarray import NDArray
from .parameter import Parameter, ParameterDict


class Trainer:
    """Updates ``params`` with ``optimizer`` after each backward pass: ``step(batch_size)``
    rescales gradients by 1/batch_size, sums them across contexts and runs the fused update
    operators in place."""

    def __init__(self, params, optimizer, optimizer_params=None, kvstore="device", compression_params=None,
                 update_on_kvstore=None):
        if isinstance(params, (dict, ParameterDict)):
            params = list(params.values())
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
        optimizer_params = dict(optimizer_params or {})
        self._scale = float(optimizer_params.get("rescale_grad", 1.0))
        self._kvstore = kvstore
        self._init_optimizer(optimizer, optimizer_params)

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
        self._updaters = {}

    def _updater(self, ctx):
        if ctx not in self._updaters:
            self._updaters[ctx] = opt.get_updater(self._optimizer)
        return self._updaters[ctx]

    @property
    def learning_rate(self):
        return self._optimizer.learning_rate

    @property
    def optimizer(self):
        return self._optimizer

    def set_learning_rate(self, lr):
        self._optimizer.set_learning_rate(lr)

    def step(self, batch_size, ignore_stale_grad=False):
        """One update with gradients scaled by 1/batch_size (after summing across contexts)."""
        self._optimizer.rescale_grad = self._scale / batch_size
        self.allreduce_grads()
        self._update(ignore_stale_grad)

    def allreduce_grads(self):
        """Sum each parameter's gradients over its contexts, leaving the sum on every context."""
        for param in self._params:
            if param.grad_req == "null":
                continue
            grads = param.list_grad()
            if len(grads) > 1:
                total = grads[0].copy()
                for g in grads[1:]:
                    total += g.as_in_context(total.context)
                for g in grads:
                    total.copyto(g)

    def update(self, batch_size, ignore_stale_grad=False):
        """``step`` without the cross-context reduction (call ``allreduce_grads`` first)."""
        self._optimizer.rescale_grad = self._scale / batch_size
        self._update(ignore_stale_grad)

    def _update(self, ignore_stale_grad=False):
        # Per device, every parameter goes to the updater in one call, so optimizers with
        # multi-weight update ops can fuse them.
        per_ctx = {}
        trained = [(i, param) for i, param in enumerate(self._params) if param.grad_req != "null"]
        # Every parameter is checked before any is touched, so a raised error leaves all of
        # them (and their fresh-gradient flags) as they were.
        for _, param in trained:
            stale = None if ignore_stale_grad else next((d for d in param.list_data() if not d._fresh_grad), None)
            if stale is not None:
                raise UserWarning(
                    "Gradient of Parameter `%s` on context %s has not been updated by backward "
                    "since last `step`. This could mean a bug in your model that made it only use "
                    "a subset of the Parameters (Blocks) for this iteration. If you are "
                    "intentionally only using a subset, call step with ignore_stale_grad=True to "
                    "suppress this warning and skip updating of Parameters with stale gradient"
                    % (param.name, str(stale.context)))
        for i, param in trained:
            for data, grad in zip(param.list_data(), param.list_grad()):
                if ignore_stale_grad and not data._fresh_grad:
                    continue
                data._fresh_grad = False
                indices, grads, weights = per_ctx.setdefault(data.context, ([], [], []))
                indices.append(i)
                grads.append(grad)
                weights.append(data)
        for ctx, (indices, grads, weights) in per_ctx.items():
            self._updater(ctx)(indices, grads, weights)

    def save_states(self, fname):
        """Save the optimizer and its per-parameter states."""
        updater = next(iter(self._updaters.values()), None) or opt.get_updater(self._optimizer)
        with open(fname, "wb") as fout:
            fout.write(updater.get_states(dump_optimizer=True))

    def load_states(self, fname):
        with open(fname, "rb") as f:
            states = f.read()
        contexts = list(self._updaters) or [self._params[0].list_ctx()[0]]
        for ctx in contexts:
            updater = self._updater(ctx)
            updater.set_states(states)
            for state_key, state in list(updater.states.items()):
                updater.states[state_key] = _to_context(state, ctx)
        self._optimizer = self._updater(contexts[0]).optimizer
        for updater in self._updaters.values():
            updater.optimizer = self._optimizer
        self._optimizer.param_dict = dict(enumerate(self._params))


def _to_context(state, ctx):
    if isinstance(state, NDArray):
        return state.as_in_context(ctx)
    if isinstance(state, (tuple, list)):
        return type(state)(_to_context(s, ctx) for s in state)
    return state
