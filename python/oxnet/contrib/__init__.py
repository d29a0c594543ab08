"""Contributed features (MXNet's ``mxnet.contrib``)."""
