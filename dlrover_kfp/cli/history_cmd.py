"""``dlrover-kfp record`` and ``dlrover-kfp history {list,show,import,export}``.

Thin over :mod:`dlrover_kfp.history`: parse arguments, resolve the history URL from
``--history`` and the environment (read here, at the edge, and nowhere else), call the library,
print JSON or a table on stdout. Errors are raised as the package's error types and turned into
one line and an exit code by :mod:`dlrover_kfp.cli.main`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Sequence
from contextlib import closing
from typing import Any

from dlrover_kfp.cli.common import positive_int
from dlrover_kfp.core.documents import to_json
from dlrover_kfp.core.plan import NodeGroup
from dlrover_kfp.core.profile import JobProfile
from dlrover_kfp.core.summary import JobSummary, format_timestamp
from dlrover_kfp.files import read_document
from dlrover_kfp.history import ENV_VAR, open_history, resolve_history_url
from dlrover_kfp.history.jsonl import export_jsonl, import_jsonl
from dlrover_kfp.history.pending import record_pending
from dlrover_kfp.history.sql import SqlHistoryStore
from dlrover_kfp.history.validation import checked_summary

log = logging.getLogger(__name__)

_HISTORY_HELP = (
    f"history store: a SQLAlchemy URL or a SQLite file path (default: ${ENV_VAR}, "
    "else history.db in the user data directory)"
)
_WHERE = f"""
Where the history lives: --history, else ${ENV_VAR}, else history.db in the user's data
directory. A plain path means a SQLite file, created in an existing directory (a directory
that does not exist is refused as a typo; the default's is created); PostgreSQL is e.g.
postgresql://user:password@host:5432/db (the password is never printed)."""


def register(sub: Any) -> None:
    """Add the ``record`` and ``history`` commands to the top-level subparsers."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--history", metavar="URL", default=None, help=_HISTORY_HELP)

    record = sub.add_parser(
        "record",
        parents=[common],
        help="store a finished job's profile in the history",
        description=(
            "Validate a job profile (JSON or YAML) and store it in the history, where warm\n"
            "start finds it. Recording is idempotent on run_id: a second record of the same\n"
            'run changes nothing and prints "new": false.\n' + _WHERE
        ),
        epilog=(
            "Examples:\n"
            "  dlrover-kfp record --profile out/profile.json\n"
            '  {"run_id": "ctr-daily-20261121", "new": true}\n'
            "  dlrover-kfp record --pending   # profiles kept while the history was unavailable\n"
            '  {"recorded": [{"run_id": "ctr-daily-20261120", "new": true}]}'
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what = record.add_mutually_exclusive_group(required=True)
    what.add_argument("--profile", metavar="FILE", help="the job profile")
    what.add_argument(
        "--pending",
        action="store_true",
        help="record the profiles that runs kept on disk because this history was locked or "
        "unreachable when they ended ($DLROVER_KFP_PENDING_DIR, default: pending/ in the "
        "user's data directory)",
    )
    record.set_defaults(func=_record)

    history = sub.add_parser(
        "history",
        help="list, show, import or export the recorded job profiles",
        description="Inspect and move the history of finished jobs.\n" + _WHERE,
        epilog=(
            "Examples:\n"
            "  dlrover-kfp history list --scenario ads-ctr\n"
            "  dlrover-kfp history show ctr-daily-20261121\n"
            "  dlrover-kfp history export backup.jsonl\n"
            "  dlrover-kfp history import backup.jsonl --history postgresql://u:p@db/history"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = history.add_subparsers(dest="history_action", metavar="ACTION")
    actions.required = True

    listing = actions.add_parser(
        "list",
        parents=[common],
        help="the recorded jobs, newest first",
        description=(
            "Print the recorded jobs, newest first, as a table (or a JSON array with --json):\n"
            "what each ran with at the end and its outcome."
        ),
        epilog="Example:\n  dlrover-kfp history list --scenario ads-ctr --limit 10 --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    listing.add_argument("--scenario", default=None, help="only jobs of this scenario")
    listing.add_argument("--limit", type=positive_int, default=50, help="at most N jobs (50)")
    listing.add_argument("--json", action="store_true", help="print a JSON array instead")
    listing.set_defaults(func=_list)

    show = actions.add_parser(
        "show",
        parents=[common],
        help="print one recorded profile as JSON",
        description="Print the full profile of one recorded run as JSON.",
        epilog="Example:\n  dlrover-kfp history show ctr-daily-20261121 > profile.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    show.add_argument("run_id", metavar="RUN_ID")
    show.set_defaults(func=_show)

    imp = actions.add_parser(
        "import",
        parents=[common],
        help="store the profiles of a JSONL file",
        description=(
            "Store every profile of a JSON Lines file (one profile per line). Every line is\n"
            "validated first: one bad line stores nothing. Runs already stored are skipped.\n"
            'Prints {"file": ..., "new": N, "skipped": M}.'
        ),
        epilog="Example:\n  dlrover-kfp history import backup.jsonl",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    imp.add_argument("file", metavar="FILE.jsonl")
    imp.set_defaults(func=_import)

    exp = actions.add_parser(
        "export",
        parents=[common],
        help="write every profile to a JSONL file, oldest first",
        description=(
            "Write every recorded profile to a JSON Lines file, oldest first. The file is\n"
            'replaced atomically. Prints {"file": ..., "profiles": N}.'
        ),
        epilog="Example:\n  dlrover-kfp history export backup.jsonl",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    exp.add_argument("file", metavar="FILE.jsonl")
    exp.set_defaults(func=_export)


def _open(args: argparse.Namespace) -> SqlHistoryStore:
    url = resolve_history_url(args.history, os.environ)
    store = open_history(url)
    log.debug("history: %s", store.where)
    return store


def _print_json(obj: object) -> None:
    print(json.dumps(obj))


def _record(args: argparse.Namespace) -> int:
    if args.pending:
        url = resolve_history_url(args.history, os.environ)
        done = record_pending(url)
        _print_json({"recorded": [{"run_id": r, "new": new} for r, new in done]})
        return 0
    profile = read_document(JobProfile, args.profile)
    checked_summary(profile, str(args.profile))
    with closing(_open(args)) as store:
        new = store.record(profile)
    _print_json({"run_id": profile.run_id, "new": new})
    return 0


def _list(args: argparse.Namespace) -> int:
    with closing(_open(args)) as store:
        summaries = store.list(scenario=args.scenario, limit=args.limit)
        where = store.where
    if args.json:
        print(json.dumps([summary_to_json(s) for s in summaries], indent=2))
        return 0
    print(format_table(summaries))
    if not summaries:
        print(f"no jobs recorded in {where}", file=sys.stderr)
    return 0


def _show(args: argparse.Namespace) -> int:
    with closing(_open(args)) as store:
        profile = store.get(args.run_id)
    print(to_json(profile))
    return 0


def _import(args: argparse.Namespace) -> int:
    with closing(_open(args)) as store:
        new, skipped = import_jsonl(store, args.file)
    log.info("imported %d new profiles from %s (%d already stored)", new, args.file, skipped)
    _print_json({"file": str(args.file), "new": new, "skipped": skipped})
    return 0


def _export(args: argparse.Namespace) -> int:
    with closing(_open(args)) as store:
        count = export_jsonl(store, args.file)
    _print_json({"file": str(args.file), "profiles": count})
    return 0


def summary_to_json(summary: JobSummary) -> dict[str, Any]:
    """A summary as JSON data: node groups as objects, ``started_at`` as ISO 8601 UTC."""
    data: dict[str, Any] = {}
    for field in dataclasses.fields(summary):
        value = getattr(summary, field.name)
        if isinstance(value, NodeGroup):
            data[field.name] = {
                "count": value.count,
                "cpu": value.cpu,
                "memory_mb": value.memory_mb,
            }
        elif field.name == "observations":
            data[field.name] = [dataclasses.asdict(o) for o in value]
        elif field.name == "started_at":
            data[field.name] = format_timestamp(value)
        else:
            data[field.name] = value
    return data


_COLUMNS = ("RUN_ID", "STARTED", "SCENARIO", "STATUS", "JCT_S", "WORKERS", "PS", "PEAK_PS_CPU")


def format_table(summaries: Sequence[JobSummary]) -> str:
    """A plain, aligned table: one job per line, readable in a terminal and by ``awk``."""
    rows = [_COLUMNS] + [
        (
            s.run_id,
            format_timestamp(s.started_at),
            s.scenario or "-",
            s.status,
            f"{s.jct_seconds:.0f}",
            s.workers.text(),
            s.ps.text(),
            f"{s.peak_ps_cpu:g}",
        )
        for s in summaries
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )

