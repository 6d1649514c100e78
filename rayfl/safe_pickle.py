"""Read the pickled data formats users bring (CIFAR batches, FedScale traces) without running code.

``pickle.load`` calls whatever callable a file names, so a downloaded or shared pickle could run
any code. :func:`load` resolves only the globals that plain data and numpy arrays need; any
other global is refused with :class:`pickle.UnpicklingError` before it is imported or called.
"""

from __future__ import annotations

import pickle
from typing import BinaryIO

ALLOWED = frozenset({
    # numpy arrays, dtypes and scalars (module path before and after numpy 2)
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "ndarray"), ("numpy", "dtype"),
    # bytes pickled by Python 3 with protocol < 3, and plain containers
    ("_codecs", "encode"), ("collections", "OrderedDict"),
    ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "bytearray"),
    ("builtins", "complex"),
})
PY2_MODULES = {"__builtin__": "builtins"}  # Python 2 pickles name builtins by their old module


class _DataUnpickler(pickle.Unpickler):
    """An Unpickler whose ``find_class`` knows only :data:`ALLOWED`."""

    def find_class(self, module: str, name: str):
        module = PY2_MODULES.get(module, module)
        if (module, name) not in ALLOWED:
            raise pickle.UnpicklingError(f"refused to load {module}.{name}: only plain data and "
                                         f"numpy arrays are read from a pickle")
        return super().find_class(module, name)


def load(f: BinaryIO, encoding: str = "ASCII"):
    """The object pickled in ``f`` if it is plain data and numpy arrays; otherwise
    :class:`pickle.UnpicklingError` (never a call to a global outside :data:`ALLOWED`)."""
    return _DataUnpickler(f, encoding=encoding).load()
