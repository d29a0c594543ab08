"""Automatic mixed precision (MXNet's ``mxnet.contrib.amp.amp``).

oxnet does not rewrite graphs or trainers for float16/bfloat16 yet: the names exist so that
programs importing them load, and calling any of them raises an MXNetError saying so. Cast
models explicitly (``Block.cast``, ``astype``) instead.
"""

from ...base import MXNetError

__all__ = ["init", "init_trainer", "scale_loss", "unscale", "convert_model", "convert_symbol",
           "convert_hybrid_block", "convert_bucketing_module", "list_lp16_ops", "list_fp32_ops",
           "list_lp16_fp32_ops", "list_conditional_fp32_ops", "list_widest_type_cast",
           "list_loss_output_functions", "list_lp16_use_fp32_params"]


def _unsupported(name):
    def function(*_args, **_kwargs):
        raise MXNetError("amp.%s: automatic mixed precision (mx.contrib.amp) is not supported by oxnet yet; "
                         "cast the model explicitly (Block.cast / astype) instead" % name)
    function.__name__ = name
    return function


for _name in __all__:
    globals()[_name] = _unsupported(_name)
