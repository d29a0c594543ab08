"""Attribute scopes for symbols (MXNet's ``mxnet.attribute``)."""

import threading
from collections import defaultdict

_state = threading.local()


class _PerThreadCurrent(type):
    """Metaclass of ``AttrScope``: ``AttrScope.current`` is this thread's attribute scope, both when read and when
    assigned (MXNet keeps it per thread; a plain class attribute would be shared by all threads)."""

    @property
    def current(cls):
        return current()

    @current.setter
    def current(cls, value):
        _state.current = value


class AttrScope(metaclass=_PerThreadCurrent):
    """Attributes every symbol created inside the ``with`` block receives (values are strings)."""

    # How many control flow subgraphs of each name were made (`foreach0`, `foreach1`, ...).
    _subgraph_names = defaultdict(int)

    def __init__(self, **kwargs):
        for value in kwargs.values():
            if not isinstance(value, str):
                raise ValueError("Attributes need to be string")
        self._attr = kwargs
        self._old_scope = None

    def get(self, attr):
        """``attr`` merged over the scope's attributes."""
        if self._attr:
            merged = dict(self._attr)
            if attr:
                merged.update(attr)
            return merged
        return dict(attr) if attr else {}

    def __enter__(self):
        self._old_scope = current()
        merged = dict(self._old_scope._attr)
        merged.update(self._attr)
        self._attr = merged
        _state.current = self
        return self

    def __exit__(self, ptype, value, trace):
        _state.current = self._old_scope


def current():
    scope = getattr(_state, "current", None)
    if scope is None:
        scope = _state.current = AttrScope()
    return scope

