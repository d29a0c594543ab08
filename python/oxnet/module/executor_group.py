"""Data parallelism for ``Module``: one executor per context, each computing a slice of the
batch along its batch axis (MXNet's ``mxnet.module.executor_group``)."""

import logging
from collections import OrderedDict

from .. import context as ctx
from .. import ndarray as nd
from ..io import DataDesc
from ..symbol.symbol import _DTYPE_FLAGS

_DTYPE_BY_FLAG = {flag: name for name, flag in _DTYPE_FLAGS.items()}


def _split_input_slice(batch_size, work_load_list):
    """Slices of ``range(batch_size)``, one per device, sized in proportion to the workloads."""
    total_work_load = sum(work_load_list)
    batch_num_list = [round(work_load * batch_size / total_work_load) for work_load in work_load_list]
    batch_num_sum = sum(batch_num_list)
    if batch_num_sum < batch_size:
        batch_num_list[-1] += batch_size - batch_num_sum
    slices = []
    end = 0
    for batch_num in batch_num_list:
        begin = int(min(end, batch_size))
        end = int(min(begin + batch_num, batch_size))
        if begin >= end:
            raise ValueError("Too many slices. Some splits are empty.")
        slices.append(slice(begin, end))
    return slices


def _copy_slice(src, dst, axis, window):
    """Copy ``src[window]`` along ``axis`` (all of ``src`` when it already fits) into ``dst``."""
    if axis >= 0 and (window.start != 0 or src.shape[axis] != window.stop):
        src = nd.slice_axis(src, axis=axis, begin=window.start, end=window.stop)
    src.copyto(dst)


def _load_general(data, targets, major_axis):
    """Copy each source array into its targets: a target list of (slice, array) pairs gets one
    slice per device; a list of sources (pre-sliced batches) is copied one to one."""
    for d_src, d_targets, axis in zip(data, targets, major_axis):
        if isinstance(d_targets, nd.NDArray):
            d_src.copyto(d_targets)
        elif isinstance(d_src, (list, tuple)):
            for src, dst in zip(d_src, d_targets):
                src.copyto(dst)
        else:
            for window, d_dst in d_targets:
                _copy_slice(d_src, d_dst, axis, window)


def _load_batch_part(batch, targets, major_axis, part):
    if isinstance(batch, list):
        # One pre-sliced DataBatch per device.
        per_input = [[getattr(b, part)[i] for b in batch] for i in range(len(targets))]
        _load_general(per_input, [[dst for _, dst in d_target] for d_target in targets], major_axis)
    else:
        _load_general(getattr(batch, part), targets, major_axis)


def _merge_multi_context(outputs, major_axis):
    """Join each output's per-device parts along its batch axis (axis -1: take device 0's)."""
    merged = []
    for tensors, axis in zip(outputs, major_axis):
        if axis >= 0 and len(tensors) > 1:
            merged.append(nd.concat(*[t.as_in_context(tensors[0].context) for t in tensors], dim=axis))
        else:
            merged.append(tensors[0])
    return merged


def _prepare_group2ctxs(group2ctxs, ctx_len):
    """One {ctx_group: context} dict (or None) per device from a dict, or a list of dicts."""
    if group2ctxs is None:
        return [None] * ctx_len
    if isinstance(group2ctxs, list):
        assert len(group2ctxs) == ctx_len, "length of group2ctxs should be %d" % ctx_len
        return group2ctxs
    if isinstance(group2ctxs, dict):
        per_device = [{} for _ in range(ctx_len)]
        for group, contexts in group2ctxs.items():
            if isinstance(contexts, ctx.Context):
                contexts = [contexts] * ctx_len
            elif len(contexts) == 1:
                contexts = list(contexts) * ctx_len
            else:
                assert len(contexts) == ctx_len, "length of group2ctxs[%s] should be %d or 1" % (group, ctx_len)
            for i in range(ctx_len):
                per_device[i][group] = contexts[i]
        return per_device
    raise TypeError("group2ctxs should be a list of dicts of str to context, or a dict of str to "
                    "context or list of contexts")


def _as_descs(shapes):
    return None if shapes is None else [x if isinstance(x, DataDesc) else DataDesc(*x) for x in shapes]


