"""Optimizers with MXNet 1.x's update rules, running the fused in-place update operators where
MXNet has one (sgd_update, adam_update, ...)."""

import math
import os
import pickle

import numpy as np

from .. import ndarray as nd

_REGISTRY = {}


def register(klass):
    """Make an optimizer creatable by its lower-case class name."""
    _REGISTRY[klass.__name__.lower()] = klass
    return klass


def create(name, **kwargs):
    if isinstance(name, Optimizer):
        return name
    if name.lower() not in _REGISTRY:
        raise ValueError("Cannot find optimizer %s; known: %s" % (name, ", ".join(sorted(_REGISTRY))))
    return _REGISTRY[name.lower()](**kwargs)


class Optimizer:
    """Learning rate (or schedule), weight decay, gradient rescaling and clipping, per-parameter
    lr/wd multipliers, and optional float32 master weights for float16 parameters."""

    def __init__(self, rescale_grad=1.0, param_idx2name=None, wd=0.0, clip_gradient=None, learning_rate=None,
                 lr_scheduler=None, sym=None, begin_num_update=0, multi_precision=False, param_dict=None):
        self.rescale_grad = rescale_grad
        self.lr = 0.01 if learning_rate is None else learning_rate
        self.lr_scheduler = lr_scheduler
        if lr_scheduler is not None:
            if learning_rate is not None and lr_scheduler.base_lr != learning_rate:
                lr_scheduler.base_lr = learning_rate
            self.lr = lr_scheduler.base_lr
        self.wd = wd
        self.lr_mult = {}
        self.wd_mult = {}
        self.begin_num_update = begin_num_update
        self.num_update = begin_num_update
        self._index_update_count = {}
        self.clip_gradient = clip_gradient
        self.multi_precision = multi_precision
        # Weights updated per operator call by optimizers with a multi-weight update op.
        self.aggregate_num = 0
        self.idx2name = dict(param_idx2name or {})
        self.param_dict = param_dict or {}
        self.sym_info = None
        self.set_lr_mult({})
        self.set_wd_mult({})

    create_optimizer = staticmethod(create)
    opt_registry = _REGISTRY

    @property
    def learning_rate(self):
        return self.lr_scheduler(self.num_update) if self.lr_scheduler is not None else self.lr

    def set_learning_rate(self, lr):
        if self.lr_scheduler is not None:
            raise UserWarning("LRScheduler of the optimizer has already been defined. Note that "
                              "set_learning_rate can mutate the value of the learning rate of the optimizer "
                              "only when the LRScheduler of the optimizer is undefined.")
        self.lr = lr

    def set_lr_mult(self, args_lr_mult):
        self.lr_mult = dict(args_lr_mult)

    def set_wd_mult(self, args_wd_mult):
        # Biases and normalization parameters take no weight decay unless told otherwise, as in MXNet.
        self.wd_mult = {n: 0.0 for n in self.idx2name.values() if not (n.endswith("_weight") or n.endswith("_gamma"))}
        self.wd_mult.update(args_wd_mult)

    def _update_count(self, index):
        for i in index if isinstance(index, (list, tuple)) else [index]:
            count = self._index_update_count.get(i, self.begin_num_update) + 1
            self._index_update_count[i] = count
            self.num_update = max(count, self.num_update)

    def _multiplier(self, index, table, attr):
        param = self.param_dict.get(index)
        if param is not None:
            return getattr(param, attr)
        return table.get(index, table.get(self.idx2name.get(index), 1.0))

    def _get_lr(self, index):
        return self.learning_rate * self._multiplier(index, self.lr_mult, "lr_mult")

    def _get_wd(self, index):
        return self.wd * self._multiplier(index, self.wd_mult, "wd_mult")

    def _common(self, index):
        kwargs = {"rescale_grad": self.rescale_grad}
        if self.clip_gradient is not None:
            kwargs["clip_gradient"] = self.clip_gradient
        return self._get_lr(index), self._get_wd(index), kwargs

    def create_state(self, index, weight):
        return None

    def create_state_multi_precision(self, index, weight):
        if self.multi_precision and weight.dtype == np.float16:
            master = weight.astype(np.float32)
            return (master, self.create_state(index, master))
        return self.create_state(index, weight)

    def update(self, index, weight, grad, state):
        raise NotImplementedError()

    def update_multi_precision(self, index, weight, grad, state):
        if self.multi_precision and weight.dtype == np.float16:
            master, inner = state
            self.update(index, master, grad.astype(np.float32), inner)
            master.astype(np.float16).copyto(weight)
        else:
            self.update(index, weight, grad, state)

    def _clipped(self, grad):
        grad = grad * self.rescale_grad
        if self.clip_gradient is not None:
            grad = nd.clip(grad, -self.clip_gradient, self.clip_gradient)
        return grad

    def __getstate__(self):
        state = dict(self.__dict__)
        state["param_dict"] = {}
        return state


