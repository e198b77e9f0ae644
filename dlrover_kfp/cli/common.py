"""Helpers the commands share: the history option, JSON output, help formatting."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

from dlrover_kfp.files import write_atomic
from dlrover_kfp.history import resolve_history_url

HELP_FORMAT = argparse.RawDescriptionHelpFormatter


def add_history_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--history",
        metavar="URL",
        help="history store: an SQLAlchemy URL or a SQLite file path "
        "(default: $DLROVER_KFP_HISTORY_URL, else a SQLite file in the user data directory)",
    )


def emit_json(data: Any, output: str | None = None) -> None:
    """Write JSON to ``output`` atomically, or print it (and only it) on stdout."""
    text = json.dumps(data, indent=2) + "\n"
    if output:
        write_atomic(output, text)
        print(f"wrote {output}", file=sys.stderr)
    else:
        sys.stdout.write(text)


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (a usage error otherwise)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite number above 0 (a usage error otherwise)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a number above 0, got {text}")
    return value


def history_url(args: argparse.Namespace) -> str:
    return resolve_history_url(getattr(args, "history", None), os.environ)
