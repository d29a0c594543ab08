"""AMP's operator lists, one module per target dtype."""

from . import symbol_fp16
from . import symbol_bf16
