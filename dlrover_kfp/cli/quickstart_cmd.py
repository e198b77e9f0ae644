"""``dlrover-kfp quickstart``: a small real job retrained over several rounds on this machine."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from dlrover_kfp.cli.common import HELP_FORMAT
from dlrover_kfp.cli.progress import TerminalProgress
from dlrover_kfp.errors import UserInputError
from dlrover_kfp.history import resolve_history_url
from dlrover_kfp.quickstart import (
    DEFAULT_ROWS,
    RoundResult,
    format_round,
    format_table,
    run_quickstart,
)
from dlrover_kfp.runtime.launch import unwind_on_sigterm


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "quickstart",
        help="train a small CTR job for several retraining rounds, showing Stage 1 and Stage 2",
        description="Train a small DLRM CTR job (the ctr-local model, "
        f"{DEFAULT_ROWS:,} synthetic rows) several times on this machine, each round an "
        "elastic `dlrover-kfp run` on the local backend: PS and workers are local processes, "
        "each held to its CPU where the machine allows cgroups. The job's own resources are "
        "an under-provisioned guess (1 worker x 0.25 CPU + 1 PS x 0.25 CPU, quota 2 CPU): "
        "with no similar job in the history, round 1 starts from it (cold start) and Stage 2 "
        "grows it while it trains; every round's profile goes to the history, and later rounds "
        "warm-start from it. Each round writes OUTPUT_DIR/round-N/ (profile.json, model/, "
        "logs/; an earlier quickstart's files there are replaced); the history is kept "
        "across invocations, so a second quickstart into the same directory warm-starts "
        "round 1 too. Prints each round's plans, resizes, JCT, samples/s, CPU utilisation and "
        "held-out AUC, then a table of the rounds, on stdout; progress goes to stderr. Three "
        "rounds take 2-3 minutes on two cores.",
        epilog="Example:\n  dlrover-kfp quickstart --rounds 3 --output-dir ./quickstart",
        formatter_class=HELP_FORMAT,
    )
    parser.add_argument("--rounds", type=int, default=3, help="retraining rounds (default 3)")
    parser.add_argument(
        "--output-dir",
        default="dlrover-kfp-quickstart",
        help="where the rounds' runs and the history go (default ./dlrover-kfp-quickstart)",
    )
    parser.add_argument(
        "--history", metavar="URL", help="history store URL (default: OUTPUT_DIR/history.db)"
    )
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.rounds < 1:
        print("dlrover-kfp: error: --rounds: must be at least 1", file=sys.stderr)
        return 2
    output = Path(args.output_dir)
    if not args.history:
        # The default history goes in the output directory, which must exist first: a
        # history path whose directory does not exist is refused (a typo, not a new history).
        try:
            output.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserInputError(f"--output-dir {output}: cannot create it: {exc}") from None
    url = resolve_history_url(args.history or str(output / "history.db"), {})

    def report(result: RoundResult) -> None:
        print(format_round(result, args.rounds) + "\n", flush=True)

    unwind_on_sigterm()
    with TerminalProgress("this round's samples") as progress:
        results = run_quickstart(output, url, args.rounds, progress, on_round=report)
    print(format_table(results), flush=True)
    return 0 if all(r.succeeded for r in results) else 1
