"""Optimizers with MXNet 1.x's update rules, running the fused in-place update operators where
MXNet has one (sgd_update, adam_update, ...)."""

import logging
import math
import os
import pickle
import warnings

import numpy as np

from .. import ndarray as nd
from ..base import py_str
from ..ndarray import NDArray
from ..ndarray import abs as NDabs  # MXNet exports the element-wise abs under this name here.


class Optimizer:
    """Learning rate (or schedule), weight decay, gradient rescaling and clipping, per-parameter
    lr/wd multipliers (from gluon Parameters, from the arguments' ``__lr_mult__`` /
    ``__wd_mult__`` attributes of ``sym``, or set by name or index), and optional float32 master
    weights for float16 parameters."""

    opt_registry = {}

    def __init__(self, rescale_grad=1.0, param_idx2name=None, wd=0.0, clip_gradient=None, learning_rate=None,
                 lr_scheduler=None, sym=None, begin_num_update=0, multi_precision=False, param_dict=None):
        self.rescale_grad = rescale_grad
        self.lr_scheduler = lr_scheduler
        if lr_scheduler is None and learning_rate is None:
            learning_rate = 0.01
        self.lr = learning_rate
        if lr_scheduler is not None and learning_rate is not None and lr_scheduler.base_lr != learning_rate:
            # MXNet prints (rather than warns) that the optimizer's rate wins over the schedule's.
            print(UserWarning("learning rate from ``lr_scheduler`` has been overwritten by "
                              "``learning_rate`` in optimizer."))
            lr_scheduler.base_lr = learning_rate
        self.wd = wd
        self.lr_mult = {}
        self.wd_mult = {}
        self.begin_num_update = begin_num_update
        self.num_update = begin_num_update
        # Update counts are kept per device, so that each device's copy counts its own steps.
        self._all_index_update_counts = {0: {}}
        self._index_update_count = self._all_index_update_counts[0]
        self.clip_gradient = clip_gradient
        self.multi_precision = multi_precision
        # Weights handed to one update call by the Updater (0: one by one).
        self.aggregate_num = 0
        if param_idx2name is None:
            param_idx2name = {}
        if not isinstance(param_idx2name, dict):
            raise TypeError("param_idx2name should be a dict of param indexes to names.")
        self.idx2name = param_idx2name.copy()
        self.sym_info = (sym.attr_dict(), sym.list_arguments()) if sym is not None else ()
        self.param_dict = param_dict if param_dict else {}
        self.set_lr_mult({})
        self.set_wd_mult({})

    @staticmethod
    def register(klass):
        """Make an optimizer class creatable by its lower-case name (``create('sgd')``)."""
        if not isinstance(klass, type):
            raise TypeError("register expects an Optimizer class, got %r" % (klass,))
        name = klass.__name__.lower()
        if name in Optimizer.opt_registry:
            previous = Optimizer.opt_registry[name]
            warnings.warn("WARNING: New optimizer %s.%s is overriding existing optimizer %s.%s"
                          % (klass.__module__, klass.__name__, previous.__module__, previous.__name__))
        Optimizer.opt_registry[name] = klass
        return klass

    @staticmethod
    def create_optimizer(name, **kwargs):
        """An instance of the registered optimizer `name` (case-insensitive)."""
        if name.lower() in Optimizer.opt_registry:
            return Optimizer.opt_registry[name.lower()](**kwargs)
        raise ValueError("Cannot find optimizer %s" % name)

    @property
    def learning_rate(self):
        return self.lr_scheduler(self.num_update) if self.lr_scheduler is not None else self.lr

    def set_learning_rate(self, lr):
        if self.lr_scheduler is not None:
            raise UserWarning("LRScheduler of the optimizer has already been defined. Note that "
                              "set_learning_rate can mutate the value of the learning rate of the optimizer "
                              "only when the LRScheduler of the optimizer is undefined.")
        self.lr = lr

    def set_lr_scale(self, args_lrscale):
        """Removed in MXNet long ago; use set_lr_mult."""
        raise DeprecationWarning

    def _symbol_multipliers(self, attr_key):
        table = {}
        if self.sym_info:
            attrs, arg_names = self.sym_info
            for name in arg_names:
                if name in attrs and attr_key in attrs[name]:
                    table[name] = float(attrs[name][attr_key])
        return table

    def set_lr_mult(self, args_lr_mult):
        """Learning-rate multipliers by parameter name (or index); the symbol's ``lr_mult``
        attributes come first, `args_lr_mult` overrides them."""
        self.lr_mult = self._symbol_multipliers("__lr_mult__")
        self.lr_mult.update(args_lr_mult)

    def _wd_free_by_default(self, name):
        return not (name.endswith("_weight") or name.endswith("_gamma"))

    def set_wd_mult(self, args_wd_mult):
        """Weight-decay multipliers by parameter name (or index). Parameters named in
        param_idx2name that are not weights or gammas (biases, betas, ...) get 0."""
        self.wd_mult = {n: 0.0 for n in self.idx2name.values() if self._wd_free_by_default(n)}
        self.wd_mult.update(self._symbol_multipliers("__wd_mult__"))
        self.wd_mult.update(args_wd_mult)

    def _set_current_context(self, device_id):
        self._index_update_count = self._all_index_update_counts.setdefault(device_id, {})

    def _update_count(self, index):
        for i in index if isinstance(index, (list, tuple)) else [index]:
            count = self._index_update_count.get(i, self.begin_num_update) + 1
            self._index_update_count[i] = count
            self.num_update = max(count, self.num_update)

    def _multiplied(self, base, indices, table, attr):
        values = []
        for index in indices:
            if index in self.param_dict:
                values.append(base * getattr(self.param_dict[index], attr))
            elif index in table:
                values.append(base * table[index])
            elif index in self.idx2name:
                values.append(base * table.get(self.idx2name[index], 1.0))
            else:
                values.append(base)
        return values

    def _get_lrs(self, indices):
        return self._multiplied(self.learning_rate, indices, self.lr_mult, "lr_mult")

    def _get_lr(self, index):
        return self._get_lrs([index])[0]

    def _get_wds(self, indices):
        return self._multiplied(self.wd, indices, self.wd_mult, "wd_mult")

    def _get_wd(self, index):
        return self._get_wds([index])[0]

    def _update_kwargs(self, momentum=None):
        """Hyper-parameters of the fused update operators; MXNet leaves clip_gradient (and a
        zero momentum) out so that the operators' defaults apply."""
        kwargs = {"rescale_grad": self.rescale_grad}
        if momentum:
            kwargs["momentum"] = momentum
        if self.clip_gradient:
            kwargs["clip_gradient"] = self.clip_gradient
        return kwargs

    def _clipped(self, grad):
        grad = grad * self.rescale_grad
        if self.clip_gradient is not None:
            grad = nd.clip(grad, -self.clip_gradient, self.clip_gradient)
        return grad

    def create_state(self, index, weight):
        """The optimizer's per-weight state (None for stateless optimizers)."""
        return None

    def create_state_multi_precision(self, index, weight):
        """The state, preceded by a float32 master copy for float16 weights under
        multi_precision: (weight32, state)."""
        if self.multi_precision and weight.dtype == np.float16:
            master = weight.astype(np.float32)
            return (master, self.create_state(index, master))
        if weight.dtype == np.float16 and not self.multi_precision:
            warnings.warn("Accumulating with float16 in optimizer can lead to poor accuracy or slow "
                          "convergence. Consider using multi_precision=True option of the optimizer")
        return self.create_state(index, weight)

    def update(self, index, weight, grad, state):
        raise NotImplementedError()

    def update_multi_precision(self, index, weight, grad, state):
        """`update` on the float32 master copy for float16 weights under multi_precision, then
        the weight receives its cast."""
        if self.multi_precision and weight.dtype == np.float16:
            master, inner = state
            self.update(index, master, grad.astype(np.float32), inner)
            nd.cast(master, dtype=weight.dtype, out=weight)
        else:
            self.update(index, weight, grad, state)

    def __getstate__(self):
        # Gluon parameters are not pickled with the optimizer (Trainer sets them again).
        state = dict(self.__dict__)
        del state["param_dict"]
        return state

    def __setstate__(self, state):
        self.__dict__ = state
        self.param_dict = {}


