"""``python -m pita status RUN_DIR`` / ``python -m pita report RUN_DIR``."""

import sys

from pita.cli import console_main

sys.exit(console_main())
