"""The profiler (MXNet's ``mxnet.profiler``).

The engine records every operator it runs (which thread, when it was pushed, started and ended,
where Python pushed it from), the storage pool the bytes in use, and the API the calls Python makes
into the core. ``dump()`` writes a Chrome trace-event file (open it in chrome://tracing or
https://ui.perfetto.dev): one lane per engine worker, plus the Python thread for the small
operators it runs inline. ``dumps()`` returns MXNet's aggregate statistics table (or JSON).

    mx.profiler.set_config(profile_all=True, filename='trace.json', aggregate_stats=True)
    mx.profiler.set_state('run')
    ...                                  # the code to profile
    mx.nd.waitall()
    mx.profiler.set_state('stop')
    mx.profiler.dump()
    print(mx.profiler.dumps())
"""

import atexit
import contextlib
import threading
import warnings

from . import _core
from .base import MXNetError

_STATES = {"stop": False, "run": True}
_PROCESSES = ("worker", "server")
_FORMATS = ("table", "json")
_SORT_KEYS = ("total", "avg", "min", "max", "count")

profiler_kvstore_handle = None


def set_kvstore_handle(handle):
    """Remember the kvstore whose server ``profile_process='server'`` would profile."""
    global profiler_kvstore_handle
    profiler_kvstore_handle = handle


def _check_process(profile_process):
    if profile_process not in _PROCESSES:
        raise ValueError("profile_process must be 'worker' or 'server', got %r" % (profile_process,))
    if profile_process == "server":
        raise MXNetError("profile_process='server' profiles the server of a distributed kvstore "
                         "(dist_sync, dist_async), which this process does not run; use 'worker'")


def set_config(**kwargs):
    """Configure the profiler (keyword arguments only; those not given take their defaults).

    Parameters
    ----------
    filename : str, default 'profile.json'
        The trace file ``dump`` writes.
    profile_all : bool, default False
        Record everything below.
    profile_symbolic : bool, default True
        Record the operators of bound executors and hybridized blocks.
    profile_imperative : bool, default True
        Record operators called imperatively (``mx.nd.*``, autograd's backward).
    profile_memory : bool, default True
        Record the host storage in use after every allocation and release.
    profile_api : bool, default True
        Record the calls Python makes into the core (named as MXNet's C API functions).
    continuous_dump : bool, default True
        Write the trace at exit if it was not dumped.
    dump_period : float, default 1
        Accepted for compatibility (dumps happen at ``dump()`` and at exit).
    aggregate_stats : bool, default False
        Keep the statistics that ``dumps()`` reports.
    profile_process : {'worker', 'server'}, default 'worker'
    """
    pairs = [(str(key), str(value)) for key, value in kwargs.items()]
    _core.profiler_set_config(pairs)


def profiler_set_config(mode="symbolic", filename="profile.json"):
    """Configure the profiler (deprecated: use ``set_config``). ``mode`` is 'symbolic' or 'all'."""
    warnings.warn("profiler.profiler_set_config() is deprecated. Please use profiler.set_config() instead")
    if mode not in ("symbolic", "imperative", "all", "memory", "api"):
        raise ValueError("profiler_set_config: mode must be 'symbolic' or 'all', got %r" % (mode,))
    set_config(**{"profile_" + mode: True, "filename": filename})


def set_state(state="stop", profile_process="worker"):
    """Start (``'run'``) or stop (``'stop'``) recording."""
    if state not in _STATES:
        raise KeyError("profiler state must be 'run' or 'stop', got %r" % (state,))
    _check_process(profile_process)
    _core.profiler_set_state(_STATES[state])


def profiler_set_state(state="stop"):
    """Start or stop recording (deprecated: use ``set_state``)."""
    warnings.warn("profiler.profiler_set_state() is deprecated. Please use profiler.set_state() instead")
    set_state(state)


def dump(finished=True, profile_process="worker"):
    """Write the trace recorded so far to the configured file.

    Parameters
    ----------
    finished : bool, default True
        Also forget what was written, so that a later run starts a new trace. With False the
        records are kept and each dump rewrites the file with everything so far.
    """
    _check_process(profile_process)
    _core.profiler_dump(bool(finished))


def dump_profile():
    """Write the trace (deprecated: use ``dump``)."""
    warnings.warn("profiler.dump_profile() is deprecated. Please use profiler.dump() instead")
    dump(True)


def dumps(reset=False, format="table", sort_by="total", ascending=False):
    """The aggregate statistics (needs ``aggregate_stats=True``; empty otherwise).

    Parameters
    ----------
    reset : bool
        Clear the statistics after reporting them.
    format : {'table', 'json'}
    sort_by : {'total', 'avg', 'min', 'max', 'count'}
        The statistic entries are ordered by within each domain.
    ascending : bool
    """
    assert format in _FORMATS, "Invalid value provided for format: {0}. Support: 'table', 'json'".format(format)
    assert sort_by in _SORT_KEYS, \
        "Invalid value provided for sort_by: {0}. Support: 'total', 'avg', 'min', 'max', 'count'".format(sort_by)
    assert ascending in (False, True), "Invalid value provided for ascending: {0}. Support: False, True".format(ascending)
    assert reset in (False, True), "Invalid value provided for reset: {0}. Support: False, True".format(reset)
    return _core.profiler_dumps(bool(reset), format, sort_by, bool(ascending))