register = Optimizer.register
create = Optimizer.create_optimizer


def _zeros_like(weight, dtype=None):
    return nd.zeros(weight.shape, ctx=weight.context, dtype=weight.dtype if dtype is None else dtype)


def _flatten(groups):
    return [item for group in groups for item in group]


class _MasterFirstStateMixin:
    """SGD-family state layout for float16 weights under multi_precision: (state, weight32),
    the order MXNet's SGD, NAG and LARS keep (unlike the base class's (weight32, state))."""

    def create_state_multi_precision(self, index, weight):
        if self.multi_precision and weight.dtype == np.float16:
            master = weight.astype(np.float32)
            return (self.create_state(index, master), master)
        if weight.dtype == np.float16 and not self.multi_precision:
            warnings.warn("Accumulating with float16 in optimizer can lead to poor accuracy or slow "
                          "convergence. Consider using multi_precision=True option of the %s optimizer"
                          % type(self).__name__)
        return self.create_state(index, weight)

    def update(self, index, weight, grad, state):
        self._update_impl(index, weight, grad, state, multi_precision=False)

    def update_multi_precision(self, index, weight, grad, state):
        first = weight[0] if isinstance(weight, (list, tuple)) else weight
        self._update_impl(index, weight, grad, state, self.multi_precision and first.dtype == np.float16)


