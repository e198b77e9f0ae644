"""`dlrover-kfp run` on object storage that fails: each fault is one line naming the URL, exit 2
(fix the input) or 75 (a retry may help), and no training happened: no pod, no profile."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlrover_kfp.cli.main import main
from tests.criteo_text import write_parquet
from tests.storage_server import Bucket, enforced_auth, free_port

SIZES = [100] * 26


def job(tmp_path: Path, path: str) -> Path:
    tables = ", ".join(str(s) for s in SIZES)
    spec = tmp_path / "job.yaml"
    spec.write_text(
        f"""
name: faults
model: {{embedding_dim: 4, table_sizes: [{tables}], bottom_mlp: [8, 4], top_mlp: [8, 1]}}
data: {{format: parquet, path: "{path}"}}
training: {{batch_size: 64}}
resources:
  workers: {{count: 1, cpu: 0.5, memory: 1Gi}}
  ps: {{count: 1, cpu: 0.5, memory: 1Gi}}
"""
    )
    return spec


def run(tmp_path: Path, path: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    out = tmp_path / "out"
    code = main(["run", "--job", str(job(tmp_path, path)), "--output-dir", str(out), "--static"])
    err = capsys.readouterr().err.strip().splitlines()
    assert not (out / "profile.json").exists()  # nothing trained, nothing reported
    assert not (out / "logs").exists() or not any((out / "logs").iterdir())  # no pod started
    return code, err[-1] if err else ""


@pytest.fixture
def parquet(tmp_path: Path) -> Path:
    return write_parquet(tmp_path / "rows.parquet", 3000, SIZES, seed=1, row_group_rows=1000)


def test_a_missing_key(
    tmp_path: Path, s3_bucket: Bucket, capsys: pytest.CaptureFixture[str]
) -> None:
    code, line = run(tmp_path, s3_bucket.url("no/such.parquet"), capsys)
    assert code == 2
    assert line == (
        "dlrover-kfp: error: data.path: no file ending .parquet or .parq or .pq matches "
        f"'{s3_bucket.url('no/such.parquet')}'"
    )


def test_a_truncated_object(
    tmp_path: Path, s3_bucket: Bucket, parquet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = parquet.read_bytes()
    url = s3_bucket.put("cut.parquet", data[: len(data) // 2])
    code, line = run(tmp_path, url, capsys)
    assert code == 2
    assert line.startswith(f"dlrover-kfp: error: {url}: not a readable Parquet file"), line
    assert "truncated" in line


def test_a_refused_credential(
    tmp_path: Path,
    s3_bucket: Bucket,
    parquet: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = s3_bucket.put_file("rows.parquet", parquet)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-4f1c")
    with enforced_auth(s3_bucket.server):
        code, line = run(tmp_path, url, capsys)
    assert code == 2
    assert "refused the credentials" in line and url.split("/")[2] in line, line
    assert "not-the-secret-4f1c" not in line


def test_an_unreachable_endpoint(
    tmp_path: Path,
    s3_bucket: Bucket,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    code, line = run(tmp_path, s3_bucket.url("rows.parquet"), capsys)
    assert code == 75
    assert line.startswith("dlrover-kfp: temporary failure, retry later: "), line
    assert f"cannot reach the object store at {endpoint}" in line