def pause(profile_process="worker"):
    """Stop recording until ``resume()``, without stopping the profiler."""
    _check_process(profile_process)
    _core.profiler_set_paused(True)


def resume(profile_process="worker"):
    """Resume recording after ``pause()``."""
    _check_process(profile_process)
    _core.profiler_set_paused(False)


class Domain(object):
    """A named group of tasks, frames, counters and markers (a category in the trace).

    Parameters
    ----------
    name : str
    """

    def __init__(self, name):
        self.name = str(name)

    def __str__(self):
        return self.name

    def new_task(self, name):
        """A ``Task`` of this domain."""
        return Task(self, name)

    def new_frame(self, name):
        """A ``Frame`` of this domain."""
        return Frame(self, name)

    def new_counter(self, name, value=None):
        """A ``Counter`` of this domain."""
        return Counter(self, name, value)

    def new_marker(self, name):
        """A ``Marker`` of this domain."""
        return Marker(self, name)


class _Duration(object):
    """Something timed between ``start()`` and ``stop()``, recorded at ``stop()``."""

    _style = "thread"

    def __init__(self, category, name):
        self.name = str(name)
        self._category = category
        self._start = None

    def start(self):
        """Start timing."""
        self._start = _core.profiler_now()

    def stop(self):
        """Stop timing and record the span (nothing if not started, or if the profiler is not
        running)."""
        if self._start is None:
            return
        start, self._start = self._start, None
        _core.profiler_record_span(self._style, self._category, self.name, start, _core.profiler_now())

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def __str__(self):
        return self.name


class Task(_Duration):
    """A unit of work of a domain; all passes of one name are aggregated together. Tasks may
    overlap, so each is drawn on a track of its own.

    Parameters
    ----------
    domain : Domain
    name : str
    """

    _style = "async"

    def __init__(self, domain, name):
        super(Task, self).__init__(str(domain), name)


class Frame(_Duration):
    """A period of a domain's work (one iteration, one rendered frame), in the domain's frame
    category.

    Parameters
    ----------
    domain : Domain
    name : str
    """

    _style = "async"

    def __init__(self, domain, name):
        super(Frame, self).__init__("%s,frame" % domain, name)


class Event(_Duration):
    """A span of the calling thread, drawn on its lane in the "event" category.

    Parameters
    ----------
    name : str
    """

    def __init__(self, name):
        super(Event, self).__init__("event", name)


class Counter(object):
    """A value tracked over time (a counter track in the trace).

    Parameters
    ----------
    domain : Domain
    name : str
    value : int, optional
        The initial value.
    """

    def __init__(self, domain, name, value=None):
        self.name = str(name)
        self._category = str(domain)
        self._value = 0
        self._lock = threading.Lock()
        if value is not None:
            self.set_value(value)

    def _record(self, value):
        _core.profiler_record_counter(self._category, self.name, value)

    def set_value(self, value):
        """Set the counter to ``value``."""
        with self._lock:
            self._value = int(value)
            self._record(self._value)

    def increment(self, delta=1):
        """Add ``delta``."""
        with self._lock:
            self._value += int(delta)
            self._record(self._value)

    def decrement(self, delta=1):
        """Subtract ``delta``."""
        self.increment(-int(delta))

    def __iadd__(self, delta):
        self.increment(delta)
        return self

    def __isub__(self, delta):
        self.decrement(delta)
        return self

    def __str__(self):
        return self.name


class Marker(object):
    """An instant of a domain, marked with ``mark()``.

    Parameters
    ----------
    domain : Domain
    name : str
    """

    def __init__(self, domain, name):
        self.name = str(name)
        self.domain = domain

    def mark(self, scope="process"):
        """Mark now. ``scope`` is 'global', 'process', 'thread', 'task' or 'marker'."""
        _core.profiler_record_marker("%s,instant_marker" % self.domain, self.name, scope)


_current_scope = threading.local()


@contextlib.contextmanager
def scope(name="<unk>:", append_mode=False):
    """Name the operators pushed inside the block (they carry the scope in the trace).

    Parameters
    ----------
    name : str
        The scope; a ':' is appended when missing.
    append_mode : bool
        Append to the enclosing scope instead of replacing it.

    Yields the scope in force.
    """
    name = str(name)
    if not name.endswith(":"):
        name += ":"
    enclosing = getattr(_current_scope, "name", "<unk>:")
    if append_mode and enclosing != "<unk>:":
        name = enclosing + name
    _current_scope.name = name
    previous = _core.profiler_set_scope(name)
    try:
        yield name
    finally:
        _current_scope.name = enclosing
        _core.profiler_set_scope(previous)


def _dump_at_exit():
    try:
        _core.profiler_dump_at_exit()
    except MXNetError as e:
        warnings.warn("the profiler could not write its trace at exit: %s" % e)


atexit.register(_dump_at_exit)
