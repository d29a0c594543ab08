"""Datasets, samplers and the DataLoader (MXNet's ``mxnet.gluon.data``)."""

from .dataset import Dataset, SimpleDataset, ArrayDataset, RecordFileDataset
from .sampler import Sampler, SequentialSampler, RandomSampler, BatchSampler, FilterSampler, SplitSampler
from .dataloader import DataLoader, default_batchify_fn
from . import vision
