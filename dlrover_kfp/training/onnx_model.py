"""The trained DLRM as an ONNX graph, built by hand from its weights, for serving without torch.

The graph is written with ``onnx.helper`` rather than traced by ``torch.onnx``: the legacy
exporter is deprecated and the dynamo one needs onnxscript, while the forward pass is a dozen
operators whose meaning is fixed by :mod:`dlrover_kfp.training.model`. Built from numpy arrays
it is exact (the same float32 arithmetic, in the same order up to summation order) and its
inputs and outputs are named for the scorer that reads ``model.json``.

For dense features ``x`` ``[B, D]`` (already ``log1p(max(x, 0))``) and per-table ids ``c``
``[B, T]`` (already hashed into each table), with every table laid end to end as the parameter
servers lay them out (``offset[t]``, :func:`~dlrover_kfp.core.partition.table_offsets`):

    e      = Gather(E_all, c + offset)                  [B, T, d]   one lookup for all tables
    z0     = relu(... relu(x W1ᵀ + b1) ...)              [B, d]      bottom MLP, ReLU after each
    z      = Concat(z0[:, None], e)                      [B, F, d]   F = T + 1
    gram   = z zᵀ                                        [B, F, F]
    inter  = Gather(Reshape(gram, [B, F·F]), i·F + j)    [B, F(F-1)/2] for (i, j) in
                                                          torch.tril_indices(F, F, -1) order
    logit  = top_mlp([z0, inter])                        [B]         ReLU between layers only
    probability = sigmoid(logit)

The batch dimension is the symbolic ``batch``. Tables over :data:`EXTERNAL_DATA_BYTES` (64 MiB)
go to ``model.onnx.data`` beside the graph as ONNX external data, written straight from the
arrays (no copy in memory, no protobuf of them).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from dlrover_kfp.core.partition import table_offsets
from dlrover_kfp.core.spec import DataColumns, DataSpec, JobSpec, ModelSpec, TableData
from dlrover_kfp.files import readable_temp

if TYPE_CHECKING:
    import onnx

    from dlrover_kfp.training.model import FullDLRM

FloatArray = npt.NDArray[np.float32]

#: ONNX opset of the graph: every operator used has had its current meaning since opset 13;
#: 17 is run by every onnxruntime since 1.11 (IR version 8 goes with it).
OPSET = 17
IR_VERSION = 8
MODEL_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"
#: Embedding bytes above which the tables go to :data:`DATA_FILE`. Inline tables are copied
#: several times (into the TensorProto, the graph, the serialised bytes, and read back by the
#: checker): 1.28 GB inline took 17 s and 6.5 GB of memory to export, against 1.9 s for
#: ``model.pt``; written straight from the arrays as external data they cost one disk write.
#: Below this, one self-contained file is simpler to ship (the small example's 27 MB: 0.23 s).
#: A protobuf message (the whole ``model.onnx``) could not exceed 2 GiB anyway.
EXTERNAL_DATA_BYTES = 64 << 20


@dataclass(frozen=True, slots=True)
class DlrmWeights:
    """A DLRM's parameters as numpy arrays: ``tables[t]`` ``[S_t, d]``; each MLP layer ``(W,
    b)`` with ``W`` ``[out, in]`` as ``torch.nn.Linear`` keeps it."""

    tables: tuple[FloatArray, ...]
    bottom: tuple[tuple[FloatArray, FloatArray], ...]
    top: tuple[tuple[FloatArray, FloatArray], ...]

    @property
    def dense_features(self) -> int:
        return int(self.bottom[0][0].shape[1])

    @property
    def embedding_dim(self) -> int:
        return int(self.tables[0].shape[1])

    @property
    def table_bytes(self) -> int:
        return sum(int(t.nbytes) for t in self.tables)


@dataclass(frozen=True, slots=True)
class OnnxFiles:
    """What :func:`save_onnx` wrote: the graph's file name and its external data file, if any."""

    file: str
    external_data: str | None


def dlrm_weights(model: FullDLRM) -> DlrmWeights:
    """The model's parameters as numpy views (no copy: the export must not double a large
    model's memory)."""

    def layers(seq: Any) -> tuple[tuple[FloatArray, FloatArray], ...]:
        return tuple(
            (m.weight.detach().numpy(), m.bias.detach().numpy())
            for m in seq
            if hasattr(m, "weight")
        )

    tables = tuple(bag.weight.detach().numpy() for bag in model.embedding_bags())
    return DlrmWeights(
        tables=tables, bottom=layers(model.dense.bottom), top=layers(model.dense.top)
    )


def interaction_indices(features: int) -> npt.NDArray[np.int64]:
    """Flat indices ``i·F + j`` of the strictly lower triangle of an ``F x F`` matrix, in
    ``torch.tril_indices(F, F, -1)`` order (row by row, column ascending), which is the order
    of the interaction features the top MLP was trained on."""
    pairs = [(i, j) for i in range(features) for j in range(i)]
    return np.array([i * features + j for i, j in pairs], dtype=np.int64)


