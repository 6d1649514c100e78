"""Heavy third-party modules loaded at their first use, not when rayfl is imported.

Every Ray actor a run starts imports rayfl. A client actor never plots nor accounts for privacy,
yet matplotlib, SciPy and dp-accounting took 1.3 s of its 3 s of imports (``python -X
importtime -c "import rayfl.runtime.client_actor"``), paid again by every actor of every run.
``figure = deferred("matplotlib.figure")`` at module level reads as the import it stands for and
loads the module when one of its names is first read. It is for other packages' modules that a
process may never use (plotting, accounting, image decoding, a progress bar, torchvision's
model zoo); rayfl's own modules import at the top, so that ``tools/import_knots.py`` sees every
tie between them.
"""

from __future__ import annotations

import importlib
import types


class _Deferred(types.ModuleType):
    """A module's stand-in: reading a name imports the module (once; then a dictionary look-up)
    and gives that name of it."""

    def __getattr__(self, name: str):
        return getattr(importlib.import_module(self.__name__), name)

    def __reduce__(self):  # a user's function that reads one pickles (Ray sends it to workers)
        return deferred, (self.__name__,)


def deferred(module: str) -> types.ModuleType:
    """The module named ``module`` (dotted), imported when a name of it is first read."""
    return _Deferred(module)
