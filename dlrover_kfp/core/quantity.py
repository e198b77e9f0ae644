"""Kubernetes resource quantities for CPU and memory: the one parser of the package.

Users write resources the way Kubernetes does (``500m``, ``0.5``, ``8Gi``, ``16G``), and the
API server and metrics.k8s.io answer in the same quantities (``1234567n``, ``123456Ki``); the
rest of the package works in two units only: CPU in cores (float, millicore precision) and
memory in mebibytes (int, ``memory_mb`` everywhere, 1 MiB = 2**20 bytes, Kubernetes' ``Mi``).

One grammar reads every quantity, Kubernetes' ``resource.Quantity``::

    <quantity> ::= <sign>? <number> <suffix>
    <number>   ::= <digits> | <digits> "." <digits>? | "." <digits>
    <suffix>   ::= <binarySI> | <decimalExponent> | <decimalSI>
    <binarySI> ::= Ki | Mi | Gi | Ti | Pi | Ei                        (2**10 .. 2**60)
    <decimalSI> ::= n | u | m | "" | k | M | G | T | P | E           (1e-9 .. 1e18)
    <decimalExponent> ::= ("e" | "E") <sign>? <digits>               (1e3 = 1000)

and one more form that this package always read: an exponent before an SI suffix
(``1.5e3M`` = 1.5e9). ``1E`` is exa (the suffix wins over an exponent without digits).
:func:`parse_quantity` gives the exact value (a ``Decimal``); what a user writes in a spec
goes through :func:`parse_cpu` / :func:`parse_memory_mb`, which read the same grammar and then
refuse what is surely a slip: a CPU with a suffix other than ``m`` (``1.5k`` cores), a memory
in milli-, micro- or nanobytes (``512m`` meant ``512Mi``), zero or a negative amount.
"""

from __future__ import annotations

import re
from decimal import (
    ROUND_CEILING,
    ROUND_HALF_EVEN,
    Context,
    Decimal,
    DivisionByZero,
    InvalidOperation,
)

from dlrover_kfp.errors import UserInputError