class DataParallelExecutorGroup:
    """Executors of ``symbol``, one per context, sharing the work of a batch: each binds the
    slice of the batch its workload gives it. Parameters are copied on every device; their
    gradients stay per device (``Module.update`` sums them)."""

    def __init__(self, symbol, contexts, workload, data_shapes, label_shapes, param_names, for_training,
                 inputs_need_grad, shared_group=None, logger=logging, fixed_param_names=None, grad_req="write",
                 state_names=None, group2ctxs=None):
        self.param_names = param_names
        self.arg_names = symbol.list_arguments()
        self.aux_names = symbol.list_auxiliary_states()
        self.symbol = symbol
        self.contexts = contexts
        self.workload = workload
        self.group2ctxs = _prepare_group2ctxs(group2ctxs, len(contexts))
        self.for_training = for_training
        self.inputs_need_grad = inputs_need_grad
        self.logger = logger
        self._total_exec_bytes = 0
        self.fixed_param_names = list(fixed_param_names or [])
        self.state_names = list(state_names or [])
        if not for_training:
            grad_req = "null"
        data_shapes = _as_descs(data_shapes)
        label_shapes = _as_descs(label_shapes)
        data_names = [x.name for x in data_shapes]
        self.grad_req = self._grad_requests(grad_req, data_names)
        if shared_group is not None:
            self.shared_data_arrays = shared_group.shared_data_arrays
        else:
            self.shared_data_arrays = [{} for _ in contexts]
        self.batch_size = None
        self.slices = None
        self.execs = []
        self._default_execs = None
        self.data_arrays = None
        self.label_arrays = None
        self.param_arrays = None
        self.state_arrays = None
        self.grad_arrays = None
        self.aux_arrays = None
        self.input_grad_arrays = None
        self.data_shapes = None
        self.label_shapes = None
        self.data_names = None
        self.label_names = None
        self.data_layouts = None
        self.label_layouts = None
        self.output_names = self.symbol.list_outputs()
        self.num_outputs = len(self.output_names)
        self.output_layouts = [DataDesc.get_batch_axis(self.symbol[index].attr("__layout__"))
                               for index in range(self.num_outputs)]
        self.bind_exec(data_shapes, label_shapes, shared_group)

    def _grad_requests(self, grad_req, data_names):
        """grad_req per argument: parameters get ``grad_req`` ('null' when fixed), data inputs
        only with ``inputs_need_grad``, labels and states never."""
        def default(name, req):
            if name in self.param_names:
                return "null" if name in self.fixed_param_names else req
            if name in data_names:
                return req if self.inputs_need_grad else "null"
            return "null"
        if isinstance(grad_req, str):
            return {name: default(name, grad_req) for name in self.arg_names}
        if isinstance(grad_req, (list, tuple)):
            assert len(grad_req) == len(self.arg_names)
            return dict(zip(self.arg_names, grad_req))
        if isinstance(grad_req, dict):
            requests = {name: default(name, "write") for name in self.arg_names}
            requests.update(grad_req)
            return requests
        raise ValueError("grad_req must be one of str, list, tuple, or dict.")

    def decide_slices(self, data_shapes):
        """Batch axis of each input; sets the batch size and the per-device slices."""
        assert len(data_shapes) > 0
        major_axis = [DataDesc.get_batch_axis(x.layout) for x in data_shapes]
        for (name, shape), axis in zip(data_shapes, major_axis):
            if axis == -1:
                continue
            batch_size = shape[axis]
            if self.batch_size is not None:
                assert batch_size == self.batch_size, ("all data must have the same batch size: "
                                                       + ("batch_size = %d, but " % self.batch_size)
                                                       + ("%s has shape %s" % (name, shape)))
            else:
                self.batch_size = batch_size
                self.slices = _split_input_slice(self.batch_size, self.workload)
        return major_axis

    def _collect_arrays(self):
        """Per-input lists of the executors' arrays."""
        self.data_arrays = [[(self.slices[i], e.arg_dict[name]) for i, e in enumerate(self.execs)]
                            for name, _ in self.data_shapes]
        self.state_arrays = [[e.arg_dict[name] for e in self.execs] for name in self.state_names]
        if self.label_shapes is not None:
            self.label_arrays = [[(self.slices[i], e.arg_dict[name]) for i, e in enumerate(self.execs)]
                                 for name, _ in self.label_shapes]
        else:
            self.label_arrays = None
        self.param_arrays = [[e.arg_arrays[i] for e in self.execs]
                             for i, name in enumerate(self.arg_names) if name in self.param_names]
        if self.for_training:
            self.grad_arrays = [[e.grad_arrays[i] for e in self.execs]
                                for i, name in enumerate(self.arg_names) if name in self.param_names]
        else:
            self.grad_arrays = None
        if self.inputs_need_grad:
            self.input_grad_arrays = [[e.grad_arrays[self.arg_names.index(name)] for e in self.execs]
                                      for name, _ in self.data_shapes if name in self.arg_names]
        else:
            self.input_grad_arrays = None
        self.aux_arrays = [[e.aux_arrays[i] for e in self.execs] for i in range(len(self.aux_names))]

    def bind_exec(self, data_shapes, label_shapes, shared_group=None, reshape=False):
        """Bind one executor per context (or, with ``reshape``, reshape the first-bound ones)."""
        assert reshape or not self.execs
        self.batch_size = None
        self.data_layouts = self.decide_slices(data_shapes)
        if label_shapes is not None:
            self.label_layouts = self.decide_slices(label_shapes)
        for i in range(len(self.contexts)):
            data_shapes_i = self._sliced_shape(data_shapes, i, self.data_layouts)
            label_shapes_i = self._sliced_shape(label_shapes, i, self.label_layouts) if label_shapes is not None else []
            if reshape:
                self.execs[i] = self._default_execs[i].reshape(allow_up_sizing=True,
                                                               **dict(data_shapes_i + label_shapes_i))
            else:
                self.execs.append(self._bind_ith_exec(i, data_shapes_i, label_shapes_i, shared_group))
        self.data_shapes = data_shapes
        self.label_shapes = label_shapes
        self.data_names = [i.name for i in self.data_shapes]
        if label_shapes is not None:
            self.label_names = [i.name for i in self.label_shapes]
        self._collect_arrays()

    def reshape(self, data_shapes, label_shapes):
        """Rebind for new input shapes; parameters keep their arrays."""
        if data_shapes == self.data_shapes and label_shapes == self.label_shapes:
            return
        if self._default_execs is None:
            self._default_execs = list(self.execs)
        self.bind_exec(data_shapes, label_shapes, reshape=True)

    def set_params(self, arg_params, aux_params, allow_extra=False):
        """Copy the given values into every device's parameters."""
        for executor in self.execs:
            executor.copy_params_from(arg_params, aux_params, allow_extra_params=allow_extra)

    def get_params(self, arg_params, aux_params):
        """Write the mean over devices of each parameter into ``arg_params`` / ``aux_params``."""
        for names, blocks, target in ((self.param_names, self.param_arrays, arg_params),
                                      (self.aux_names, self.aux_arrays, aux_params)):
            for name, block in zip(names, blocks):
                total = block[0].copyto(ctx.cpu())
                for weight in block[1:]:
                    total += weight.copyto(ctx.cpu())
                if len(block) > 1:
                    total /= len(block)
                total.astype(target[name].dtype).copyto(target[name])

    def forward(self, data_batch, is_train=None):
        """Load the batch (sliced across devices) and run every executor forward."""
        _load_batch_part(data_batch, self.data_arrays, self.data_layouts, "data")
        if is_train is None:
            is_train = self.for_training
        if self.label_arrays is not None:
            labels = data_batch[0].label if isinstance(data_batch, list) else data_batch.label
            if labels:
                _load_batch_part(data_batch, self.label_arrays, self.label_layouts, "label")
        for executor in self.execs:
            executor.forward(is_train=is_train)

    def get_output_shapes(self):
        """(name, shape) of each output for the whole batch."""
        shapes = []
        for key, out, axis in zip(self.symbol.list_outputs(), self.execs[0].outputs, self.output_layouts):
            shape = list(out.shape)
            if axis >= 0:
                shape[axis] = self.batch_size
            shapes.append((key, tuple(shape)))
        return shapes

    def get_outputs(self, merge_multi_context=True, begin=0, end=None):
        """Outputs ``begin:end``: per output a list over devices, or joined across devices."""
        if end is None:
            end = self.num_outputs
        outputs = [[executor.outputs[i] for executor in self.execs] for i in range(begin, end)]
        if merge_multi_context:
            outputs = _merge_multi_context(outputs, self.output_layouts[begin:end])
        return outputs

    def get_states(self, merge_multi_context=True):
        assert not merge_multi_context, "merge_multi_context=True is not supported for get_states yet."
        return self.state_arrays

    def set_states(self, states=None, value=None):
        """Set the state inputs from per-device arrays ``states`` or to the scalar ``value``."""
        if states is not None:
            assert value is None, "Only one of states & value can be specified."
            _load_general(states, self.state_arrays, (0,) * len(states))
        else:
            assert value is not None, "At least one of states & value must be specified."
            for d_dst in self.state_arrays:
                for dst in d_dst:
                    dst[:] = value

    def get_input_grads(self, merge_multi_context=True):
        assert self.inputs_need_grad
        if merge_multi_context:
            return _merge_multi_context(self.input_grad_arrays, self.data_layouts)
        return self.input_grad_arrays

    def backward(self, out_grads=None):
        """Backward on every executor, each with its slice of ``out_grads``."""
        assert self.for_training, "re-bind with for_training=True to run backward"
        out_grads = [] if out_grads is None else out_grads
        if isinstance(out_grads, nd.NDArray):
            out_grads = [out_grads]
        for i, (executor, window) in enumerate(zip(self.execs, self.slices)):
            sliced = []
            for grad, axis in zip(out_grads, self.output_layouts):
                if axis >= 0:
                    part = nd.slice_axis(grad, axis=axis, begin=window.start, end=window.stop)
                    sliced.append(part.as_in_context(self.contexts[i]))
                else:
                    sliced.append(grad.copyto(self.contexts[i]))
            executor.backward(out_grads=sliced)

    def update_metric(self, eval_metric, labels, pre_sliced):
        """Update ``eval_metric`` with each device's outputs and its slice of ``labels``."""
        for device, (executor, window) in enumerate(zip(self.execs, self.slices)):
            if pre_sliced:
                labels_slice = labels[device]
            else:
                labels_slice = []
                for label, axis in zip(labels, self.label_layouts):
                    if axis == 0:
                        labels_slice.append(label[window])
                    elif axis > 0:
                        labels_slice.append(nd.slice_axis(label, axis=axis, begin=window.start, end=window.stop))
                    else:
                        labels_slice.append(label)
            eval_metric.update_dict(OrderedDict(zip(self.label_names or [], labels_slice)),
                                    OrderedDict(zip(self.output_names, executor.outputs)))

    def _bind_ith_exec(self, i, data_shapes, label_shapes, shared_group):
        shared_exec = None if shared_group is None else shared_group.execs[i]
        input_shapes = dict(data_shapes)
        input_shapes.update(dict(label_shapes))
        input_types = {x.name: x.dtype for x in data_shapes}
        # A data variable declared with a dtype keeps it, whatever the DataDesc says.
        attrs = self.symbol.attr_dict()
        for name in input_types:
            flag = attrs.get(name, {}).get("__dtype__", "-1")
            if flag != "-1":
                input_types[name] = _DTYPE_BY_FLAG[int(flag)]
        input_types.update({x.name: x.dtype for x in label_shapes})
        executor = self.symbol.simple_bind(ctx=self.contexts[i], grad_req=self.grad_req, type_dict=input_types,
                                           shared_arg_names=self.param_names, shared_exec=shared_exec,
                                           group2ctx=self.group2ctxs[i], shared_buffer=self.shared_data_arrays[i],
                                           **input_shapes)
        self._total_exec_bytes += executor.planned_bytes >> 20
        return executor

    def _sliced_shape(self, shapes, i, major_axis):
        """The descriptions of device ``i``'s slice of the inputs."""
        sliced = []
        for desc, axis in zip(shapes, major_axis):
            shape = list(desc.shape)
            if axis >= 0:
                shape[axis] = self.slices[i].stop - self.slices[i].start
            sliced.append(DataDesc(desc.name, tuple(shape), desc.dtype, desc.layout))
        return sliced

    def install_monitor(self, mon):
        """Let ``mon`` watch every executor."""
        for executor in self.execs:
            mon.install(executor)
