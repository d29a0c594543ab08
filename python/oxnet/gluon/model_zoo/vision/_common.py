"""Pieces every vision model shares."""

import os

from ...block import HybridBlock

DEFAULT_ROOT = os.path.join("~", ".mxnet", "models")


class FeaturesThenOutput(HybridBlock):
    """A network made of a ``features`` extractor followed by an ``output`` classifier head."""

    def hybrid_forward(self, F, x):
        return self.output(self.features(x))


def reject_pretrained(pretrained, weights_name, root):
    """oxnet ships no weights, so ``pretrained=True`` fails, saying how to load MXNet's instead."""
    if pretrained:
        raise ValueError(
            "pretrained weights are not shipped with oxnet and nothing is downloaded. Build the model with "
            "pretrained=False and load a .params file saved by MXNet's model zoo (MXNet keeps them in %s as "
            "%s-<hash>.params): net.load_parameters(path, ctx=ctx)"
            % (os.path.expanduser(root), weights_name))