@register
class SGD(_MasterFirstStateMixin, Optimizer):
    """w -= lr * (rescaled, clipped grad + wd * w), with optional momentum (sgd_mom_update).
    Float16 weights with multi_precision update a float32 master copy (mp_sgd_*), and the
    Updater hands over groups of MXNET_OPTIMIZER_AGGREGATION_SIZE weights (default 4), updated
    by one multi_sgd_* call, as MXNet 1.x does."""

    def __init__(self, momentum=0.0, lazy_update=True, **kwargs):
        super().__init__(**kwargs)
        self.momentum = momentum
        self.lazy_update = lazy_update
        self.aggregate_num = int(os.getenv("MXNET_OPTIMIZER_AGGREGATION_SIZE", "4"))

    def create_state(self, index, weight):
        return _zeros_like(weight) if self.momentum != 0.0 else None

    def _momentum(self):
        return self.momentum

    def _update_impl(self, index, weight, grad, state, multi_precision):
        single = not isinstance(index, (list, tuple))
        indices, weights, grads, states = ([index], [weight], [grad], [state]) if single else (index, weight, grad, state)
        self._update_count(indices)
        self._apply(indices, weights, grads, states, multi_precision, self._get_lrs(indices), self._get_wds(indices))

    def _apply(self, indices, weights, grads, states, multi_precision, lrs, wds):
        use_momentum = self.momentum > 0
        kwargs = self._update_kwargs(self._momentum() if use_momentum else None)
        if len(indices) > 1:
            groups = []
            for w, g, s in zip(weights, grads, states):
                mom, master = s if multi_precision else (s, None)
                groups.append([w, g] + ([mom] if use_momentum else []) + ([master] if multi_precision else []))
            update = [[nd.multi_sgd_update, nd.multi_sgd_mom_update],
                      [nd.multi_mp_sgd_update, nd.multi_mp_sgd_mom_update]][multi_precision][use_momentum]
            update(*_flatten(groups), out=list(weights), lrs=tuple(lrs), wds=tuple(wds), num_weights=len(weights),
                   **kwargs)
            return
        for w, g, s, lr, wd in zip(weights, grads, states, lrs, wds):
            if not multi_precision:
                if s is not None:
                    nd.sgd_mom_update(w, g, s, out=w, lr=lr, wd=wd, **kwargs)
                else:
                    nd.sgd_update(w, g, out=w, lr=lr, wd=wd, **kwargs)
            elif s[0] is not None:
                nd.mp_sgd_mom_update(w, g, s[0], s[1], out=w, lr=lr, wd=wd, **kwargs)
            else:
                nd.mp_sgd_update(w, g, s[1], out=w, lr=lr, wd=wd, **kwargs)


@register
class ccSGD(SGD):  # pylint: disable=invalid-name
    """Deprecated in MXNet: the same as SGD, kept so that old programs still create it."""


@register
class NAG(_MasterFirstStateMixin, Optimizer):
    """SGD with Nesterov momentum (nag_mom_update, mp_nag_mom_update), one weight at a time:
    mom = momentum * mom - lr * (g + wd * w); w += momentum * mom - lr * (g + wd * w)."""

    def __init__(self, momentum=0.0, **kwargs):
        super().__init__(**kwargs)
        self.momentum = momentum

    def create_state(self, index, weight):
        return _zeros_like(weight) if self.momentum != 0.0 else None

    def _update_impl(self, index, weight, grad, state, multi_precision):
        if isinstance(index, (list, tuple)):
            # No multi-weight form exists: a group (aggregate_num set by the user) goes one by one.
            for i, w, g, s in zip(index, weight, grad, state):
                self._update_impl(i, w, g, s, multi_precision)
            return
        self._update_count(index)
        lr, wd = self._get_lr(index), self._get_wd(index)
        kwargs = self._update_kwargs(self.momentum if self.momentum > 0 else None)
        if not multi_precision:
            if state is not None:
                nd.nag_mom_update(weight, grad, state, out=weight, lr=lr, wd=wd, **kwargs)
            else:
                nd.sgd_update(weight, grad, out=weight, lr=lr, wd=wd, **kwargs)
        elif state[0] is not None:
            nd.mp_nag_mom_update(weight, grad, state[0], state[1], out=weight, lr=lr, wd=wd, **kwargs)
        else:
            nd.mp_sgd_update(weight, grad, state[1], out=weight, lr=lr, wd=wd, **kwargs)


def _lars_exempt(name):
    # Biases and normalization parameters keep the plain learning rate under LARS.
    return name.endswith("gamma") or name.endswith("beta") or name.endswith("bias")


