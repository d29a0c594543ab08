"""oxnet: Apache MXNet 1.x rebuilt with a Rust core. Use it as ``import oxnet as mx``."""

__version__ = "0.1.0"

from . import base
from .base import MXNetError
from . import context
from .context import Context, cpu, gpu, cpu_pinned, current_context, num_gpus
from . import ndarray
from . import ndarray as nd
from . import random
from . import autograd
from . import name
from . import attribute
from .attribute import AttrScope
from . import symbol
from . import symbol as sym
from .symbol import executor
from . import visualization
from . import initializer
from . import initializer as init
from . import optimizer
from . import lr_scheduler
from . import metric
from . import io
from . import recordio
from . import kvstore
from . import kvstore as kv
from . import model
from . import callback
from . import module
from . import module as mod
from . import monitor
from . import monitor as mon
from . import image
from . import gluon
from . import rnn
from . import visualization as viz
from . import test_utils
from . import util
from .util import (is_np_shape, set_np_shape, np_shape, use_np_shape, is_np_array, np_array,
                   use_np_array, use_np, set_np, reset_np)
from . import engine
from . import profiler
from . import runtime
from . import operator
from . import onnx
from . import contrib
