"""Subcommands of the `leanloader` CLI, one module each (see leanloader.cli)."""