@register
class LARS(SGD):
    """Layer-wise adaptive rate scaling (You et al., 2017): SGD with momentum whose learning
    rate for each layer (biases and normalization parameters excepted) is scaled by
    eta * ||w|| / (||g|| + wd * ||w|| + eps). With momentum_correction, the momentum is
    scaled by the ratio of the current to the previous learning rate of the schedule."""

    def __init__(self, momentum=0.0, lazy_update=True, eta=0.001, eps=0, momentum_correction=True, **kwargs):
        super().__init__(momentum=momentum, lazy_update=lazy_update, **kwargs)
        self.momentum_correction = momentum_correction
        self.eta = eta
        self.eps = eps
        self.skip = 0
        self.last_lr = None
        self.cur_lr = None

    def _wd_free_by_default(self, name):
        return not name.endswith("_weight")

    def _get_lrs(self, indices):
        # Track the schedule's rate between calls for the momentum correction.
        if self.cur_lr is not None:
            self.last_lr = self.cur_lr
        lr = self.learning_rate
        if self.cur_lr is None:
            self.last_lr = lr
        self.cur_lr = lr
        return super()._get_lrs(indices)

    def _momentum(self):
        if self.momentum_correction and self.last_lr != 0:
            return self.momentum * (self.cur_lr / self.last_lr)
        return self.momentum

    def _name(self, index):
        return self.idx2name[index] if index in self.idx2name else str(index)

    def _update_impl(self, index, weight, grad, state, multi_precision):
        single = not isinstance(index, (list, tuple))
        indices, weights, grads, states = ([index], [weight], [grad], [state]) if single else (index, weight, grad, state)
        self._update_count(indices)
        lrs, wds = self._get_lrs(indices), self._get_wds(indices)
        # Scaled layers first, then the exempt ones; the rates are computed on the device
        # (multi_sum_sq, multi_lars) and the updates read them from there (preloaded_multi_*).
        order = ([i for i, idx in enumerate(indices) if not _lars_exempt(self._name(idx))]
                 + [i for i, idx in enumerate(indices) if _lars_exempt(self._name(idx))])
        num_scaled = sum(1 for idx in indices if not _lars_exempt(self._name(idx)))
        ctx = weights[0].context
        new_lrs = nd.array([lrs[i] for i in order], ctx=ctx, dtype="float32")
        new_wds = nd.array([wds[i] for i in order], ctx=ctx, dtype="float32")
        weights = [weights[i] for i in order]
        grads = [grads[i] for i in order]
        states = [states[i] for i in order]
        if num_scaled > 0:
            w_sum_sq = nd.multi_sum_sq(*weights[:num_scaled], num_arrays=num_scaled)
            g_sum_sq = nd.multi_sum_sq(*grads[:num_scaled], num_arrays=num_scaled)
            scaled = nd.multi_lars(new_lrs[:num_scaled], w_sum_sq, g_sum_sq, new_wds[:num_scaled],
                                   eta=self.eta, eps=self.eps, rescale_grad=self.rescale_grad)
            new_lrs[:num_scaled] = scaled
        use_momentum = self.momentum > 0
        kwargs = self._update_kwargs(self._momentum() if use_momentum else None)
        update = [[nd.preloaded_multi_sgd_update, nd.preloaded_multi_sgd_mom_update],
                  [nd.preloaded_multi_mp_sgd_update, nd.preloaded_multi_mp_sgd_mom_update]][multi_precision][use_momentum]
        step = max(self.aggregate_num, 1)
        for start in range(0, len(weights), step):
            end = min(start + step, len(weights))
            groups = []
            for w, g, s in zip(weights[start:end], grads[start:end], states[start:end]):
                mom, master = s if multi_precision else (s, None)
                groups.append([w, g] + ([mom] if use_momentum else []) + ([master] if multi_precision else []))
            update(*(_flatten(groups) + [new_lrs[start:end], new_wds[start:end]]), out=weights[start:end],
                   num_weights=end - start, **kwargs)


