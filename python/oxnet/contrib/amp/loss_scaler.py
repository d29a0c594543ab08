"""Dynamic loss scaling for AMP (MXNet's ``mxnet.contrib.amp.loss_scaler``)."""

import logging

from ... import autograd
from ... import ndarray as nd


class LossScaler:
    """The factor AMP multiplies the loss by, so that small float16 gradients do not flush to
    zero. It starts at 2**16; a step whose gradients overflow (hold an inf or NaN) is skipped and
    halves the factor, 2000 steps in a row without overflow double it (up to 2**24). As in MXNet,
    a new factor becomes ``loss_scale`` when the next step's gradients are checked."""

    # Gradients checked per multi_all_finite call.
    _CHUNK = 200

    def __init__(self):
        self._loss_scale = 2.0 ** 16
        self._next_loss_scale = self._loss_scale
        self._max_loss_scale = 2.0 ** 24
        self._scale_seq_len = 2000
        self._unskipped = 0

    @property
    def loss_scale(self):
        """The current loss scale."""
        return self._loss_scale

    def has_overflow(self, params):
        """Whether the gradients of ``params`` (their first context's) hold an inf or NaN; moves
        the loss scale on as described in the class documentation."""
        grads = [p._grad[0] for p in params if p._grad is not None]
        with autograd.pause():
            verdict = nd.ones((1,), ctx=grads[0].context)
            for start in range(0, len(grads), self._CHUNK):
                chunk = grads[start:start + self._CHUNK]
                nd.multi_all_finite(*chunk, num_arrays=len(chunk), init_output=False, out=verdict)
        overflow = not bool(verdict.asscalar())
        self._loss_scale = self._next_loss_scale
        if overflow:
            self._next_loss_scale = self._loss_scale / 2.0
            self._unskipped = 0
            logging.info("AMP: decreasing loss scale to %f", self._next_loss_scale)
        else:
            self._unskipped += 1
        if self._unskipped == self._scale_seq_len:
            self._unskipped = 0
            self._next_loss_scale = min(self._max_loss_scale, self._loss_scale * 2.0)
            logging.info("AMP: increasing loss scale to %f", self._next_loss_scale)
        return overflow