def _zeros_like(weight):
    return nd.zeros(weight.shape, ctx=weight.context, dtype=weight.dtype)


@register
class SGD(Optimizer):
    """w -= lr * (rescaled, clipped grad + wd * w), with optional momentum (sgd_mom_update).
    Float16 weights with multi_precision update a float32 master copy (mp_sgd_*), and the
    Updater hands over groups of MXNET_OPTIMIZER_AGGREGATION_SIZE weights (default 4), updated
    by one multi_sgd_* call, as MXNet 1.x does."""

    _single = (nd.sgd_update, nd.sgd_mom_update, nd.mp_sgd_update, nd.mp_sgd_mom_update)
    _multi = (nd.multi_sgd_update, nd.multi_sgd_mom_update, nd.multi_mp_sgd_update, nd.multi_mp_sgd_mom_update)

    def __init__(self, momentum=0.0, lazy_update=True, **kwargs):
        super().__init__(**kwargs)
        self.momentum = momentum
        self.lazy_update = lazy_update
        self.aggregate_num = int(os.getenv("MXNET_OPTIMIZER_AGGREGATION_SIZE", "4"))

    def create_state(self, index, weight):
        return _zeros_like(weight) if self.momentum != 0.0 else None

    def update(self, index, weight, grad, state):
        self._update_impl(index, weight, grad, state, multi_precision=False)

    def update_multi_precision(self, index, weight, grad, state):
        first = weight[0] if isinstance(weight, (list, tuple)) else weight
        self._update_impl(index, weight, grad, state, self.multi_precision and first.dtype == np.float16)

    def _update_impl(self, index, weight, grad, state, multi_precision):
        single = not isinstance(index, (list, tuple))
        indices, weights, grads, states = ([index], [weight], [grad], [state]) if single else (index, weight, grad, state)
        self._update_count(indices)
        _, _, kwargs = self._common(indices[0])
        use_momentum = self.momentum != 0.0
        if use_momentum:
            kwargs["momentum"] = self.momentum
        groups = []
        for w, g, s in zip(weights, grads, states):
            master, mom = s if multi_precision else (None, s)
            groups.append([w, g] + ([mom] if use_momentum else []) + ([master] if multi_precision else []))
        kind = 2 * multi_precision + use_momentum
        if len(indices) > 1 and self._multi is not None:
            self._multi[kind](*[a for group in groups for a in group], out=list(weights),
                              lrs=tuple(self._get_lr(i) for i in indices), wds=tuple(self._get_wd(i) for i in indices),
                              num_weights=len(indices), **kwargs)
            return
        for i, w, group in zip(indices, weights, groups):
            self._single[kind](*group, out=w, lr=self._get_lr(i), wd=self._get_wd(i), **kwargs)


@register
class NAG(SGD):
    """SGD with Nesterov momentum (nag_mom_update, mp_nag_mom_update); MXNet has no multi-weight
    form, so weights are updated one by one."""

    _single = (nd.sgd_update, nd.nag_mom_update, nd.mp_sgd_update, nd.mp_nag_mom_update)
    _multi = None

    def __init__(self, momentum=0.0, **kwargs):
        super().__init__(momentum=momentum, **kwargs)
        self.aggregate_num = 0


@register
class Adam(Optimizer):
    """Adam with MXNet's bias correction folded into the learning rate (adam_update)."""

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8, lazy_update=True, **kwargs):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.beta1, self.beta2, self.epsilon = beta1, beta2, epsilon

    def create_state(self, index, weight):
        return (_zeros_like(weight), _zeros_like(weight))

    def update(self, index, weight, grad, state):
        self._update_count(index)
        lr, wd, kwargs = self._common(index)
        t = self._index_update_count[index]
        lr *= math.sqrt(1.0 - self.beta2 ** t) / (1.0 - self.beta1 ** t)
        mean, var = state
        nd.adam_update(weight, grad, mean, var, out=weight, lr=lr, wd=wd, beta1=self.beta1, beta2=self.beta2,
                       epsilon=self.epsilon, **kwargs)