def _mlp_nodes(
    name: str,
    layers: Sequence[tuple[FloatArray, FloatArray]],
    source: str,
    *,
    last_relu: bool,
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto], str]:
    """Gemm (``x Wᵀ + b``) per layer, Relu after each but the last unless ``last_relu``."""
    from onnx import helper, numpy_helper  # noqa: PLC0415

    nodes, inits = [], []
    current = source
    for k, (w, b) in enumerate(layers):
        w_name, b_name, out = f"{name}.{k}.weight", f"{name}.{k}.bias", f"{name}.{k}"
        inits += [numpy_helper.from_array(w, w_name), numpy_helper.from_array(b, b_name)]
        nodes.append(helper.make_node("Gemm", [current, w_name, b_name], [out], transB=1))
        current = out
        if k < len(layers) - 1 or last_relu:
            nodes.append(helper.make_node("Relu", [out], [f"{out}.relu"]))
            current = f"{out}.relu"
    return nodes, inits, current


def build_graph(weights: DlrmWeights, embeddings: onnx.TensorProto) -> onnx.ModelProto:
    """The model, given the initializer ``embeddings`` (every table end to end, ``[R, d]``),
    inline or external."""
    from onnx import TensorProto, helper, numpy_helper  # noqa: PLC0415

    sizes = [int(t.shape[0]) for t in weights.tables]
    tables = len(sizes)
    features = tables + 1
    consts = {
        "table_offsets": table_offsets(sizes),
        "interaction_index": interaction_indices(features),
        "gram_flat_shape": np.array([-1, features * features], dtype=np.int64),
        "axis_1": np.array([1], dtype=np.int64),
    }
    inits = [embeddings, *(numpy_helper.from_array(v, k) for k, v in consts.items())]
    bottom, bottom_inits, z0 = _mlp_nodes("bottom", weights.bottom, "dense", last_relu=True)
    node = helper.make_node
    nodes = [
        node("Add", ["sparse", "table_offsets"], ["global_ids"]),
        node("Gather", ["embeddings", "global_ids"], ["emb"], axis=0),  # [B, T, d]
        *bottom,
        node("Unsqueeze", [z0, "axis_1"], ["z0_row"]),  # [B, 1, d]
        node("Concat", ["z0_row", "emb"], ["z"], axis=1),  # [B, F, d]
        node("Transpose", ["z"], ["z_t"], perm=[0, 2, 1]),
        node("MatMul", ["z", "z_t"], ["gram"]),  # [B, F, F]
        node("Reshape", ["gram", "gram_flat_shape"], ["gram_flat"]),
        node("Gather", ["gram_flat", "interaction_index"], ["inter"], axis=1),
        node("Concat", [z0, "inter"], ["top_in"], axis=1),
    ]
    top, top_inits, top_out = _mlp_nodes("top", weights.top, "top_in", last_relu=False)
    nodes += [
        *top,
        node("Squeeze", [top_out, "axis_1"], ["logit"]),
        node("Sigmoid", ["logit"], ["probability"]),
    ]
    graph = helper.make_graph(
        nodes,
        "dlrover_kfp_dlrm",
        inputs=[
            helper.make_tensor_value_info(
                "dense", TensorProto.FLOAT, ["batch", weights.dense_features]
            ),
            helper.make_tensor_value_info("sparse", TensorProto.INT64, ["batch", tables]),
        ],
        outputs=[
            helper.make_tensor_value_info("logit", TensorProto.FLOAT, ["batch"]),
            helper.make_tensor_value_info("probability", TensorProto.FLOAT, ["batch"]),
        ],
        initializer=[*inits, *bottom_inits, *top_inits],
    )
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
        producer_name="dlrover-kfp",
    )


def _external_tensor(name: str, shape: Sequence[int], location: str) -> onnx.TensorProto:
    """A float32 initializer whose values lie in ``location`` from offset 0."""
    from onnx import TensorProto  # noqa: PLC0415

    tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(shape))
    length = int(np.prod(shape)) * 4
    for key, value in (("location", location), ("offset", "0"), ("length", str(length))):
        tensor.external_data.add(key=key, value=value)
    tensor.data_location = TensorProto.EXTERNAL
    return tensor


def _write_tables(tables: Sequence[FloatArray], path: Path) -> None:
    """Every table end to end, little-endian float32, straight from the arrays. Not fsync'ed,
    as ``model.pt`` is not: the final checkpoint is the durable copy, and the export can be
    redone from it; an fsync made a 1.28 GB export about 2x slower here (5.6 s against 2.9 s)."""
    with open(path, "wb") as f:
        for table in tables:
            np.ascontiguousarray(table, dtype="<f4").tofile(f)


