"""Build and machine features (MXNet's ``mxnet.runtime``): what this oxnet can do here."""

import collections
import platform

Feature = collections.namedtuple("Feature", ["name", "enabled"])
Feature.__repr__ = lambda self: ("✔ " if self.enabled else "✖ ") + self.name

# MXNet 1.9.1's feature names, in its order.
_FEATURE_NAMES = (
    "CUDA", "CUDNN", "NCCL", "CUDA_RTC", "TENSORRT", "CPU_SSE", "CPU_SSE2", "CPU_SSE3", "CPU_SSE4_1",
    "CPU_SSE4_2", "CPU_SSE4A", "CPU_AVX", "CPU_AVX2", "OPENMP", "SSE", "F16C", "JEMALLOC", "BLAS_OPEN",
    "BLAS_ATLAS", "BLAS_MKL", "BLAS_APPLE", "LAPACK", "MKLDNN", "OPENCV", "CAFFE", "PROFILER",
    "DIST_KVSTORE", "CXX14", "INT64_TENSOR_SIZE", "SIGNAL_HANDLER", "DEBUG", "TVM_OP",
)

# /proc/cpuinfo flag behind each CPU feature.
_CPU_FLAGS = {
    "CPU_SSE": "sse", "CPU_SSE2": "sse2", "CPU_SSE3": "pni", "CPU_SSE4_1": "sse4_1",
    "CPU_SSE4_2": "sse4_2", "CPU_SSE4A": "sse4a", "CPU_AVX": "avx", "CPU_AVX2": "avx2",
    "SSE": "sse", "F16C": "f16c",
}


def _cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _detect():
    flags = _cpu_flags() if platform.machine() in ("x86_64", "AMD64") else set()
    enabled = {name: flag in flags for name, flag in _CPU_FLAGS.items()}
    # Shapes and offsets are 64-bit throughout the core. CUDA kernels are not launched yet: CUDA is off.
    enabled["INT64_TENSOR_SIZE"] = True
    enabled["CXX14"] = False
    enabled["SIGNAL_HANDLER"] = False
    return collections.OrderedDict((name, Feature(name, enabled.get(name, False))) for name in _FEATURE_NAMES)


class Features(collections.OrderedDict):
    """The features of this build and machine, by MXNet's names; one instance per process."""

    instance = None

    def __new__(cls):
        if cls.instance is None:
            cls.instance = super().__new__(cls)
            collections.OrderedDict.__init__(cls.instance, _detect())
        return cls.instance

    def __init__(self):  # the singleton is filled once, in __new__
        pass

    def __repr__(self):
        return str(list(self.values()))

    def is_enabled(self, feature_name):
        """Whether the feature is on; an unknown name raises RuntimeError."""
        name = feature_name.upper()
        if name not in self:
            raise RuntimeError("feature '%s' is unknown, known features are: %s"
                               % (feature_name, ", ".join(self)))
        return self[name].enabled


def feature_list():
    """The features as a list of :class:`Feature`."""
    return list(Features().values())
