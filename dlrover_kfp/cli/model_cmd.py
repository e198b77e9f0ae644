"""``dlrover-kfp model {fit,predict}``: fit the resource-performance model, ask it for throughput.

Thin over :mod:`dlrover_kfp.core.perf_model`: this module reads and writes the files and turns
arguments into values; the maths lives in the core. Only JSON goes to stdout so that a pipeline
step can parse it; logs go to stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Callable
from typing import Any

from dlrover_kfp.core.model_io import (
    CSV_COLUMNS,
    model_from_dict,
    model_to_dict,
    observations_from_csv,
)
from dlrover_kfp.core.observation import Config
from dlrover_kfp.core.perf_model import (
    PerfModel,
    fit,
)
from dlrover_kfp.core.quantity import parse_cpu
from dlrover_kfp.errors import UserInputError
from dlrover_kfp.files import read_text, write_atomic

log = logging.getLogger(__name__)

_MODEL_DESCRIPTION = """\
Fit and query the resource-performance model of an asynchronous parameter-server job:

    per-worker iteration time  T = θ0 + θ1·B/λw + θ2·(w/p)^γ·B/λp + θ3·(w/p) + θ4·p
    throughput                 X = w·B / T   (samples/s)

w workers and p PS with λw and λp cores each, B the per-worker batch size; γ >= 1 is the PS
contention exponent (1: the original, linear form). See docs/model.md."""

_FIT_DESCRIPTION = f"""\
Fit the model to measured throughputs (non-negative least squares on relative errors) and write
it to --output atomically. Coefficients the samples cannot identify (all samples at one PS
count, say) are pinned to the built-in prior; with fewer than 3 distinct configurations only a
scale factor on the prior is fitted. γ is searched in [1, 2] when the samples can identify it
(at least 6 distinct configurations, two or more ratios w/p, one configuration to spare) and is
1 otherwise; it moves from 1 only if that lowers the relative RMSE by more than 5%. With at
least 6 distinct configurations the overlap form, T = θ0 + max(worker, PS) + θ4·p (a worker that
computes while its PS serve the next lookups), is fitted too and kept if it lowers the relative
RMSE by more than 20%, each branch binding at 2 configurations or more; "overlap" in the output
says which form was kept. Prints the coefficients, γ, the form and the fit diagnostics as JSON.

The samples file is CSV with exactly these header columns (any order):
    {",".join(CSV_COLUMNS)}
