"""The job spec: one YAML document that the CLI, the KFP components and Airflow all accept.

The spec states what to train and, optionally, the user's own resource guess (the "manual"
configuration) and the job's quota, which no plan may exceed.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, Strict, model_validator
from pydantic.dataclasses import dataclass

from dlrover_kfp.core.footprint import min_ps_memory_mb, min_worker_memory_mb
from dlrover_kfp.core.plan import NodeGroup
from dlrover_kfp.core.types import (
    CONTRACT_CONFIG,
    Cores,
    DnsLabel,
    MemoryQuantity,
    PosFloat,
    Str,
)

BYTES_PER_FLOAT = 4

#: Largest size or count a spec may give. A YAML integer has no limit, but sizes meet CPU and
#: memory in float arithmetic (the quota check, the planner), where a number beyond 2**53
#: rounds and one beyond ~1e308 overflows: the bound turns those into a keyed error.
MAX_SIZE = 2**53

#: A positive size or count (rows, dimensions, layers, pods, epochs), at most MAX_SIZE.
Size = Annotated[int, Strict(), Field(ge=1, le=MAX_SIZE)]
#: A seed: what numpy and torch accept (64 bits).
Seed = Annotated[int, Strict(), Field(ge=0, le=2**63 - 1)]


@dataclass(frozen=True, kw_only=True, config=CONTRACT_CONFIG)
class ModelSpec:
    """DLRM shape: one embedding table per categorical feature, two MLPs.

    The bottom MLP maps the dense features to ``embedding_dim`` so that its output can take part
    in the pairwise dot-product interaction; the top MLP ends in one logit.
    """

    table_sizes: Annotated[tuple[Size, ...], Field(min_length=1)]
    kind: Literal["dlrm"] = "dlrm"
    embedding_dim: Size = 16
    dense_features: Size = 13
    bottom_mlp: Annotated[tuple[Size, ...], Field(min_length=1)] = (64, 32, 16)
    top_mlp: Annotated[tuple[Size, ...], Field(min_length=1)] = (64, 32, 1)

    @model_validator(mode="after")
    def _shapes_fit(self) -> ModelSpec:
        if self.bottom_mlp[-1] != self.embedding_dim:
            raise ValueError(
                f"model.bottom_mlp: last layer {self.bottom_mlp[-1]} must equal "
                f"model.embedding_dim {self.embedding_dim} (the dot interaction needs it)"
            )
        if self.top_mlp[-1] != 1:
            raise ValueError(
                f"model.top_mlp: last layer must be 1 (one logit), got {self.top_mlp[-1]}"
            )
        return self

    @property
    def embedding_rows(self) -> int:
        return sum(self.table_sizes)

    @property
    def embedding_bytes(self) -> int:
        """Bytes of embedding weights: rows x dim x 4 (float32)."""
        return self.embedding_rows * self.embedding_dim * BYTES_PER_FLOAT

    def signature(self) -> str:
        """A stable text key for "the same model shape", used to find similar jobs."""
        tables = ",".join(str(t) for t in self.table_sizes)
        return (
            f"{self.kind}:d{self.embedding_dim}:x{self.dense_features}:t[{tables}]"
            f":b{list(self.bottom_mlp)}:m{list(self.top_mlp)}".replace(" ", "")
        )


#: Criteo's column names, the default mapping of a table of click logs.
CRITEO_LABEL = "label"
CRITEO_DENSE = tuple(f"I{i}" for i in range(1, 14))
CRITEO_SPARSE = tuple(f"C{i}" for i in range(1, 27))

#: ``data.path``: a local path or glob, or an fsspec URL (``s3://bucket/day=*/part-*.parquet``,
#: ``gs://``, ``file://``, ``memory://``). Credentials never go here: they come from the
#: environment (the standard AWS and Google variables) or an Airflow connection.
DataPath = Annotated[
    Str,
    Field(
        description="a local path or glob, or an fsspec URL (s3://, gs://, file://); "
        "credentials come from the environment, never from the spec"
    ),
]


@dataclass(frozen=True, kw_only=True, config=CONTRACT_CONFIG)
class CriteoData:
    """Criteo click logs (tab or comma separated, with or without a header)."""

    path: DataPath
    format: Literal["criteo"] = "criteo"
    rows: Size | None = Field(default=None, description="row count if known; helps planning")


@dataclass(frozen=True, kw_only=True, config=CONTRACT_CONFIG)
class DataColumns:
    """Which columns of a table are the label, the dense and the categorical features.

    The default is Criteo's naming; the model's ``dense_features`` and ``table_sizes`` must match
    the number of dense and sparse columns (one embedding table per sparse column, in order).
    """

    label: Str = CRITEO_LABEL
    dense: tuple[Str, ...] = CRITEO_DENSE
    sparse: tuple[Str, ...] = CRITEO_SPARSE

    @model_validator(mode="after")
    def _distinct(self) -> DataColumns:
        names = [self.label, *self.dense, *self.sparse]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"data.columns: a column is named more than once: {repeated}")
        if not self.sparse:
            raise ValueError("data.columns.sparse: need at least one categorical column")
        return self


@dataclass(frozen=True, kw_only=True, config=CONTRACT_CONFIG)
class TableData:
    """Rows of a table in Parquet, CSV or TSV files, read by column name.

    ``header`` (CSV and TSV only): ``false`` when the files have no header line; their columns
    are then, in order, ``columns.label``, ``columns.dense`` and ``columns.sparse``.
    """

    format: Literal["parquet", "csv", "tsv"]
    path: DataPath
    columns: DataColumns = DataColumns()
    header: bool | None = Field(default=None, description="CSV/TSV: the files have a header")
    rows: Size | None = Field(
        default=None, description="row count if known; else read from the files"
    )

    @model_validator(mode="after")
    def _header_for_text(self) -> TableData:
        if self.format == "parquet" and self.header is not None:
            raise ValueError("data.header: only for csv and tsv (a Parquet file names its columns)")
        return self

    @property
    def has_header(self) -> bool:
        return self.header is not False


@dataclass(frozen=True, kw_only=True, config=CONTRACT_CONFIG)
class SyntheticData:
    """Criteo-shaped synthetic rows with a planted signal, deterministic per seed."""

    rows: Size
    format: Literal["synthetic"] = "synthetic"
    seed: Seed = 0


DataSpec = Annotated[CriteoData | TableData | SyntheticData, Field(discriminator="format")]
#: Data read from files (every format but synthetic).
FileData = CriteoData | TableData


@dataclass(frozen=True, kw_only=True, config=CONTRACT_CONFIG)
class TrainingSpec:
    batch_size: Size
    epochs: Size = 1
    learning_rate: PosFloat = 0.05


@dataclass(frozen=True, kw_only=True, config=CONTRACT_CONFIG)
class Quota:
    """The most CPU and memory the job may hold at once, all pods together."""

    cpu: Cores
    memory: MemoryQuantity


@dataclass(frozen=True, kw_only=True, config=CONTRACT_CONFIG)
class NodeRequest:
    """One role's pods as the user writes them: ``{count: 4, cpu: 4, memory: 8Gi}``."""

    count: Size
    cpu: Cores
    memory: MemoryQuantity

    def to_group(self) -> NodeGroup:
        return NodeGroup(count=self.count, cpu=self.cpu, memory_mb=self.memory)


