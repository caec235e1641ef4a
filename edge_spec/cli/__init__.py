"""The command line: one module per subcommand (parse, call the library, print) and the
arguments they share (args.py). `edge-spec` runs main()."""

from __future__ import annotations

from edge_spec.cli.main import main

__all__ = ["main"]
