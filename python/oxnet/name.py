"""Automatic names for symbols (MXNet's ``mxnet.name``): ``fullyconnected0``, ``prefix_fc1``."""

import threading

_state = threading.local()


class _PerThreadCurrent(type):
    """Metaclass of ``NameManager``: ``NameManager.current`` is this thread's name manager, both when read and when
    assigned (MXNet keeps it per thread; a plain class attribute would be shared by all threads)."""

    @property
    def current(cls):
        return current()

    @current.setter
    def current(cls, value):
        _state.current = value


class NameManager(metaclass=_PerThreadCurrent):
    """Gives each unnamed operator the name ``<hint><count>``; used as a ``with`` scope."""

    def __init__(self):
        self._counter = {}
        self._old_manager = None

    def get(self, name, hint):
        """The name to use: ``name`` when given, else the hint with a per-hint counter."""
        if name:
            return name
        count = self._counter.get(hint, 0)
        self._counter[hint] = count + 1
        return "%s%d" % (hint, count)

    def __enter__(self):
        self._old_manager = current()
        _state.current = self
        return self

    def __exit__(self, ptype, value, trace):
        _state.current = self._old_manager


class Prefix(NameManager):
    """Prepends ``prefix`` to every name, given or generated."""

    def __init__(self, prefix):
        super().__init__()
        self._prefix = prefix

    def get(self, name, hint):
        return self._prefix + super().get(name, hint)


def current():
    manager = getattr(_state, "current", None)
    if manager is None:
        manager = _state.current = NameManager()
    return manager

