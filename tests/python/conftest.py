import os
import pathlib

import pytest

import oxnet as mx

REPO = pathlib.Path(__file__).resolve().parents[2]
# Files written by MXNet 1.9.1 (copied from ../shared/fixtures so that every clone tests against them).
FIXTURES = REPO / "tests" / "fixtures" / "mxnet-1.9.1"


def _contexts():
    ctxs = [pytest.param(mx.cpu(0), id="cpu")]
    reason = "no GPU" if mx.context.num_gpus() == 0 else None
    ctxs.append(pytest.param(mx.gpu(0), id="gpu", marks=pytest.mark.skipif(reason is not None, reason=reason or "")))
    return ctxs


@pytest.fixture(params=_contexts())
def ctx(request):
    """Every test that takes `ctx` runs once per device; GPU runs skip with 'no GPU' without one."""
    return request.param


@pytest.fixture
def fixtures_dir():
    if not FIXTURES.is_dir():
        pytest.skip("MXNet 1.9.1 fixtures not found at %s" % FIXTURES)
    return FIXTURES