@register
class LBSGD(Optimizer):
    """Large-batch SGD: gradients are accumulated over batch_scale steps, then one SGD step
    (with momentum) is taken with the learning rate multiplied by a warm-up factor
    ('linear', 'power2', 'sqrt' over warmup_epochs * updates_per_epoch updates) or, with
    warmup_strategy='lars', by the layer's LARS ratio clipped to [0.01, 100]."""

    def __init__(self, momentum=0.0, multi_precision=False, warmup_strategy="linear", warmup_epochs=5,
                 batch_scale=1, updates_per_epoch=32, begin_epoch=0, num_epochs=60, **kwargs):
        super().__init__(**kwargs)
        logging.info("Running Large-Batch SGD Algorithm")
        logging.info("(Batch_scale=%f, warmup_epochs=%d, warmup_strategy=%s, updates_per_epoch=%d)",
                     batch_scale, warmup_epochs, warmup_strategy, updates_per_epoch)
        self.momentum = momentum
        self.multi_precision = multi_precision
        self.warmup_strategy = warmup_strategy
        self.warmup_epochs = warmup_epochs
        self.batch_scale = batch_scale
        self.updates_per_epoch = updates_per_epoch
        self.init_updates = begin_epoch * updates_per_epoch
        self.num_epochs = num_epochs
        self.lbmult = 1
        self.cumgrads = {}
        self.adaptive = False
        self.admult = 1

    def create_state(self, index, weight):
        # Its own (mom, weight32) layout for multi_precision, as in MXNet.
        if self.multi_precision and weight.dtype == np.float16:
            master = weight.astype(np.float32)
            return (_zeros_like(weight, np.float32) if self.momentum != 0.0 else None, master)
        if weight.dtype == np.float16 and not self.multi_precision:
            warnings.warn("Accumulating with float16 in optimizer can lead to poor accuracy or slow "
                          "convergence. Consider using multi_precision=True option of the SGD optimizer")
        return _zeros_like(weight) if self.momentum != 0.0 else None

    def _get_lbmult(self, num_updates):
        warmup_updates = self.warmup_epochs * self.updates_per_epoch
        max_mult = float(self.batch_scale)
        if num_updates >= warmup_updates:
            return max_mult
        if warmup_updates <= 1:
            return 1.0
        fraction = num_updates / warmup_updates
        if self.warmup_strategy == "linear":
            return 1.0 + (max_mult - 1) * fraction
        if self.warmup_strategy == "power2":
            return 1.0 + (max_mult - 1) * fraction * fraction
        if self.warmup_strategy == "sqrt":
            return 1.0 + (max_mult - 1) * math.sqrt(fraction)
        return 1.0

    @staticmethod
    def _l2norm(v):
        # MXNet's name; it is the squared norm.
        return (v * v).asnumpy().sum()

    def _get_lars(self, weight, g, wd):
        weight2, grad2 = self._l2norm(weight), self._l2norm(g)
        lars = math.sqrt(weight2 / (grad2 + wd * weight2 + 1e-18))
        return min(max(lars, 0.01), 100)

    def _cumulate_gradient(self, grad, index):
        previous = self.cumgrads.get(index, {})
        if previous and previous["num_cums"] > 0:
            cumulated = {"cum_grad": previous["cum_grad"] + grad, "num_cums": previous["num_cums"] + 1}
        else:
            cumulated = {"cum_grad": grad, "num_cums": self.init_updates + 1}
        self.cumgrads[index] = cumulated
        return cumulated

    def update(self, index, weight, grad, state):
        lr, wd = self._get_lr(index), self._get_wd(index)
        self._update_count(index)
        cumulated = self._cumulate_gradient(grad, index)
        if cumulated["num_cums"] % self.batch_scale != 0:
            return
        grad = cumulated["cum_grad"] / self.batch_scale
        if self.warmup_strategy == "lars":
            lr *= self._get_lars(weight, grad, wd)
        else:
            lr *= self._get_lbmult(cumulated["num_cums"])
        kwargs = self._update_kwargs(self.momentum if self.momentum > 0 else None)
        if not isinstance(state, (list, tuple)):
            if state is not None:
                nd.sgd_mom_update(weight, grad, state, out=weight, lr=lr, wd=wd, **kwargs)
            else:
                nd.sgd_update(weight, grad, out=weight, lr=lr, wd=wd, **kwargs)
        elif state[0] is not None:
            nd.mp_sgd_mom_update(weight, grad, state[0], state[1], out=weight, lr=lr, wd=wd, **kwargs)
        else:
            nd.mp_sgd_update(weight, grad, state[1], out=weight, lr=lr, wd=wd, **kwargs)
        self.cumgrads[index]["cum_grad"] = 0

    def update_multi_precision(self, index, weight, grad, state):
        # create_state already keeps the master copy.
        self.update(index, weight, grad, state)

    def create_state_multi_precision(self, index, weight):
        return self.create_state(index, weight)


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
        lr, wd = self._get_lr(index), self._get_wd(index)
        kwargs = self._update_kwargs(self.momentum if self.momentum > 0 else None)
        if self.wd_lh:
            kwargs["wd_lh"] = self.wd_lh
        if state is not None:
            nd.signum_update(weight, grad, state, out=weight, lr=lr, wd=wd, **kwargs)
        else:
            kwargs.pop("momentum", None)
            nd.signsgd_update(weight, grad, out=weight, lr=lr, wd=wd, **kwargs)


@register
class FTML(Optimizer):
    """Follow the Moving Leader (Zheng and Kwok, 2017), with states (d, v, z) (ftml_update)."""

    def __init__(self, beta1=0.6, beta2=0.999, epsilon=1e-8, **kwargs):
        super().__init__(**kwargs)
        self.beta1, self.beta2, self.epsilon = beta1, beta2, epsilon

    def create_state(self, index, weight):
        return (_zeros_like(weight), _zeros_like(weight), _zeros_like(weight))

    def update(self, index, weight, grad, state):
        self._update_count(index)
        lr, wd = self._get_lr(index), self._get_wd(index)
        kwargs = {"beta1": self.beta1, "beta2": self.beta2, "epsilon": self.epsilon,
                  "rescale_grad": self.rescale_grad, "t": self._index_update_count[index]}
        if self.clip_gradient:
            kwargs["clip_grad"] = self.clip_gradient
        prev_d, prev_v, prev_z = state
        nd.ftml_update(weight, grad, prev_d, prev_v, prev_z, out=weight, lr=lr, wd=wd, **kwargs)


@register
class LAMB(Optimizer):
    """Layer-wise adaptive moments (You et al.): Adam's direction scaled by ||w|| / ||direction||
    (lamb_update_phase1/2; the mp_ forms for float16 weights with a float32 master copy).
    Weights are updated one at a time; MXNet's multi-tensor form gives the same results."""

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-6, lower_bound=None,
                 upper_bound=None, bias_correction=True, **kwargs):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.beta1, self.beta2, self.epsilon = beta1, beta2, epsilon
        self.lower_bound, self.upper_bound = lower_bound, upper_bound
        self.bias_correction = bias_correction

    def create_state(self, index, weight):
        return (_zeros_like(weight), _zeros_like(weight))

    def update(self, index, weight, grad, state):
        self._update_impl(index, weight, grad, state, multi_precision=False)

    def update_multi_precision(self, index, weight, grad, state):
        first = weight[0] if isinstance(weight, (list, tuple)) else weight
        self._update_impl(index, weight, grad, state, self.multi_precision and first.dtype == np.float16)

    def _update_impl(self, index, weight, grad, state, multi_precision):
        if isinstance(index, (list, tuple)):
            for i, w, g, s in zip(index, weight, grad, state):
                self._update_impl(i, w, g, s, multi_precision)
            return
        self._update_count(index)
        lr, wd = self._get_lr(index), self._get_wd(index)
        phase1 = {"beta1": self.beta1, "beta2": self.beta2, "epsilon": self.epsilon,
                  "bias_correction": self.bias_correction, "rescale_grad": self.rescale_grad,
                  "t": self._index_update_count[index]}
        if self.clip_gradient:
            phase1["clip_gradient"] = self.clip_gradient
        bounds = {}
        if self.lower_bound:
            bounds["lower_bound"] = self.lower_bound
        if self.upper_bound:
            bounds["upper_bound"] = self.upper_bound
        if multi_precision:
            weight32, (mean, var) = state
            direction = nd.mp_lamb_update_phase1(weight, grad, mean, var, weight32, wd=wd, **phase1)
            nd.mp_lamb_update_phase2(weight, direction, weight32.norm(), direction.norm(), weight32, lr=lr,
                                     out=weight, **bounds)
        else:
            mean, var = state
            direction = nd.lamb_update_phase1(weight, grad, mean, var, wd=wd, **phase1)
            nd.lamb_update_phase2(weight, direction, weight.norm(), direction.norm(), lr=lr, out=weight, **bounds)


