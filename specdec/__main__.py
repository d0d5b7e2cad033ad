"""`python -m specdec ...`: the command line without the installed `specdec` script (e.g. a clone on PYTHONPATH)."""

import sys

from specdec.cli import main

sys.exit(main())
