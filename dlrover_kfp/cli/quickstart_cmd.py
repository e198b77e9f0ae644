"""``dlrover-kfp quickstart``: the main job on embedded defaults, several retraining rounds."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from dlrover_kfp.cli.common import HELP_FORMAT
from dlrover_kfp.history import open_history, resolve_history_url
from dlrover_kfp.ports import SystemClock
from dlrover_kfp.quickstart import format_table, run_quickstart


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "quickstart",
        help="run a daily retraining job for several rounds, showing warm start",
        description="Plan, run and record a daily CTR job several times on embedded defaults "
        "(SQLite history, local, synthetic data). The first round starts from the user's own "
        "over-provisioned guess; later rounds warm-start from the history. Until the trainer "
        "lands, rounds run in simulated time against a synthetic workload.",
        epilog="Example:\n  dlrover-kfp quickstart --rounds 4 --output-dir ./quickstart",
        formatter_class=HELP_FORMAT,
    )
    parser.add_argument("--rounds", type=int, default=4, help="retraining rounds (default 4)")
    parser.add_argument(
        "--output-dir",
        default="dlrover-kfp-quickstart",
        help="where the quickstart's history lives (default ./dlrover-kfp-quickstart)",
    )
    parser.add_argument(
        "--history", metavar="URL", help="history store URL (default: OUTPUT_DIR/history.db)"
    )
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.rounds < 1:
        print("dlrover-kfp: error: --rounds: must be at least 1", file=sys.stderr)
        return 2
    url = args.history or str(Path(args.output_dir) / "history.db")
    store = open_history(resolve_history_url(url, {}))
    try:
        results = run_quickstart(
            store, SystemClock(), args.rounds, lambda line: print(line, file=sys.stderr)
        )
    finally:
        store.close()
    print(format_table(results))
    return 0