@register
class AdamW(Adam):
    """Adam with decoupled weight decay (contrib.adamw_update):
    w -= eta * (lr * m_hat / (sqrt(v_hat) + eps) + wd * w)."""

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8, eta=1.0, **kwargs):
        super().__init__(learning_rate=learning_rate, beta1=beta1, beta2=beta2, epsilon=epsilon, **kwargs)
        self.eta = eta

    def update(self, index, weight, grad, state):
        self._update_count(index)
        lr, wd, kwargs = self._common(index)
        t = self._index_update_count[index]
        lr *= math.sqrt(1.0 - self.beta2 ** t) / (1.0 - self.beta1 ** t)
        rescale = nd.full((1,), kwargs.pop("rescale_grad"), ctx=weight.context, dtype=weight.dtype)
        mean, var = state
        nd.contrib.adamw_update(weight, grad, mean, var, rescale, out=weight, lr=lr, wd=wd, eta=self.eta,
                                beta1=self.beta1, beta2=self.beta2, epsilon=self.epsilon, **kwargs)


@register
class RMSProp(Optimizer):
    """RMSProp (Tieleman & Hinton), or the centered variant of Graves (rmspropalex_update)."""

    def __init__(self, learning_rate=0.001, gamma1=0.9, gamma2=0.9, epsilon=1e-8, centered=False,
                 clip_weights=None, **kwargs):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.gamma1, self.gamma2, self.epsilon = gamma1, gamma2, epsilon
        self.centered = centered
        self.clip_weights = clip_weights

    def create_state(self, index, weight):
        if self.centered:
            return (_zeros_like(weight), _zeros_like(weight), _zeros_like(weight))
        return (_zeros_like(weight),)

    def update(self, index, weight, grad, state):
        self._update_count(index)
        lr, wd, kwargs = self._common(index)
        if self.clip_weights:
            kwargs["clip_weights"] = self.clip_weights
        if self.centered:
            n, g, delta = state
            nd.rmspropalex_update(weight, grad, n, g, delta, out=weight, lr=lr, wd=wd, gamma1=self.gamma1,
                                  gamma2=self.gamma2, epsilon=self.epsilon, **kwargs)
        else:
            nd.rmsprop_update(weight, grad, state[0], out=weight, lr=lr, wd=wd, gamma1=self.gamma1,
                              epsilon=self.epsilon, **kwargs)


@register
class AdaGrad(Optimizer):
    """AdaGrad: history += g^2; w -= lr * (g / sqrt(history + eps) + wd * w)."""

    def __init__(self, eps=1e-7, **kwargs):
        super().__init__(**kwargs)
        self.float_stable_eps = eps

    def create_state(self, index, weight):
        return _zeros_like(weight)

    def update(self, index, weight, grad, state):
        self._update_count(index)
        lr, wd, _ = self._common(index)
        grad = self._clipped(grad)
        state[:] = state + grad * grad
        weight[:] = weight - lr * (grad / nd.sqrt(state + self.float_stable_eps) + wd * weight)


@register
class AdaDelta(Optimizer):
    """AdaDelta (Zeiler): rates from running averages of squared gradients and updates."""

    def __init__(self, rho=0.90, epsilon=1e-5, **kwargs):
        super().__init__(**kwargs)
        self.rho, self.epsilon = rho, epsilon

    def create_state(self, index, weight):
        return (_zeros_like(weight), _zeros_like(weight))

    def update(self, index, weight, grad, state):
        self._update_count(index)
        _, wd, _ = self._common(index)
        grad = self._clipped(grad)
        acc_g, acc_delta = state
        acc_g[:] = self.rho * acc_g + (1.0 - self.rho) * grad * grad
        delta = nd.sqrt(acc_delta + self.epsilon) / nd.sqrt(acc_g + self.epsilon) * grad
        acc_delta[:] = self.rho * acc_delta + (1.0 - self.rho) * delta * delta
        weight[:] = weight - (delta + wd * weight)


@register
class Ftrl(Optimizer):
    """Follow the regularized leader (ftrl_update)."""

    def __init__(self, lamda1=0.01, learning_rate=0.1, beta=1, **kwargs):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.lamda1, self.beta = lamda1, beta

    def create_state(self, index, weight):
        return (_zeros_like(weight), _zeros_like(weight))

    def update(self, index, weight, grad, state):
        self._update_count(index)
        lr, wd, kwargs = self._common(index)
        z, n = state
        nd.ftrl_update(weight, grad, z, n, out=weight, lr=lr, wd=wd, lamda1=self.lamda1, beta=self.beta, **kwargs)


