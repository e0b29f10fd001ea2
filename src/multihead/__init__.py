"""multihead: the Transformer's attention from scratch, for PyTorch and Keras 3.

Front ends live in subpackages so that importing one framework never imports the other:
``multihead.torch``, ``multihead.keras``. ``multihead.reference`` is the NumPy float64 oracle.
"""

from importlib.metadata import PackageNotFoundError, version

from multihead.validation import DTypeError

try:
    __version__ = version("multihead")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"

__all__ = ["DTypeError", "__version__"]
