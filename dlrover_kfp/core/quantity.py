"""Kubernetes resource quantities for CPU and memory.

Users write resources the way Kubernetes does (``500m``, ``0.5``, ``8Gi``, ``16G``); the rest of
the package works in two units only: CPU in cores (float, millicore precision) and memory in
mebibytes (int, ``memory_mb`` everywhere, 1 MiB = 2**20 bytes, Kubernetes' ``Mi``).
"""

from __future__ import annotations

import math
import re

_MEMORY_SUFFIX = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_MEMORY_RE = re.compile(
    r"^([0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$"
)
_CPU_RE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m)?$")
MIB = 2**20
#: Largest amounts accepted. Far beyond any cluster, they keep the arithmetic exact: MiB up to
#: 2**53 are whole floats (``parse_memory_mb(format_memory(m)) == m``), and so are millicores
#: up to 10**15; beyond them a float overflows or rounds, and a number from a YAML file can be
#: any size.
MAX_MEMORY_MB = 2**53
MAX_CPU_CORES = 1e12


class Mebibytes(int):
    """A memory size already parsed into MiB.

    A bare number in a spec means bytes, as in Kubernetes, so parsing a stored MiB value again
    would shrink it 2**20 times: ``dataclasses.replace`` on a spec type re-runs validation on
    every field. The spec types store this subclass, and parsing one returns it unchanged.
    """

    __slots__ = ()


def parse_memory_mb(value: object) -> int:
    """Parse a Kubernetes memory quantity into whole MiB, rounding up.

    A bare number means bytes, as in Kubernetes. Rounding up keeps a request from shrinking
    below what the user asked for.

    >>> parse_memory_mb("8Gi"), parse_memory_mb("512Mi"), parse_memory_mb("16G")
    (8192, 512, 15259)
    """
    if isinstance(value, Mebibytes):
        return value
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a memory quantity (e.g. 8Gi, 512Mi, 16G)")
    if isinstance(value, int | float):
        number, unit = _as_float(value, "memory"), 1
    elif isinstance(value, str):
        match = _MEMORY_RE.match(value.strip())
        if not match:
            raise ValueError(f"{_shown(value)} is not a memory quantity (e.g. 8Gi, 512Mi, 16G)")
        number, unit = _as_float(match.group(1), "memory"), _MEMORY_SUFFIX[match.group(2) or ""]
    else:
        raise ValueError(f"{_shown(value)} is not a memory quantity (e.g. 8Gi, 512Mi, 16G)")
    if math.isnan(number) or number <= 0:
        raise ValueError(f"memory must be positive, got {_shown(value)}")
    mebibytes = number * unit / MIB
    if mebibytes > MAX_MEMORY_MB:
        raise ValueError(f"memory is too large, got {_shown(value)} (at most 2**53 Mi)")
    return max(1, math.ceil(mebibytes - 1e-9))


def parse_cpu(value: object) -> float:
    """Parse a Kubernetes CPU quantity into cores with millicore precision.

    >>> parse_cpu("500m"), parse_cpu("0.5"), parse_cpu(4)
    (0.5, 0.5, 4.0)
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a CPU quantity (e.g. 4, 0.5, 500m)")
    if isinstance(value, int | float):
        cores = _as_float(value, "CPU")
    elif isinstance(value, str):
        match = _CPU_RE.match(value.strip())
        if not match:
            raise ValueError(f"{_shown(value)} is not a CPU quantity (e.g. 4, 0.5, 500m)")
        cores = _as_float(match.group(1), "CPU") / (1000.0 if match.group(2) else 1.0)
    else:
        raise ValueError(f"{_shown(value)} is not a CPU quantity (e.g. 4, 0.5, 500m)")
    if math.isnan(cores) or cores <= 0:
        raise ValueError(f"CPU must be positive, got {_shown(value)}")
    if cores > MAX_CPU_CORES:
        raise ValueError(f"CPU is too large, got {_shown(value)} (at most {MAX_CPU_CORES:g})")
    if cores < 0.001:
        raise ValueError(f"CPU below one millicore, got {_shown(value)}")
    return round(cores, 3)


def _as_float(value: int | float | str, what: str) -> float:
    """``float(value)``; an int beyond a float's range is "too large", not an OverflowError."""
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{what} is too large, got {_shown(value)}") from None


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
