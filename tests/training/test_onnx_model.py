"""The hand-built ONNX graph computes what FullDLRM computes, inline or with external data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from dlrover_kfp.core.documents import load_text, parse
from dlrover_kfp.core.spec import JobSpec, ModelSpec
from dlrover_kfp.training.model import FullDLRM
from dlrover_kfp.training.onnx_model import (
    DATA_FILE,
    MODEL_FILE,
    OPSET,
    OnnxFiles,
    describe,
    dlrm_weights,
    interaction_indices,
    save_onnx,
)

SPEC = ModelSpec(
    embedding_dim=8,
    table_sizes=[1000, 50, 7, 1, 3000],
    dense_features=5,
    bottom_mlp=[16, 8],
    top_mlp=[16, 4, 1],
)


def _model() -> FullDLRM:
    """A model whose every parameter is away from its initial value (biases start at 0 in no
    layer, but shift them anyway so that a bias left out of the graph shows)."""
    model = FullDLRM(SPEC, seed=3, init_seed=5)
    with torch.no_grad():
        for p in model.dense.parameters():
            p.add_(0.05)
    return model


def _inputs(batch: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    dense = np.log1p(rng.exponential(20.0, (batch, SPEC.dense_features))).astype(np.float32)
    sparse = np.stack([rng.integers(0, s, batch) for s in SPEC.table_sizes], axis=1)
    return dense, sparse.astype(np.int64)


def _check_parity(model: FullDLRM, model_dir: Path) -> None:
    session = ort.InferenceSession(str(model_dir / MODEL_FILE), providers=["CPUExecutionProvider"])
    for batch in (1, 37, 300):  # the batch dimension is symbolic
        dense, sparse = _inputs(batch, seed=batch)
        with torch.no_grad():
            expected = model(torch.from_numpy(dense), torch.from_numpy(sparse)).numpy()
        logit, probability = session.run(
            ["logit", "probability"], {"dense": dense, "sparse": sparse}
        )
        assert logit.shape == probability.shape == (batch,)
        np.testing.assert_allclose(logit, expected, atol=1e-5, rtol=0)
        np.testing.assert_allclose(probability, 1.0 / (1.0 + np.exp(-expected)), atol=1e-6)


def test_the_interaction_order_is_torch_s_lower_triangle() -> None:
    rows, cols = torch.tril_indices(6, 6, offset=-1)
    assert interaction_indices(6).tolist() == (rows * 6 + cols).tolist()


def test_the_graph_matches_full_dlrm_with_named_inputs_and_a_symbolic_batch(
    tmp_path: Path,
) -> None:
    model = _model()
    files = save_onnx(dlrm_weights(model), tmp_path)
    assert (files.file, files.external_data) == (MODEL_FILE, None)
    assert sorted(p.name for p in tmp_path.iterdir()) == [MODEL_FILE]  # no temporary left
    graph = onnx.load(tmp_path / MODEL_FILE)
    onnx.checker.check_model(graph, full_check=True)
    assert graph.opset_import[0].version == OPSET
    shapes = {
        v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in [*graph.graph.input, *graph.graph.output]
    }
    assert shapes == {
        "dense": ["batch", 5],
        "sparse": ["batch", 5],
        "logit": ["batch"],
        "probability": ["batch"],
    }
    _check_parity(model, tmp_path)


def test_large_tables_go_to_external_data_and_a_later_small_export_removes_it(
    tmp_path: Path,
) -> None:
    model = _model()
    files = save_onnx(dlrm_weights(model), tmp_path, external_threshold=1024)
    assert files.external_data == DATA_FILE
    assert sorted(p.name for p in tmp_path.iterdir()) == [MODEL_FILE, DATA_FILE]
    table_bytes = sum(SPEC.table_sizes) * SPEC.embedding_dim * 4
    assert (tmp_path / DATA_FILE).stat().st_size == table_bytes
    assert (tmp_path / MODEL_FILE).stat().st_size < table_bytes // 4  # tables not inline
    _check_parity(model, tmp_path)

    save_onnx(dlrm_weights(model), tmp_path)  # small again: one file
    assert sorted(p.name for p in tmp_path.iterdir()) == [MODEL_FILE]
    _check_parity(model, tmp_path)


@pytest.mark.parametrize(
    ("data", "label", "first_sparse"),
    [
        ('{format: criteo, path: "d/*.tsv"}', "label", "C1"),
        ("{format: synthetic, rows: 100}", "label", "C1"),
        (
            "{format: parquet, path: s3://b/x, columns: {label: click, dense: [a, b, c, d, e],"
            " sparse: [u, v, w, x, y]}}",
            "click",
            "u",
        ),
    ],
)
def test_model_json_names_the_columns_and_each_table_s_size(
    data: str, label: str, first_sparse: str
) -> None:
    sizes = SPEC.table_sizes if "parquet" in data else [7] * 26
    dense = 5 if "parquet" in data else 13
    spec = parse(
        JobSpec,
        load_text(
            f"name: j\nmodel: {{embedding_dim: 8, table_sizes: {list(sizes)}, "
            f"dense_features: {dense}, bottom_mlp: [8], top_mlp: [1]}}\ndata: {data}\n"
            "training: {batch_size: 8}\n",
            "job",
        ),
        "job",
    )
    entry = describe(spec, OnnxFiles(file=MODEL_FILE, external_data=None))
    pre = entry["preprocessing"]
    assert pre["columns"]["label"] == label
    assert len(pre["columns"]["dense"]) == dense
    assert pre["sparse"]["tables"][0] == {"column": first_sparse, "size": sizes[0]}
    assert [t["size"] for t in pre["sparse"]["tables"]] == list(sizes)
    assert [i["name"] for i in entry["inputs"]] == ["dense", "sparse"]
    assert entry["inputs"][1]["shape"] == ["batch", len(sizes)]
