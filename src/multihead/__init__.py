"""multihead: the Transformer's attention from scratch, for PyTorch and Keras 3.

Front ends live in subpackages so that importing one framework never imports the other:
``multihead.torch``, ``multihead.keras``. ``multihead.reference`` is the NumPy float64 oracle, ``multihead.io`` the
weight format both front ends share. ``multihead.app`` is the command line, built on the library.
"""

from importlib import metadata as _metadata

from multihead.validation import DTypeError

try:
    __version__ = _metadata.version("multihead")
except _metadata.PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"

__all__ = ["DTypeError", "__version__"]
