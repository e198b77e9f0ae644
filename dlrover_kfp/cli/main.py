"""Entry point of ``dlrover-kfp``.

Conventions every command keeps: a command that prints JSON prints only the JSON on stdout, and
logs and progress go to stderr; a user error (bad file, bad key, bad value) prints one line that
names it and exits 2, never a traceback; a transient failure (a locked or unreachable history)
exits 75 (EX_TEMPFAIL) so that schedulers know a retry may help.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from dlrover_kfp import __version__
from dlrover_kfp.cli import (
    cleanup_cmd,
    compile_cmd,
    evaluate_cmd,
    history_cmd,
    model_cmd,
    plan_cmd,
    quickstart_cmd,
    report_cmd,
    run_cmd,
    schema_cmd,
    score_cmd,
    simulate_cmd,
)
from dlrover_kfp.errors import EXIT_TRANSIENT, EXIT_USER_ERROR, PermanentError, TransientError
from dlrover_kfp.runtime import signals

_COMMANDS = (
    quickstart_cmd,
    plan_cmd,
    run_cmd,
    score_cmd,
    evaluate_cmd,
    cleanup_cmd,
    model_cmd,
    history_cmd,
    schema_cmd,
    simulate_cmd,
    report_cmd,
    compile_cmd,
)


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line too (and still exit 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USER_ERROR, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="dlrover-kfp",
        description="Plan, run and record elastic parameter-server DLRM training jobs.",
        epilog="Example: dlrover-kfp plan --job examples/ctr-daily.yaml",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logs on stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for module in _COMMANDS:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        code: int = args.func(args)
    except PermanentError as exc:
        print(f"dlrover-kfp: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except TransientError as exc:
        print(f"dlrover-kfp: temporary failure, retry later: {exc}", file=sys.stderr)
        return EXIT_TRANSIENT
    except KeyboardInterrupt as exc:
        # The run released its pods, cgroups and shared memory on the way here.
        print("dlrover-kfp: interrupted", file=sys.stderr)
        return signals.exit_code(exc)
    return code


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
