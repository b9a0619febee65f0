"""Warnings and notes of the subcommands: one line each on stderr, none under ``-q`` (whose
help promises nothing but errors; errors are printed by :func:`onnx_cinm.cli._dispatch`)."""
from __future__ import annotations

import sys


def warn(args, text: str, kind: str = "warning") -> None:
    """Print ``onnx-cinm: KIND: TEXT`` on stderr unless ``args.quiet`` (a subcommand without
    ``-q`` always prints)."""
    if not getattr(args, "quiet", False):
        print(f"onnx-cinm: {kind}: {text}", file=sys.stderr)


def note(args, text: str) -> None:
    """:func:`warn` as a note: something the user may want to know, nothing wrong."""
    warn(args, text, "note")
