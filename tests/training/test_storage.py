"""training/storage.py: listing data files, reading byte ranges, and the object-store faults,
against local files, fsspec's memory store and a real S3 API (the moto server process)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from dlrover_kfp.errors import (
    EXIT_TRANSIENT,
    EXIT_USER_ERROR,
    DataError,
    DataUnavailableError,
    MissingExtraError,
    TransientError,
    UserInputError,
)
from dlrover_kfp.training import storage
from dlrover_kfp.training.storage import ReadCounter, StoredFile
from tests.storage_server import Bucket, create_access_key, enforced_auth, free_port

pytest.importorskip("fsspec")


def exit_code(error: Exception) -> int:
    """What the CLI (cli/main.py) exits with for this error."""
    return EXIT_TRANSIENT if isinstance(error, TransientError) else EXIT_USER_ERROR


def write(path: Path, data: bytes = b"x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


# ------------------------------------------------------------------------------------------------
# Listing: local, file://, memory://
# ------------------------------------------------------------------------------------------------


def test_a_relative_glob_lists_matching_files_sorted_with_size_and_version(tmp_path: Path) -> None:
    write(tmp_path / "data" / "b.csv", b"12345")
    write(tmp_path / "data" / "a.csv", b"1")
    write(tmp_path / "data" / "c.tsv")
    write(tmp_path / "data" / ".hidden.csv")

    files = storage.resolve("data/*.csv", tmp_path)

    assert [f.url for f in files] == [str(tmp_path / "data" / n) for n in ("a.csv", "b.csv")]
    assert [f.size for f in files] == [1, 5]
    assert files[0].version == str(os.stat(files[0].url).st_mtime_ns)


def test_a_directory_means_its_data_files_recursively_without_hidden_ones(tmp_path: Path) -> None:
    root = tmp_path / "out"
    for name in (
        "part-1.parquet",
        "day=2/part-0.PARQUET",
        "_SUCCESS",
        ".part-1.parquet.crc",
        "_temporary/0/part-9.parquet",
        "notes.txt",
    ):
        write(root / name)

    files = storage.resolve(str(root), "/elsewhere", suffixes=(".parquet",))

    assert [f.url for f in files] == [
        str(root / "day=2" / "part-0.PARQUET"),
        str(root / "part-1.parquet"),
    ]


def test_file_urls_and_home_relative_paths_name_local_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path / "d" / "x.csv")
    monkeypatch.setenv("HOME", str(tmp_path))
    expected = [str(tmp_path / "d" / "x.csv")]

    assert [f.url for f in storage.resolve(f"file://{tmp_path}/d", "/")] == expected
    assert [f.url for f in storage.resolve("~/d/*.csv", "/")] == expected


def test_memory_urls_list_and_read_back() -> None:
    import fsspec  # noqa: PLC0415

    memory = fsspec.filesystem("memory")
    memory.pipe("/storage-test/t/part-0.csv", b"label,I1\n1,2\n")
    memory.pipe("/storage-test/t/_SUCCESS", b"")
    try:
        (f,) = storage.resolve("memory://storage-test/t", ".")
        assert f.url == "memory:///storage-test/t/part-0.csv"
        with storage.open_file(f) as fh:
            assert fh.read() == b"label,I1\n1,2\n"
    finally:
        memory.rm("/storage-test", recursive=True)


def test_no_match_names_the_key_and_the_path(tmp_path: Path) -> None:
    with pytest.raises(DataError) as caught:
        storage.resolve("nothing/*.parquet", tmp_path, key="data.path", suffixes=(".parquet",))
    assert str(caught.value) == (
        "data.path: no file ending .parquet matches 'nothing/*.parquet' "
        f"(looked for '{tmp_path}/nothing/*.parquet')"
    )
    assert exit_code(caught.value) == 2


def test_credentials_in_a_url_are_refused_without_repeating_them() -> None:
    with pytest.raises(UserInputError) as caught:
        storage.resolve("s3://AKIAEXAMPLE:s3cr3t@bucket/x.parquet", ".")
    assert "s3cr3t" not in str(caught.value)
    assert "AKIAEXAMPLE" not in str(caught.value)
    assert str(caught.value).startswith(
        "data.path: credentials do not belong in the URL 's3://bucket/x.parquet'"
    )


# ------------------------------------------------------------------------------------------------
# S3 (the moto server)
# ------------------------------------------------------------------------------------------------


def test_s3_globs_and_prefixes_list_objects_with_their_etags(s3_bucket: Bucket) -> None:
    for key in ("t/day=1/b.parquet", "t/day=1/a.parquet", "t/day=2/c.parquet", "t/_SUCCESS"):
        s3_bucket.put(key, key.encode())
    s3_bucket.put("t/day=2/_temporary/0/d.parquet", b"partial")
    s3_bucket.put("other/e.parquet", b"e")

    by_glob = storage.resolve(s3_bucket.url("t/day=*/*.parquet"), ".")
    by_prefix = storage.resolve(s3_bucket.url("t"), ".", suffixes=(".parquet",))

    expected = [s3_bucket.url(k) for k in ("t/day=1/a.parquet", "t/day=1/b.parquet")]
    expected.append(s3_bucket.url("t/day=2/c.parquet"))
    assert [f.url for f in by_glob] == expected
    assert by_prefix == by_glob
    etag = s3_bucket.server.client().head_object(Bucket=s3_bucket.name, Key="t/day=1/a.parquet")
    assert by_glob[0].version == etag["ETag"].strip('"')
    assert by_glob[0].size == len("t/day=1/a.parquet")


def test_s3_reads_fetch_exactly_the_bytes_asked_for(s3_bucket: Bucket) -> None:
    data = bytes(range(256)) * 16384  # 4 MiB: a read-ahead block cache would fetch far more
    (f,) = storage.resolve(s3_bucket.put("big.bin", data), ".")
    counter = ReadCounter()

    with storage.open_file(f, counter) as fh:
        fh.seek(1_000_000)
        first = fh.read(1000)
        fh.seek(-10, io.SEEK_END)
        last = fh.read()
    ranged = storage.read_range(f, 5, 25, counter)

    assert (first, last, ranged) == (data[1_000_000:1_001_000], data[-10:], data[5:25])
    assert fh.bytes_read == 1010
    assert (counter.bytes, counter.reads) == (1030, 3)


def test_s3_unreachable_endpoint_is_transient(
    s3_bucket: Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    (f,) = storage.resolve(s3_bucket.put("x.parquet", b"data"), ".")
    port = free_port()  # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # botocore's own retries: 4 s of back-off

    with pytest.raises(DataUnavailableError) as listing:
        storage.resolve(s3_bucket.url("*.parquet"), ".")
    with pytest.raises(DataUnavailableError) as opening:
        storage.open_file(f)

    reason = f"cannot reach the object store at http://127.0.0.1:{port}: connection refused"
    assert str(listing.value) == f"{s3_bucket.url('*.parquet')}: {reason}"
    assert str(opening.value) == f"{f.url}: {reason}"
    assert exit_code(opening.value) == 75


def test_s3_missing_key_and_bucket(s3_bucket: Bucket) -> None:
    gone = StoredFile(url=s3_bucket.url("gone.parquet"), size=4, version="")

    with pytest.raises(DataError) as opening:
        storage.open_file(gone)
    with pytest.raises(DataError) as reading:
        storage.read_range(StoredFile("s3://no-such-bucket-here/x.csv", 4, ""), 0, 4)
    with pytest.raises(DataError) as listing:
        storage.resolve("s3://no-such-bucket-here/x.csv", ".")

    assert str(opening.value) == f"{gone.url}: no such object"
    assert str(reading.value) == "s3://no-such-bucket-here/x.csv: no such object"
    assert str(listing.value) == "data.path: no file matches 's3://no-such-bucket-here/x.csv'"
    assert exit_code(opening.value) == 2


@pytest.mark.parametrize("wrong", ["unknown key id", "wrong secret"])
def test_s3_refused_credentials_are_named_never_shown(
    s3_bucket: Bucket, monkeypatch: pytest.MonkeyPatch, wrong: str
) -> None:
    url = s3_bucket.put("x.parquet", b"data")
    good = create_access_key(s3_bucket.server)
    key = "AKIAIOSFODNN7NOTREAL" if wrong == "unknown key id" else good.key
    secret = "not-the-secret-" + good.secret[:8] if wrong == "wrong secret" else good.secret
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)

    with enforced_auth(s3_bucket.server):
        with pytest.raises(DataError) as listing:
            storage.resolve(s3_bucket.url("*.parquet"), ".")
        with pytest.raises(DataError) as reading:
            storage.read_range(StoredFile(url, 4, ""), 0, 4)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", good.key)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", good.secret)
        assert storage.read_range(StoredFile(url, 4, ""), 0, 4) == b"data"  # the right key reads

    code = "InvalidAccessKeyId" if wrong == "unknown key id" else "SignatureDoesNotMatch"
    assert str(listing.value) == (
        f"{s3_bucket.url('*.parquet')}: the object store refused the credentials "
        f"(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN): {code}"
    )
    assert str(reading.value).startswith(f"{url}: the object store refused the credentials")
    for message in (str(listing.value), str(reading.value)):
        assert secret not in message and good.secret not in message
    assert exit_code(listing.value) == 2


def test_s3_without_credentials_names_the_variables(
    s3_bucket: Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")

    with pytest.raises(DataError) as caught:
        storage.resolve(s3_bucket.url("x.parquet"), ".")

    assert str(caught.value) == (
        f"{s3_bucket.url('x.parquet')}: no credentials for the object store; set "
        "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or run with a role "
        "that grants them"
    )


def test_s3_object_truncated_after_listing_is_never_read_partly(s3_bucket: Bucket) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa  # noqa: PLC0415

    sink = io.BytesIO()
    # 1.6 MB: more than the 64 KiB pyarrow reads with the footer, so row groups are read later
    pq.write_table(pa.table({"id": range(200_000)}), sink, row_group_size=20_000)
    whole = sink.getvalue()
    (f,) = storage.resolve(s3_bucket.put("t.parquet", whole), ".")
    with storage.open_file(f) as fh:
        parquet = pq.ParquetFile(fh)  # footer read while whole
        s3_bucket.put("t.parquet", whole[: len(whole) // 2])
        with pytest.raises(DataUnavailableError) as mid_read:
            parquet.read_row_groups(list(range(parquet.num_row_groups)))

    with pytest.raises(DataUnavailableError) as opening:
        storage.open_file(f)
    with pytest.raises(DataUnavailableError) as ranged:
        storage.read_range(f, 0, f.size)

    changed = f"{f.url}: changed since the job listed it"
    assert str(mid_read.value) == f"{changed} (fewer than its {f.size} bytes now)"
    assert str(opening.value) == f"{changed} (size {f.size} -> {len(whole) // 2})"
    assert str(ranged.value) == str(opening.value)
    assert exit_code(opening.value) == 75


def test_s3_object_rewritten_with_the_same_size_is_caught_by_its_etag(s3_bucket: Bucket) -> None:
    (f,) = storage.resolve(s3_bucket.put("t.csv", b"label\n0\n"), ".")
    s3_bucket.put("t.csv", b"label\n1\n")

    with pytest.raises(DataUnavailableError) as caught:
        storage.open_file(f)

    assert str(caught.value).startswith(f"{f.url}: changed since the job listed it (version ")
    assert str(caught.value).endswith(", same size 8)")


def test_a_local_file_rewritten_after_listing_is_caught(tmp_path: Path) -> None:
    path = write(tmp_path / "a.csv", b"label\n0\n")
    (f,) = storage.resolve(str(path), ".")
    os.utime(path, ns=(0, 0))

    with pytest.raises(DataUnavailableError, match="changed since the job listed it"):
        storage.open_file(f)


# ------------------------------------------------------------------------------------------------
# What is classified without a store
# ------------------------------------------------------------------------------------------------


def test_gs_without_gcsfs_names_what_to_install() -> None:
    try:
        import gcsfs  # type: ignore[import-not-found]  # noqa: F401, PLC0415
    except ImportError:
        pass
    else:
        pytest.skip("gcsfs is installed")

    with pytest.raises(MissingExtraError) as caught:
        storage.resolve("gs://bucket/day=1/*.parquet", ".")

    assert str(caught.value) == (
        "gs://bucket/day=1/*.parquet: reading gs:// needs gcsfs: pip install gcsfs"
    )


@pytest.mark.parametrize(
    ("code", "status", "expected"),
    [
        ("SlowDown", 503, "is unavailable (SlowDown)"),
        ("InternalError", 500, "is unavailable (InternalError)"),
        ("", 502, "is unavailable (HTTP 502)"),
    ],
)
def test_throttling_and_server_errors_are_transient(code: str, status: int, expected: str) -> None:
    from botocore.exceptions import ClientError  # noqa: PLC0415

    reply = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}
    raised = OSError(5, "s3fs re-raises it so")
    raised.__cause__ = ClientError(reply, "GetObject")

    error = storage.classify(raised, "s3://b/k", {"AWS_ENDPOINT_URL": "http://store:9000"})

    assert isinstance(error, DataUnavailableError)
    assert str(error) == f"s3://b/k: the object store at http://store:9000 {expected}"


def test_current_tells_a_rewritten_or_removed_object_and_keeps_an_unknown_one(
    s3_bucket: Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the master checks while a job trains (runtime/job.py _check_data): the object as
    the store holds it now; a store it cannot reach is not a change."""
    url = s3_bucket.put("x/a.csv", b"0,1\n")
    (listed,) = storage.resolve(url, ".")
    assert storage.current(listed) == listed
    s3_bucket.put("x/a.csv", b"1,0\n")  # the same size, another ETag
    now = storage.current(listed)
    assert now is not None and now.size == listed.size and now.version != listed.version
    s3_bucket.server.client().delete_object(Bucket=s3_bucket.name, Key="x/a.csv")
    assert storage.current(listed) is None
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    assert storage.current(listed) == listed
