"""Check this machine: GPU detection, one worker per GPU seeing only its own device, memory.

    python test_parallel_setup.py [--devices auto|cpu|0,1] [--keep]
"""

import sys

from pita.setup_check import main

if __name__ == "__main__":
    sys.exit(main())
