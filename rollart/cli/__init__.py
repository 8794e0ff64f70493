"""rollart.cli — the `rollart` command line: `main` (in `main.py`) over one module per subcommand (`commands/`).

`python -m rollart.cli ARGS` is the same as `rollart ARGS`.
"""

from rollart.cli.main import main

__all__ = ["main"]
