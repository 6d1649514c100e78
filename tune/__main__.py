"""``python -m tune STUDY.yaml``."""

import sys

from tune.cli import main

sys.exit(main())
