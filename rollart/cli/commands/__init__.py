"""Subcommands of the `rollart` CLI, one module each (see `rollart/cli/main.py`)."""
