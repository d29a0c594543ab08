"""Modules (MXNet's ``mxnet.module``, also ``mx.mod``): symbolic models with their
parameters, optimizer and training loop."""

from .base_module import BaseModule
from .module import Module
from .bucketing_module import BucketingModule
from .executor_group import DataParallelExecutorGroup
