"""``python -m pita run key=value ...`` / ``python -m pita status RUN_DIR`` / ``python -m pita report RUN_DIR``."""

import sys

from pita.entry import main

if __name__ == "__main__":
    sys.exit(main())
