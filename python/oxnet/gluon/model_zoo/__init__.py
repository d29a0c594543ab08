"""Predefined models (MXNet's ``mxnet.gluon.model_zoo``). oxnet downloads nothing: load weights that
MXNet's model zoo saved with ``load_parameters``."""

from . import vision