@register
class Signum(Optimizer):
    """Sign of the (momentum-averaged) gradient (signum_update / signsgd_update)."""

    def __init__(self, learning_rate=0.01, momentum=0.9, wd_lh=0.0, **kwargs):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.momentum, self.wd_lh = momentum, wd_lh

    def create_state(self, index, weight):
        return _zeros_like(weight) if self.momentum != 0.0 else None

    def update(self, index, weight, grad, state):
        self._update_count(index)
        lr, wd, kwargs = self._common(index)
        if state is None:
            nd.signsgd_update(weight, grad, out=weight, lr=lr, wd=wd, **kwargs)
        else:
            nd.signum_update(weight, grad, state, out=weight, lr=lr, wd=wd, momentum=self.momentum,
                             wd_lh=self.wd_lh, **kwargs)


@register
class LAMB(Optimizer):
    """Layer-wise adaptive moments (You et al.): Adam's direction scaled by ||w|| / ||update||."""

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-6, lower_bound=None,
                 upper_bound=None, bias_correction=True, **kwargs):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.beta1, self.beta2, self.epsilon = beta1, beta2, epsilon
        self.lower_bound, self.upper_bound = lower_bound, upper_bound
        self.bias_correction = bias_correction

    def create_state(self, index, weight):
        return (_zeros_like(weight), _zeros_like(weight))

    def update(self, index, weight, grad, state):
        self._update_count(index)
        lr, wd, kwargs = self._common(index)
        mean, var = state
        direction = nd.lamb_update_phase1(weight, grad, mean, var, t=self._index_update_count[index],
                                          bias_correction=self.bias_correction, wd=wd, beta1=self.beta1,
                                          beta2=self.beta2, epsilon=self.epsilon, **kwargs)
        bounds = {"lower_bound": self.lower_bound or -1.0, "upper_bound": self.upper_bound or -1.0}
        nd.lamb_update_phase2(weight, direction, nd.norm(weight), nd.norm(direction), out=weight, lr=lr, **bounds)


class Updater:
    """Applies an optimizer to (index, grad, weight) triples, creating each index's state on
    first use; states can be saved and restored."""

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.states = {}
        self.states_synced = {}

    def __call__(self, index, grad, weight):
        indices = index if isinstance(index, (list, tuple)) else [index]
        grads = grad if isinstance(grad, (list, tuple)) else [grad]
        weights = weight if isinstance(weight, (list, tuple)) else [weight]
        for i, w in zip(indices, weights):
            if i not in self.states:
                self.states[i] = self.optimizer.create_state_multi_precision(i, w)
                self.states_synced[i] = True
        size = self.optimizer.aggregate_num
        if size <= 1:
            for i, g, w in zip(indices, grads, weights):
                self.optimizer.update_multi_precision(i, w, g, self.states[i])
            return
        # One fused call per group of weights sharing a dtype (a group is one operator).
        by_dtype = {}
        for i, g, w in zip(indices, grads, weights):
            by_dtype.setdefault(w.dtype, []).append((i, g, w))
        for items in by_dtype.values():
            for start in range(0, len(items), size):
                group = items[start:start + size]
                self.optimizer.update_multi_precision([i for i, _, _ in group], [w for _, _, w in group],
                                                      [g for _, g, _ in group], [self.states[i] for i, _, _ in group])

    def get_states(self, dump_optimizer=False):
        def to_numpy(state):
            if state is None:
                return None
            if isinstance(state, (tuple, list)):
                return type(state)(to_numpy(s) for s in state)
            return state.asnumpy()
        states = {i: to_numpy(s) for i, s in self.states.items()}
        return pickle.dumps((states, self.optimizer) if dump_optimizer else states)

    def set_states(self, states):
        loaded = pickle.loads(states)
        if isinstance(loaded, tuple) and len(loaded) == 2:
            loaded, self.optimizer = loaded

        def to_nd(state):
            if state is None:
                return None
            if isinstance(state, (tuple, list)):
                return type(state)(to_nd(s) for s in state)
            return nd.array(state, dtype=state.dtype)
        self.states = {i: to_nd(s) for i, s in loaded.items()}
        self.states_synced = dict.fromkeys(self.states, False)


def get_updater(optimizer):
    return Updater(optimizer)


__all__ = ["Optimizer", "SGD", "NAG", "Adam", "AdamW", "RMSProp", "AdaGrad", "AdaDelta", "Ftrl", "Signum", "LAMB",
           "Updater", "create", "get_updater", "register"]