@dataclass(frozen=True, kw_only=True, config=CONTRACT_CONFIG)
class ResourcesSpec:
    limits: Quota | None = None
    workers: NodeRequest | None = None
    ps: NodeRequest | None = None


@dataclass(frozen=True, kw_only=True, config=CONTRACT_CONFIG)
class ElasticSpec:
    min_workers: Size = 1
    max_workers: Size = 32
    min_ps: Size = 1
    max_ps: Size = 15

    @model_validator(mode="after")
    def _ordered(self) -> ElasticSpec:
        if self.min_workers > self.max_workers:
            raise ValueError(
                f"elastic.min_workers {self.min_workers} exceeds elastic.max_workers "
                f"{self.max_workers}"
            )
        if self.min_ps > self.max_ps:
            raise ValueError(f"elastic.min_ps {self.min_ps} exceeds elastic.max_ps {self.max_ps}")
        return self


@dataclass(frozen=True, kw_only=True, config=CONTRACT_CONFIG)
class JobSpec:
    """A DLRM training job. See docs/contracts.md for every key."""

    name: DnsLabel
    model: ModelSpec
    data: DataSpec
    training: TrainingSpec
    scenario: Str | None = Field(default=None, description="similarity key for warm start")
    resources: ResourcesSpec = ResourcesSpec()
    elastic: ElasticSpec = ElasticSpec()

    @model_validator(mode="after")
    def _room_for_pod_names(self) -> JobSpec:
        """Pods are named ``NAME-worker-K`` and ``NAME-ps-K`` (``-gN`` for a moved PS, N up
        to :data:`MAX_PS_GENERATION`), each a DNS-1123 label of at most 63 characters: a name
        that leaves no room for them is refused here, not at the first pod's launch."""
        res, elastic = self.resources, self.elastic
        workers = max(elastic.max_workers, res.workers.count if res.workers else 1)
        ps = max(elastic.max_ps, res.ps.count if res.ps else 1)
        longest = max(
            (f"{self.name}-worker-{workers - 1}", f"{self.name}-ps-{ps - 1}-g{MAX_PS_GENERATION}"),
            key=len,
        )
        if len(longest) > 63:
            room = 63 - (len(longest) - len(self.name))
            raise ValueError(
                f"name: {len(self.name)} characters leave no room for the pods' names "
                f"({longest!r} is {len(longest)} characters, a pod name at most 63); at most "
                f"{room} with these elastic bounds and resources"
            )
        return self

    @model_validator(mode="after")
    def _columns_fit_model(self) -> JobSpec:
        if not isinstance(self.data, TableData):
            return self
        columns, model = self.data.columns, self.model
        if len(columns.dense) != model.dense_features:
            raise ValueError(
                f"data.columns.dense: {len(columns.dense)} columns for model.dense_features "
                f"{model.dense_features}; name one dense column per dense feature"
            )
        if len(columns.sparse) != len(model.table_sizes):
            raise ValueError(
                f"data.columns.sparse: {len(columns.sparse)} columns for "
                f"{len(model.table_sizes)} model.table_sizes; name one categorical column per "
                "embedding table"
            )
        return self

    @model_validator(mode="after")
    def _within_quota(self) -> JobSpec:
        limits = self.resources.limits
        if limits is None:
            return self
        need_mem = min_worker_memory_mb(self.model, self.training) + min_ps_memory_mb(self.model, 1)
        if limits.cpu < 2 * MIN_NODE_CPU or limits.memory < need_mem:
            raise ValueError(
                f"resources.limits: quota (cpu {limits.cpu}, memory {limits.memory}Mi) is too "
                f"small for one worker and one PS of this model (needs at least cpu "
                f"{2 * MIN_NODE_CPU}, memory {need_mem}Mi)"
            )
        groups = [g for g in (self.resources.workers, self.resources.ps) if g is not None]
        cpu = sum(g.count * g.cpu for g in groups)
        mem = sum(g.count * g.memory for g in groups)
        if cpu > limits.cpu + 1e-9:
            raise ValueError(
                f"resources: workers and ps request cpu {cpu:g}, more than "
                f"resources.limits.cpu {limits.cpu:g}"
            )
        if mem > limits.memory:
            raise ValueError(
                f"resources: workers and ps request memory {mem}Mi, more than "
                f"resources.limits.memory {limits.memory}Mi"
            )
        return self

    @property
    def dataset_rows(self) -> int | None:
        return self.data.rows


#: The most PS moves a run's pod names leave room for (``NAME-ps-K-gN``).
MAX_PS_GENERATION = 99

#: The smallest CPU a pod may be given (cores).
MIN_NODE_CPU = 0.5
