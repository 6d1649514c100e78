"""``python -m rayfl``."""

import sys

from rayfl.cli import main

sys.exit(main())
