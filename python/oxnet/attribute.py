"""Attribute scopes for symbols (MXNet's ``mxnet.attribute``)."""

import threading

_state = threading.local()


class AttrScope:
    """Attributes every symbol created inside the ``with`` block receives (values are strings)."""

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


class _CurrentDescriptor:
    def __get__(self, instance, owner):
        return current()


AttrScope.current = _CurrentDescriptor()