@register
class DCASGD(Optimizer):
    """Delay-compensated asynchronous SGD (Zheng et al., 2016): the gradient is corrected by
    lamda * g * g * (w - w_previous). States: (momentum or None, previous weight)."""

    def __init__(self, momentum=0.0, lamda=0.04, **kwargs):
        super().__init__(**kwargs)
        self.momentum = momentum
        self.weight_previous = {}
        self.lamda = lamda

    def create_state(self, index, weight):
        return (_zeros_like(weight) if self.momentum != 0.0 else None, weight.copy())

    def update(self, index, weight, grad, state):
        self._update_count(index)
        lr, wd = self._get_lr(index), self._get_wd(index)
        grad = self._clipped(grad)
        mom, previous_weight = state
        step = -lr * (grad + wd * weight + self.lamda * grad * grad * (weight - previous_weight))
        if mom is not None:
            mom[:] = self.momentum * mom + step
        else:
            mom = step
        previous_weight[:] = weight
        weight[:] = weight + mom


@register
class SGLD(Optimizer):
    """Stochastic gradient Langevin dynamics: half an SGD step plus Gaussian noise of
    variance lr."""

    def update(self, index, weight, grad, state):
        self._update_count(index)
        lr, wd = self._get_lr(index), self._get_wd(index)
        grad = self._clipped(grad)
        weight[:] = weight - lr / 2 * (grad + wd * weight)
        weight[:] = weight + nd.random.normal(0, math.sqrt(lr), shape=weight.shape, dtype=weight.dtype,
                                              ctx=weight.context)


@register
class Adam(Optimizer):
    """Adam with MXNet's bias correction folded into the learning rate (adam_update).

    Weights are updated in groups of MXNET_OPTIMIZER_AGGREGATION_SIZE (45 by default, MXNet's
    LAMB default) by one multi_adam_update each, with the same values as one adam_update per
    weight. MXNet 1.x updates Adam's weights one at a time; for the small weights of an RNN or
    an MLP the per-call dispatch costs more than the update (7 weights: 53 -> 35 us a step). A
    subclass that redefines ``update`` gets its weights one at a time, as in MXNet."""

    _fused_op, _fused_mp_op = "multi_adam_update", "multi_mp_adam_update"

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8, lazy_update=True, **kwargs):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.beta1, self.beta2, self.epsilon = beta1, beta2, epsilon
        self.lazy_update = lazy_update
        own_rule = type(self).update is Adam.update and type(self).update_multi_precision is Adam.update_multi_precision
        self.aggregate_num = int(os.getenv("MXNET_OPTIMIZER_AGGREGATION_SIZE", "45")) if own_rule else 0

    def create_state(self, index, weight):
        return (_zeros_like(weight), _zeros_like(weight))

    def update(self, index, weight, grad, state):
        self._update_impl(index, weight, grad, state, multi_precision=False)

    def update_multi_precision(self, index, weight, grad, state):
        if type(self).update is not Adam.update:
            # A subclass's own rule, one weight at a time (aggregate_num is 0), as in MXNet.
            super().update_multi_precision(index, weight, grad, state)
            return
        first = weight[0] if isinstance(weight, (list, tuple)) else weight
        self._update_impl(index, weight, grad, state, self.multi_precision and first.dtype == np.float16)

    def _bias_corrected_lrs(self, indices):
        self._update_count(indices)
        lrs = self._get_lrs(indices)
        for k, index in enumerate(indices):
            t = self._index_update_count[index]
            lrs[k] *= math.sqrt(1.0 - self.beta2 ** t) / (1.0 - self.beta1 ** t)
        return lrs

    def _update_impl(self, index, weight, grad, state, multi_precision):
        single = not isinstance(index, (list, tuple))
        indices, weights, grads, states = ([index], [weight], [grad], [state]) if single else (index, weight, grad, state)
        lrs, wds = self._bias_corrected_lrs(indices), self._get_wds(indices)
        kwargs = dict(beta1=self.beta1, beta2=self.beta2, epsilon=self.epsilon, **self._update_kwargs())
        if multi_precision:
            # (weight32, (mean, var)) per weight: the float32 master copy is updated.
            groups = [[w, g, s[1][0], s[1][1], s[0]] for w, g, s in zip(weights, grads, states)]
        else:
            groups = [[w, g, s[0], s[1]] for w, g, s in zip(weights, grads, states)]
        self._apply(groups, weights, lrs, wds, multi_precision, kwargs)

    def _apply(self, groups, weights, lrs, wds, multi_precision, kwargs):
        if len(groups) == 1 and not multi_precision:
            nd.adam_update(*groups[0], out=weights[0], lr=lrs[0], wd=wds[0], **kwargs)
            return
        update = getattr(nd, self._fused_mp_op if multi_precision else self._fused_op)
        update(*_flatten(groups), out=list(weights), lrs=tuple(lrs), wds=tuple(wds), num_weights=len(groups), **kwargs)


