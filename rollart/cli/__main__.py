"""`python -m rollart.cli ARGS`: the `rollart` command without its console script."""

import sys

from rollart.cli.main import main

sys.exit(main())
