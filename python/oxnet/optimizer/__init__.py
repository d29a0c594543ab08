"""Optimizers (MXNet's ``mxnet.optimizer``)."""

from .optimizer import (Optimizer, SGD, NAG, Adam, AdamW, RMSProp, AdaGrad, AdaDelta, Ftrl, Signum, LAMB,
                        Updater, create, get_updater, register)