CPU cells accept Kubernetes notation (4, 0.5, 500m); throughput is samples/s of the whole job."""

_FIT_EPILOG = """\
Example:
    $ cat samples.csv
    workers,ps,worker_cpu,ps_cpu,batch_size,throughput
    2,1,4,2,512,104800
    4,2,4,2,512,207400
    8,2,8,4,512,403600
    8,4,8,4,512,631500
    16,4,8,2,512,568800
    $ dlrover-kfp model fit --samples samples.csv --output model.json"""

_PREDICT_DESCRIPTION = """\
Predict the throughput (samples/s) of one configuration with a fitted model.
Prints exactly {"throughput": X}."""

_PREDICT_EPILOG = """\
Example:
    $ dlrover-kfp model predict --model model.json --workers 12 --ps 3 \\
          --worker-cpu 8 --ps-cpu 4000m --batch-size 512
    {"throughput": 602431.9636167515}"""


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "model",
        help="fit the resource-performance model or predict throughput with it",
        description=_MODEL_DESCRIPTION,
        epilog="Example: dlrover-kfp model fit --samples samples.csv --output model.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="model_command", metavar="SUBCOMMAND")
    actions.required = True

    fit_parser = actions.add_parser(
        "fit",
        help="fit the model to measured samples",
        description=_FIT_DESCRIPTION,
        epilog=_FIT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    fit_parser.add_argument("--samples", required=True, metavar="CSV", help="measured samples")
    fit_parser.add_argument("--output", required=True, metavar="JSON", help="model file to write")
    fit_parser.set_defaults(func=_run_fit)

    predict = actions.add_parser(
        "predict",
        help="predict the throughput of one configuration",
        description=_PREDICT_DESCRIPTION,
        epilog=_PREDICT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    predict.add_argument("--model", required=True, metavar="JSON", help="fitted model file")
    predict.add_argument(
        "--workers", required=True, type=_positive_int("workers"), metavar="N", help="workers"
    )
    predict.add_argument(
        "--ps", required=True, type=_positive_int("PS"), metavar="N", help="parameter servers"
    )
    predict.add_argument(
        "--worker-cpu", required=True, type=_cpu, metavar="CPU", help="cores per worker (4, 500m)"
    )
    predict.add_argument(
        "--ps-cpu", required=True, type=_cpu, metavar="CPU", help="cores per PS (4, 500m)"
    )
    predict.add_argument(
        "--batch-size",
        required=True,
        type=_positive_int("batch size"),
        metavar="B",
        help="per-worker batch size",
    )
    predict.set_defaults(func=_run_predict)


def _positive_int(what: str) -> Callable[[str], int]:
    """An argparse type: a whole number >= 1, with a message that says which option."""

    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{what} must be a whole number, got {text!r}"
            ) from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{what} must be >= 1, got {text!r}")
        return value

    return convert


def _cpu(text: str) -> float:
    """An argparse type for Kubernetes CPU quantities; keeps parse_cpu's message."""
    try:
        return parse_cpu(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def load_model(path: str) -> PerfModel:
    """Read a model file written by ``model fit``; errors name the file and the key.

    Any content is a model or a :class:`UserInputError` naming the file: besides malformed
    JSON, an integer of more digits than ``int()`` takes (4300; ``json`` raises a plain
    ``ValueError``) and nesting deeper than the interpreter's recursion limit.
    """
    text = read_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserInputError(f"{path}:{exc.lineno}: not JSON: {exc.msg}") from None
    except ValueError as exc:
        problem = str(exc).split(";", 1)[0]  # drop the hint about sys.set_int_max_str_digits
        raise UserInputError(f"{path}: not JSON: unreadable value: {problem}") from None
    except RecursionError:
        raise UserInputError(f"{path}: not JSON: nested too deeply") from None
    try:
        return model_from_dict(data, path)
    except RecursionError:  # a document just under the limit, read from a deeper stack
        raise UserInputError(f"{path}: model file nested too deeply") from None


def _form_text(model: PerfModel) -> str:
    if model.overlap:
        return "overlap"
    searched = model.diagnostics is not None and model.diagnostics.overlap_searched
    return "additive" if searched else "additive (overlap not tried: too few configurations)"


def _run_fit(args: argparse.Namespace) -> int:
    observations = observations_from_csv(read_text(args.samples), args.samples)
    if not observations:
        raise UserInputError(f"{args.samples}: no samples, only a header")
    model = fit(observations)
    document = model_to_dict(model)
    write_atomic(args.output, json.dumps(document, indent=2) + "\n")
    diagnostics = model.diagnostics
    if diagnostics is not None:
        log.info(
            "fitted %d samples (%d configurations) -> %s: %s form, relative RMSE %.3f, "
            "gamma %.2f (%s)%s",
            diagnostics.n_observations,
            diagnostics.n_configs,
            args.output,
            _form_text(model),
            diagnostics.rmse_relative,
            model.gamma,
            "searched" if diagnostics.gamma_identifiable else "pinned: not identifiable here",
            ", scale of the prior only (too few configurations)" if diagnostics.scale_only else "",
        )
    print(json.dumps(document, indent=2))
    return 0


def _run_predict(args: argparse.Namespace) -> int:
    model = load_model(args.model)
    config = Config(
        workers=args.workers, ps=args.ps, worker_cpu=args.worker_cpu, ps_cpu=args.ps_cpu
    )
    print(json.dumps({"throughput": model.throughput(config, args.batch_size)}))
    return 0
