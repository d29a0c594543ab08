"""Finding the CUDA libraries that pip's ``nvidia-*`` wheels install.

The Rust core loads libnvrtc, libcublas and libcudnn with ``dlopen`` by name when GPU work first
needs them; pip puts them under ``site-packages/nvidia/*/lib``, which the loader does not search.
Loading them here first, by path and with ``RTLD_GLOBAL``, makes the core's later lookup by name
find the copy already in the process. Nothing is loaded until a GPU is asked about, so CPU-only
programs pay nothing.
"""

import ctypes
import glob
import importlib.util
import os

# Dependencies before the libraries that need them (cublas needs cublasLt).
_WANTED = ("libnvrtc.so.*", "libcublasLt.so.*", "libcublas.so.*", "libcudnn.so.*")

_loaded = None


def library_dirs():
    """The ``lib`` folders of the installed ``nvidia-*`` wheels."""
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return []
    dirs = []
    for root in spec.submodule_search_locations:
        dirs.extend(sorted(d for d in glob.glob(os.path.join(root, "*", "lib")) if os.path.isdir(d)))
    return dirs


def preload():
    """Load the pip-installed CUDA libraries once; returns the paths loaded."""
    global _loaded
    if _loaded is None:
        _loaded = []
        for pattern in _WANTED:
            for folder in library_dirs():
                # Plain versioned names only (libnvrtc.so.13, not libnvrtc-builtins.so.13.5,
                # which libnvrtc loads itself from its own folder).
                for path in sorted(glob.glob(os.path.join(folder, pattern))):
                    try:
                        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                    except OSError:
                        continue
                    _loaded.append(path)
    return list(_loaded)