@register
class AdamW(Adam):
    """Adam with decoupled weight decay (contrib.adamw_update):
    w -= eta * (lr * m_hat / (sqrt(v_hat) + eps) + wd * w). Not in MXNet 1.x's mx.optimizer
    (GluonNLP has it); kept for users of the contrib operator. Groups of weights go to one
    contrib.multi_adamw_update each, as Adam's do."""

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8, eta=1.0, **kwargs):
        super().__init__(learning_rate=learning_rate, beta1=beta1, beta2=beta2, epsilon=epsilon, **kwargs)
        self.eta = eta

    def _apply(self, groups, weights, lrs, wds, multi_precision, kwargs):
        rescale = nd.full((1,), kwargs.pop("rescale_grad"), ctx=weights[0].context, dtype=np.float32)
        if len(groups) == 1 and not multi_precision:
            nd.contrib.adamw_update(*groups[0], rescale, out=weights[0], lr=lrs[0], wd=wds[0], eta=self.eta,
                                    **kwargs)
            return
        fused = nd.contrib.multi_mp_adamw_update if multi_precision else nd.contrib.multi_adamw_update
        fused(*zip(*groups), rescale, lrs=tuple(lrs), wds=tuple(wds), etas=(self.eta,) * len(groups),
              out=list(weights), **kwargs)


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
        lr, wd = self._get_lr(index), self._get_wd(index)
        grad = self._clipped(grad)
        state[:] = state + nd.square(grad)
        weight[:] = weight - lr * (grad / nd.sqrt(state + self.float_stable_eps) + wd * weight)


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
        lr, wd = self._get_lr(index), self._get_wd(index)
        kwargs = self._update_kwargs()
        kwargs.update(gamma1=self.gamma1, epsilon=self.epsilon)
        if self.clip_weights:
            kwargs["clip_weights"] = self.clip_weights
        if self.centered:
            n, g, delta = state
            nd.rmspropalex_update(weight, grad, n, g, delta, out=weight, lr=lr, wd=wd, gamma2=self.gamma2, **kwargs)
        else:
            nd.rmsprop_update(weight, grad, state[0], out=weight, lr=lr, wd=wd, **kwargs)


@register
class AdaDelta(Optimizer):
    """AdaDelta (Zeiler): rates from running averages of squared gradients and updates."""

    def __init__(self, rho=0.90, epsilon=1e-5, **kwargs):
        super().__init__(**kwargs)
        self.rho, self.epsilon = rho, epsilon

    def create_state(self, index, weight):
        return (_zeros_like(weight), _zeros_like(weight))

    def update(self, index, weight, grad, state):
        wd = self._get_wd(index)
        self._update_count(index)
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
        lr, wd = self._get_lr(index), self._get_wd(index)
        z, n = state
        nd.ftrl_update(weight, grad, z, n, out=weight, lr=lr, wd=wd, lamda1=self.lamda1, beta=self.beta,
                       **self._update_kwargs())


@register
class Adamax(Optimizer):
    """AdaMax (Kingma and Ba, section 7): Adam with the infinity norm.
    g = clip(grad * rescale_grad + wd * w); m = beta1 * m + (1 - beta1) * g;
    u = max(beta2 * u, |g|); w -= lr / (1 - beta1^t) * m / u."""

    def __init__(self, learning_rate=0.002, beta1=0.9, beta2=0.999, **kwargs):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.beta1, self.beta2 = beta1, beta2

    def create_state(self, index, weight):
        return (_zeros_like(weight), _zeros_like(weight))

    def update(self, index, weight, grad, state):
        self._update_count(index)
        lr, wd = self._get_lr(index), self._get_wd(index)
        lr /= 1.0 - self.beta1 ** self._index_update_count[index]
        grad = grad * self.rescale_grad + wd * weight
        if self.clip_gradient is not None:
            grad = nd.clip(grad, -self.clip_gradient, self.clip_gradient)
        m_t, u_t = state
        m_t[:] = self.beta1 * m_t + (1.0 - self.beta1) * grad
        u_t[:] = nd.maximum(self.beta2 * u_t, nd.abs(grad))
        weight[:] = weight - lr * m_t / u_t


