"""Monitor (MXNet's ``mxnet.monitor``, also ``mx.mon``): statistics of the arrays an executor
computes, collected every ``interval`` batches."""

import logging
import re
from math import sqrt

from . import ndarray
from .ndarray import NDArray


class Monitor:
    """Collects ``stat_func(array)`` for every output (and, with ``monitor_all``, every input)
    of the installed executors' operators whose name matches ``pattern``, plus their
    arguments and auxiliary states at ``toc``. The default statistic is norm / sqrt(size)."""

    def __init__(self, interval, stat_func=None, pattern=".*", sort=False, monitor_all=False):
        if stat_func is None:
            def asum_stat(x):
                return ndarray.norm(x) / sqrt(x.size)
            stat_func = asum_stat
        self.stat_func = stat_func
        self.interval = interval
        self.activated = False
        self.queue = []
        self.step = 0
        self.exes = []
        self.re_prog = re.compile(pattern)
        self.sort = sort
        self.monitor_all = monitor_all

    def stat_helper(self, name, array):
        """The executor's callback: record the statistic of ``array`` while active."""
        if not self.activated or not self.re_prog.match(name):
            return
        self.queue.append((self.step, name, self.stat_func(array)))

    def install(self, exe):
        """Watch executor ``exe``."""
        exe.set_monitor_callback(self.stat_helper, self.monitor_all)
        self.exes.append(exe)

    def tic(self):
        """Start collecting if this batch is one of every ``interval``."""
        if self.step % self.interval == 0:
            self.queue = []
            self.activated = True
        self.step += 1

    def toc(self):
        """Stop collecting; (step, name, statistic text) for everything collected."""
        if not self.activated:
            return []
        for exe in self.exes:
            for name, array in zip(exe._symbol.list_arguments(), exe.arg_arrays):
                if self.re_prog.match(name):
                    self.queue.append((self.step, name, self.stat_func(array)))
            for name, array in zip(exe._symbol.list_auxiliary_states(), exe.aux_arrays):
                if self.re_prog.match(name):
                    self.queue.append((self.step, name, self.stat_func(array)))
        self.activated = False
        if self.sort:
            self.queue.sort(key=lambda x: x[1])
        result = []
        for step, name, values in self.queue:
            if isinstance(values, NDArray):
                values = [values]
            assert isinstance(values, list)
            text = ""
            for value in values:
                assert isinstance(value, NDArray)
                text += (str(value.asscalar()) if value.shape == (1,) else str(value.asnumpy())) + "\t"
            result.append((step, name, text))
        self.queue = []
        return result

    def toc_print(self):
        """``toc`` and log the results."""
        for step, name, value in self.toc():
            logging.info("Batch: {:7d} {:30s} {:s}".format(step, name, value))
