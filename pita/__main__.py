"""``python -m pita status RUN_DIR``."""

import sys

from pita.cli import console_main

sys.exit(console_main())