_BINARY_SI = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL_SI = {"": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_SUB_UNIT = {"n": -9, "u": -6, "m": -3}
#: bytes (or cores) per unit of each suffix, exact
_UNIT: dict[str, Decimal] = {
    **{k: Decimal(v) for k, v in _BINARY_SI.items()},
    **{k: Decimal(1).scaleb(e) for k, e in {**_DECIMAL_SI, **_SUB_UNIT}.items()},
}
_MEMORY_SUFFIXES = frozenset(_BINARY_SI) | frozenset(_DECIMAL_SI)
_CPU_SUFFIXES = frozenset({"", "m"})
_QUANTITY_RE = re.compile(
    r"([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]([+-]?[0-9]+))?(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?"
)
MIB = 2**20
#: Largest amounts accepted. Far beyond any cluster, they keep the arithmetic exact: MiB up to
#: 2**53 are whole floats (``parse_memory_mb(format_memory(m)) == m``), and so are millicores
#: up to 10**15; beyond them a float overflows or rounds, and a number from a YAML file can be
#: any size.
MAX_MEMORY_MB = 2**53
MAX_CPU_CORES = 1e12
_MAX_CPU = Decimal(MAX_CPU_CORES)
_MILLICORE = Decimal("0.001")
#: Decimal exponents beyond this overflow to infinity (or underflow to zero) in the context
#: below: a quantity with an exponent of a thousand digits costs no more than ``1e9``.
_EMAX = 999_999


def _context() -> Context:
    """Exact for every amount within the bounds above (22 significant digits of bytes, times
    at most 20 more for 2**-20); a larger number overflows to Infinity and is "too large"."""
    return Context(prec=80, Emax=_EMAX, Emin=-_EMAX, traps=[InvalidOperation, DivisionByZero])


class Mebibytes(int):
    """A memory size already parsed into MiB.

    A bare number in a spec means bytes, as in Kubernetes, so parsing a stored MiB value again
    would shrink it 2**20 times: ``dataclasses.replace`` on a spec type re-runs validation on
    every field. The spec types store this subclass, and parsing one returns it unchanged.
    """

    __slots__ = ()


def _split(text: str) -> tuple[Decimal, str] | None:
    """``text`` as (its number with sign and exponent applied, its SI suffix); None when it is
    not a quantity. Exact: the digits are read as written, whatever their count."""
    match = _QUANTITY_RE.fullmatch(text.strip())
    if match is None:
        return None
    sign, digits, exponent, suffix = match.groups()
    number = Decimal(sign + digits)
    if exponent:
        # Saturate before int(): an exponent past ±2·Emax gives ±Infinity / 0 all the same.
        shift = int(exponent) if len(exponent) <= 9 else (-1 if exponent[0] == "-" else 1) * 10**9
        number = number.scaleb(max(-2 * _EMAX, min(2 * _EMAX, shift)), _context())
    return number, suffix or ""


def parse_quantity(text: str) -> Decimal:
    """A Kubernetes quantity as its exact value (``250m`` -> 0.25, ``2Gi`` -> 2147483648),
    as the API server and metrics.k8s.io write them: zero and signs allowed.

    >>> parse_quantity("250m"), parse_quantity("1234567n"), parse_quantity("1e3")
    (Decimal('0.250'), Decimal('0.001234567'), Decimal('1E+3'))
    """
    split = _split(str(text))
    if split is None:
        raise UserInputError(f"{_shown(text)} is not a Kubernetes quantity")
    number, suffix = split
    value = _context().multiply(number, _UNIT[suffix])
    if value.is_infinite():
        raise UserInputError(f"{_shown(text)} is too large for a Kubernetes quantity")
    return value


def quantity_cores(text: str) -> float:
    """A CPU reading (a pod's usage from metrics.k8s.io) in cores, unrounded."""
    return float(parse_quantity(text))


def quantity_mebibytes(text: str) -> float:
    """A memory reading in MiB, unrounded (``123456Ki`` -> 120.5625)."""
    return float(_context().divide(parse_quantity(text), MIB))


def _amount(value: object, suffixes: frozenset[str], what: str, example: str) -> Decimal:
    """The exact amount a spec's ``value`` names: a number as it is (bytes or cores), a string
    through the grammar with one of ``suffixes``; ValueError naming ``what`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{_shown(value)} is not a {what} quantity (e.g. {example})")
    if isinstance(value, int | float):
        return Decimal(value)  # exact: an int of any size, a float's binary value, nan, inf
    split = _split(value)
    if split is None or split[1] not in suffixes:
        raise ValueError(f"{_shown(value)} is not a {what} quantity (e.g. {example})")
    return _context().multiply(split[0], _UNIT[split[1]])


def parse_memory_mb(value: object) -> int:
    """Parse a Kubernetes memory quantity into whole MiB, rounding up.

    A bare number means bytes, as in Kubernetes. Rounding up keeps a request from shrinking
    below what the user asked for.

    >>> parse_memory_mb("8Gi"), parse_memory_mb("512Mi"), parse_memory_mb("16G")
    (8192, 512, 15259)
    """
    if isinstance(value, Mebibytes):
        return value
    size = _amount(value, _MEMORY_SUFFIXES, "memory", "8Gi, 512Mi, 16G")
    if size.is_nan() or size <= 0:
        raise ValueError(f"memory must be positive, got {_shown(value)}")
    # MiB = bytes / 2**20, exact (the context holds every figure below the bound), rounded up.
    mebibytes = _context().divide(size, MIB)
    if mebibytes > MAX_MEMORY_MB:
        raise ValueError(f"memory is too large, got {_shown(value)} (at most 2**53 Mi)")
    return max(1, int(mebibytes.to_integral_value(rounding=ROUND_CEILING)))


def parse_cpu(value: object) -> float:
    """Parse a Kubernetes CPU quantity into cores with millicore precision.

    >>> parse_cpu("500m"), parse_cpu("0.5"), parse_cpu(4)
    (0.5, 0.5, 4.0)
    """
    cores = _amount(value, _CPU_SUFFIXES, "CPU", "4, 0.5, 500m")
    if cores.is_nan() or cores <= 0:
        raise ValueError(f"CPU must be positive, got {_shown(value)}")
    if cores > _MAX_CPU:
        raise ValueError(f"CPU is too large, got {_shown(value)} (at most {MAX_CPU_CORES:g})")
    if cores < _MILLICORE:
        raise ValueError(f"CPU below one millicore, got {_shown(value)}")
    # The nearest millicore (half to even), from the exact value: 1e12 cores in millicores
    # is 16 digits, whole in a float.
    return float(cores.quantize(_MILLICORE, rounding=ROUND_HALF_EVEN))


def _shown(value: object) -> str:
    """The value for a message, cut short: a fuzzed or mistyped one can be megabytes long."""
    text = repr(value) if not isinstance(value, int) else _int_text(value)
    return text if len(text) <= 60 else f"{text[:40]}...({len(text)} characters)"


def _int_text(value: int) -> str:
    # repr() of an int past 4300 digits raises ValueError (Python's int/str limit).
    return repr(value) if value.bit_length() < 4000 else f"<int of {value.bit_length()} bits>"


def format_memory(memory_mb: int) -> str:
    """Render MiB the way Kubernetes users write it (``8Gi`` when whole, else ``1536Mi``)."""
    return f"{memory_mb // 1024}Gi" if memory_mb % 1024 == 0 else f"{memory_mb}Mi"


def format_cpu(cores: float) -> str:
    """Render cores as Kubernetes does: whole cores as numbers, fractions as millicores."""
    millis = round(cores * 1000)
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"
