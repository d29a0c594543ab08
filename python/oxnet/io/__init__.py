"""Data iterators (MXNet's ``mxnet.io``)."""

from . import io
from .io import DataDesc, DataBatch, DataIter, ResizeIter, PrefetchingIter, NDArrayIter, CSVIter
from . import image_record_iter
from .image_record_iter import ImageRecordIter, ImageRecordUInt8Iter, ImageRecordInt8Iter
from . import utils
from .utils import _init_data, _getdata_by_idx, _has_instance
