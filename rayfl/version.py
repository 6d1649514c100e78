"""rayfl's version and where its package lives: what provenance records, what a download says
it is, and what Ray need not ship to workers."""

from __future__ import annotations

import os

__version__ = "0.2.0"
#: the directory of the ``rayfl`` package
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
