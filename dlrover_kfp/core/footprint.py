"""Memory a DLRM process needs at least, from the model's shape alone.

These are floors, not plans: the planner uses observed usage when history has it. They let the
spec validator reject a quota that cannot hold one worker and one PS, and give cold start a
memory figure that grows with the model instead of a constant.

    PS memory   >= RUNTIME + rows/p · dim · 4 B · (1 + OPTIMIZER_SLOTS) · SNAPSHOT_COPIES
    worker mem  >= RUNTIME + B · (tables + 1) · dim · 4 B · ACTIVATION_COPIES + dense params
"""

from __future__ import annotations

import itertools
import math
from typing import Protocol

#: Resident memory of a Python process with torch loaded and nothing trained (MiB), measured
#: as ~280-350 MiB for the CPU wheel; rounded up.
RUNTIME_MB = 384
#: The bar below which a pod is refused before launch: the low end of that measurement less 10%
#: (280 · 0.9 ≈ 256). Plans keep RUNTIME_MB's margin; a refusal must be sure, so a user's own
#: tight figure that runs is never refused: a PS given 512 MiB for a 1M-row model ran here,
#: 125 MiB under the planning figure.
RUNTIME_MIN_MB = 256
#: Optimizer slots per embedding value: Adagrad keeps one accumulator per weight.
OPTIMIZER_SLOTS = 1
#: Copies of the PS state in memory: the live tensors and the flash checkpoint's shared-memory
#: snapshot buffer, which is sized and touched once at PS start (tmpfs pages count against the
#: pod's memory, on Kubernetes as an emptyDir with ``medium: Memory``).
SNAPSHOT_COPIES = 2
#: Copies of a batch's activations alive at once in a worker (forward, backward, gradients, wire).
ACTIVATION_COPIES = 6
_MIB = 2**20


class ModelShape(Protocol):
    """What the floors read of a model; :class:`~dlrover_kfp.core.spec.ModelSpec` is one.

    A protocol, not the spec's class: the spec's own validator calls these floors (a quota must
    hold one worker and one PS), so the spec depends on this module and this module must not
    depend back on the spec.
    """

    @property
    def table_sizes(self) -> tuple[int, ...]: ...
    @property
    def embedding_rows(self) -> int: ...
    @property
    def embedding_dim(self) -> int: ...
    @property
    def dense_features(self) -> int: ...
    @property
    def bottom_mlp(self) -> tuple[int, ...]: ...
    @property
    def top_mlp(self) -> tuple[int, ...]: ...


class BatchShape(Protocol):
    """What the worker's floor reads of the training settings (a ``TrainingSpec``)."""

    @property
    def batch_size(self) -> int: ...


def min_ps_memory_mb(model: ModelShape, ps_count: int) -> int:
    """Smallest per-PS memory: its share of the rows, their slots, and the snapshot buffer."""
    rows_per_ps = math.ceil(model.embedding_rows / max(1, ps_count))
    state = rows_per_ps * model.embedding_dim * 4 * (1 + OPTIMIZER_SLOTS) * SNAPSHOT_COPIES
    return RUNTIME_MB + math.ceil(state / _MIB)


def min_worker_memory_mb(model: ModelShape, training: BatchShape) -> int:
    """Smallest worker memory: runtime, dense parameters, and one batch's activations."""
    dims = [model.dense_features, *model.bottom_mlp]
    n_tables = len(model.table_sizes)
    interactions = (n_tables + 1) * n_tables // 2 + model.embedding_dim
    top_dims = [interactions, *model.top_mlp]
    params = sum(a * b + b for a, b in itertools.pairwise(dims))
    params += sum(a * b + b for a, b in itertools.pairwise(top_dims))
    activations = training.batch_size * (n_tables + 1) * model.embedding_dim * 4
    total = params * 4 * 3 + activations * ACTIVATION_COPIES
    return RUNTIME_MB + math.ceil(total / _MIB)
