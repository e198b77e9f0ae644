"""Validated scalar types shared by the contracts.

Every field of the public documents goes through one of these, so that ``"512"`` is not silently
taken for ``512`` and ``true`` is not taken for ``1``: a spec that says something odd is rejected
with the key and the value, never guessed at.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    Strict,
    WithJsonSchema,
)

from dlrover_kfp.core.quantity import (
    MAX_CPU_CORES,
    MAX_MEMORY_MB,
    Mebibytes,
    format_cpu,
    format_memory,
    parse_cpu,
    parse_memory_mb,
)

#: Configuration of every contract dataclass: unknown keys are errors.
CONTRACT_CONFIG = ConfigDict(extra="forbid", validate_assignment=False)

PosInt = Annotated[int, Strict(), Field(ge=1)]
NonNegInt = Annotated[int, Strict(), Field(ge=0)]
# Every float of a contract is finite: Python's JSON reads ``Infinity`` and ``NaN``, and an
# infinite time, throughput or size (or a NaN, which passes no comparison) would reach the
# planner's arithmetic, the simulator or a SQL column. (``allow_inf_nan=False``: pydantic
# refuses them with "Input should be a finite number", naming the field.)
PosFloat = Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)]
NonNegFloat = Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False)]
Str = Annotated[str, Strict()]
Seconds = Annotated[
    float, Strict(), Field(ge=0, allow_inf_nan=False, description="seconds since job start")
]

#: CPU in cores; accepts Kubernetes notation on input (``0.5``, ``500m``, ``4``).
Cores = Annotated[
    float,
    BeforeValidator(parse_cpu),
    WithJsonSchema(
        {
            "description": "CPU cores: a number (0.5, 4) or Kubernetes millicores (500m)",
            "anyOf": [
                {"type": "number", "exclusiveMinimum": 0},
                {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?m?$"},
            ],
        }
    ),
]
#: CPU in cores as written by machines (plans, profiles): numbers only, finite, and at most
#: what a spec can ask for (:data:`~dlrover_kfp.core.quantity.MAX_CPU_CORES`).
CoresValue = Annotated[
    float,
    Strict(),
    Field(ge=0, le=MAX_CPU_CORES, allow_inf_nan=False, description="CPU cores"),
]

_MEMORY_PATTERN = r"^[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$"

#: Memory as a Kubernetes quantity in a spec; stored as MiB, written back as a quantity string.
MemoryQuantity = Annotated[
    int,
    BeforeValidator(parse_memory_mb),
    AfterValidator(Mebibytes),  # so that validating the stored value again keeps it
    PlainSerializer(format_memory, return_type=str),
    WithJsonSchema(
        {
            "description": "memory as a Kubernetes quantity (8Gi, 512Mi, 16G); a number is bytes",
            "anyOf": [
                {"type": "number", "exclusiveMinimum": 0},
                {
                    "type": "string",
                    "pattern": _MEMORY_PATTERN,
                },
            ],
        }
    ),
]
#: Memory in MiB as written by machines (plans, profiles), at most what a spec can ask for
#: (:data:`~dlrover_kfp.core.quantity.MAX_MEMORY_MB`: exact in a float).
MemoryMb = Annotated[
    int, Strict(), Field(ge=0, le=MAX_MEMORY_MB, description="memory in MiB (2**20 bytes)")
]


DnsLabel = Annotated[
    str,
    Strict(),
    Field(
        min_length=1,
        max_length=63,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="a DNS-1123 label: lower-case letters, digits and '-', at most 63",
    ),
]

__all__ = [
    "CONTRACT_CONFIG",
    "Cores",
    "CoresValue",
    "DnsLabel",
    "MemoryMb",
    "MemoryQuantity",
    "NonNegFloat",
    "NonNegInt",
    "PosFloat",
    "PosInt",
    "Seconds",
    "Str",
    "format_cpu",
]