def save_onnx(
    weights: DlrmWeights, out: Path, *, external_threshold: int = EXTERNAL_DATA_BYTES
) -> OnnxFiles:
    """Write ``out/model.onnx`` (and ``out/model.onnx.data`` when the tables are over
    ``external_threshold`` bytes), each to a temporary name first and then renamed, the data
    before the graph that names it; checked with ``onnx.checker`` before the rename.

    A stale ``model.onnx.data`` from an earlier export to the same directory is removed when
    this model needs none, so the directory never holds data that no graph reads.
    """
    import onnx  # noqa: PLC0415
    from onnx import numpy_helper  # noqa: PLC0415

    out.mkdir(parents=True, exist_ok=True)
    external = weights.table_bytes > external_threshold
    temps: list[Path] = []
    try:
        if external:
            data_tmp = _temp(out, DATA_FILE, temps)
            _write_tables(weights.tables, data_tmp)
            rows = sum(int(t.shape[0]) for t in weights.tables)
            embeddings = _external_tensor(
                "embeddings", [rows, weights.embedding_dim], data_tmp.name
            )
        else:
            embeddings = numpy_helper.from_array(
                np.concatenate(weights.tables).astype(np.float32, copy=False), "embeddings"
            )
        model = build_graph(weights, embeddings)
        graph_tmp = _temp(out, MODEL_FILE, temps)
        graph_tmp.write_bytes(model.SerializeToString())
        onnx.checker.check_model(os.fspath(graph_tmp))  # by path: external data checked too
        if external:
            # The checked graph names the temporary data file; name the final one.
            stored = next(t for t in model.graph.initializer if t.name == "embeddings")
            for entry in stored.external_data:
                if entry.key == "location":
                    entry.value = DATA_FILE
            graph_tmp.write_bytes(model.SerializeToString())
            os.replace(data_tmp, out / DATA_FILE)
        else:
            (out / DATA_FILE).unlink(missing_ok=True)
        os.replace(graph_tmp, out / MODEL_FILE)
    finally:
        for path in temps:
            path.unlink(missing_ok=True)
    return OnnxFiles(file=MODEL_FILE, external_data=DATA_FILE if external else None)


def _temp(out: Path, name: str, temps: list[Path]) -> Path:
    tmp = readable_temp(out, name)  # 0644: a scorer under another uid reads it
    temps.append(tmp)
    return tmp


# ------------------------------------------------------------------------------------------------
# What model.json says about the ONNX model: enough for a scorer without this package
# ------------------------------------------------------------------------------------------------

#: The preprocessing rules, in words a reimplementation follows; :mod:`dlrover_kfp.training.data`
#: (``token_value``, ``hash_ids``, the dense transform) is the one implementation in this package.
DENSE_RULE = "log(1 + max(x, 0)) as float32; a missing or empty value counts as x = 0"
STRING_ID_RULE = (
    "v = int(token, 16) when the token is 1-16 hex digits [0-9a-fA-F], else the 8-byte "
    "blake2b digest of its UTF-8 bytes (hashlib.blake2b(token, digest_size=8)) read big-endian "
    "as an unsigned 64-bit integer; id = 0 when the token is missing or empty or size == 1, "
    "else 1 + v mod (size - 1)"
)
INTEGER_ID_RULE = (
    "a column of integers: id = v when 0 <= v < size, else 0 when size == 1, else "
    "1 + (v mod 2^64) mod (size - 1); a null is id 0"
)


def columns_of(data: DataSpec, model: ModelSpec) -> DataColumns:
    """The column mapping of the data a model was trained on: a table's own, else Criteo's
    naming for the model's shape (``label``, ``I1``.. per dense feature, ``C1``.. per table:
    exactly Criteo's for Criteo files)."""
    if isinstance(data, TableData):
        return data.columns
    return DataColumns(
        dense=tuple(f"I{i + 1}" for i in range(model.dense_features)),
        sparse=tuple(f"C{t + 1}" for t in range(len(model.table_sizes))),
    )


def describe(spec: JobSpec, files: OnnxFiles) -> dict[str, Any]:
    """The ``onnx`` entry of ``model.json``: the files, the inputs and outputs, and how to turn
    a raw row into the inputs (the column mapping, the dense transform, each table's size and
    the id rule)."""
    model = spec.model
    columns = columns_of(spec.data, model)
    dense = "dense features in preprocessing.columns.dense order, after preprocessing.dense"
    return {
        "file": files.file,
        "external_data": files.external_data,
        "opset": OPSET,
        "inputs": [
            {
                "name": "dense",
                "dtype": "float32",
                "shape": ["batch", model.dense_features],
                "meaning": dense,
            },
            {
                "name": "sparse",
                "dtype": "int64",
                "shape": ["batch", len(model.table_sizes)],
                "meaning": "one row id per table in [0, size), preprocessing.sparse order",
            },
        ],
        "outputs": [
            {"name": "logit", "dtype": "float32", "shape": ["batch"], "meaning": "click logit"},
            {
                "name": "probability",
                "dtype": "float32",
                "shape": ["batch"],
                "meaning": "click probability, sigmoid(logit)",
            },
        ],
        "preprocessing": {
            "columns": {
                "label": columns.label,
                "dense": list(columns.dense),
                "sparse": list(columns.sparse),
            },
            "dense": {"rule": DENSE_RULE},
            "sparse": {
                "tables": [
                    {"column": name, "size": size}
                    for name, size in zip(columns.sparse, model.table_sizes, strict=True)
                ],
                "string_rule": STRING_ID_RULE,
                "integer_rule": INTEGER_ID_RULE,
            },
            "label": "1 for a click, 0 otherwise (Criteo text: the first field, '0' or '1')",
        },
    }