@register
class Nadam(Optimizer):
    """Adam with Nesterov momentum (Dozat, 2016) and the momentum schedule
    beta1 * (1 - 0.5 * 0.96^(t * schedule_decay))."""

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8, schedule_decay=0.004, **kwargs):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.beta1, self.beta2, self.epsilon = beta1, beta2, epsilon
        self.schedule_decay = schedule_decay
        # Product of the momentum schedule so far; shared by all weights, as in MXNet.
        self.m_schedule = 1.0

    def create_state(self, index, weight):
        return (_zeros_like(weight), _zeros_like(weight))

    def update(self, index, weight, grad, state):
        self._update_count(index)
        lr, wd = self._get_lr(index), self._get_wd(index)
        t = self._index_update_count[index]
        grad = grad * self.rescale_grad + wd * weight
        if self.clip_gradient is not None:
            grad = nd.clip(grad, -self.clip_gradient, self.clip_gradient)
        momentum_t = self.beta1 * (1.0 - 0.5 * (0.96 ** (t * self.schedule_decay)))
        momentum_next = self.beta1 * (1.0 - 0.5 * (0.96 ** ((t + 1) * self.schedule_decay)))
        self.m_schedule = self.m_schedule * momentum_t
        m_schedule_next = self.m_schedule * momentum_next
        m_t, v_t = state
        m_t[:] = self.beta1 * m_t + (1.0 - self.beta1) * grad
        v_t[:] = self.beta2 * v_t + (1.0 - self.beta2) * grad * grad
        grad_prime = grad / (1.0 - self.m_schedule)
        m_t_prime = m_t / (1.0 - m_schedule_next)
        v_t_prime = v_t / (1.0 - self.beta2 ** t)
        m_t_bar = (1.0 - momentum_t) * grad_prime + momentum_next * m_t_prime
        weight[:] = weight - lr * m_t_bar / (nd.sqrt(v_t_prime) + self.epsilon)


@register
class Test(Optimizer):
    """MXNet's test optimizer: w += rescale_grad * grad; the state mirrors the weight."""

    def create_state(self, index, weight):
        return nd.zeros(weight.shape, ctx=weight.context)

    def update(self, index, weight, grad, state):
        weight[:] = weight + grad * self.rescale_grad
        state[:] = weight


class Updater:
    """Applies an optimizer to (index, grad, weight) triples (or lists of them), creating each
    index's state on first use; with an optimizer that aggregates (aggregate_num > 0), weights
    of one dtype are handed over in groups of aggregate_num. States pickle (get_states /
    set_states), optionally with the optimizer."""

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.states = {}
        self.states_synced = {}
        self.aggregate_updates = optimizer.aggregate_num > 0

    def __call__(self, index, grad, weight):
        if isinstance(index, (list, tuple)):
            indices, grads, weights = list(index), list(grad), list(weight)
        else:
            indices, grads, weights = [index], [grad], [weight]
        if weights:
            self.optimizer._set_current_context(weights[0].context.device_id)
        for i, idx in enumerate(indices):
            if isinstance(idx, bytes):
                idx = indices[i] = py_str(idx)
            if idx not in self.states:
                self.states[idx] = self.optimizer.create_state_multi_precision(idx, weights[i])
                self.states_synced[idx] = True
            elif not self.states_synced[idx]:
                self.states[idx] = self.sync_state_context(self.states[idx], weights[i].context)
                self.states_synced[idx] = True
        if not self.aggregate_updates:
            for i, g, w in zip(indices, grads, weights):
                self.optimizer.update_multi_precision(i, w, g, self.states[i])
            return
        # One call per group of weights sharing a dtype (a group is one fused operator).
        by_dtype = {}
        for i, g, w in zip(indices, grads, weights):
            by_dtype.setdefault(w.dtype, []).append((i, w, g))
        size = self.optimizer.aggregate_num
        for items in by_dtype.values():
            for start in range(0, len(items), size):
                group = items[start:start + size]
                self.optimizer.update_multi_precision([i for i, _, _ in group], [w for _, w, _ in group],
                                                      [g for _, _, g in group], [self.states[i] for i, _, _ in group])

    def sync_state_context(self, state, context):
        """The state (an NDArray, or nested tuples/lists of them) on `context`."""
        if isinstance(state, NDArray):
            return state.as_in_context(context)
        if isinstance(state, (tuple, list)):
            return type(state)(self.sync_state_context(s, context) for s in state)
        return state

    def set_states(self, states):
        loaded = pickle.loads(states)
        if isinstance(loaded, tuple) and len(loaded) == 2:
            self.states, self.optimizer = loaded
        else:
            self.states = loaded
        self.states_synced = dict.fromkeys(self.states.keys(), False)

    def get_states(self, dump_optimizer=False):
        return pickle.dumps((self.states, self.optimizer) if dump_optimizer else self.states)


def get_updater(optimizer):
    return Updater(optimizer)


__all__ = ["AdaDelta", "AdaGrad", "Adam", "AdamW", "Adamax", "DCASGD", "FTML", "Ftrl", "LARS", "LBSGD", "NAG",
           "NDabs", "Nadam", "Optimizer", "RMSProp", "SGD", "SGLD", "Signum", "LAMB", "Test", "Updater", "ccSGD",
           "create", "get_updater", "register"]
