"""Where training data lives: local files and object stores, reached through fsspec.

The one module that talks to fsspec (and through it to s3fs, gcsfs, ...). The readers
(training/tables.py) see only :class:`StoredFile`, :func:`open_file`, :func:`read_range` and the
package's own errors, so that what a store library raises never reaches a user as a traceback.

**Listing.** :func:`resolve` turns ``data.path`` into the files a job reads, once, when the job
opens its data; every file keeps its size and version (ETag, generation, local mtime) from that
listing, and :func:`open_file` refuses a file whose size or version has changed since: shards
are planned from the listed sizes, so reading a rewritten object would silently mix two datasets.

**Nothing cached across calls.** fsspec caches filesystem instances (keyed by their arguments,
not by the environment) and s3fs caches listings. A job must see the objects as they are now
and the credentials and endpoint the environment holds now, so every filesystem is made with
``skip_instance_cache=True`` and ``use_listings_cache=False``, and this module keeps its own
instances keyed by protocol, process id and the store's environment variables: a changed
``AWS_ENDPOINT_URL`` gets a new client, a forked worker never shares its parent's event loop.

**No read-ahead.** A :class:`CountingFile` turns every ``read(n)`` into one ranged read of
exactly those bytes (``fs.cat_file(path, start=, end=)``: an HTTP ``Range`` GET on S3), with no
block cache: s3fs's default file reads ahead 5 MB blocks (and 50 MB with a larger block size),
which would make a worker fetch other workers' shards. Bytes read are therefore bytes fetched,
and :class:`ReadCounter` reports them per worker.

**Endpoint and credentials** come from the environment only, through the store library's own
chain: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` (or a profile, or the pod's role),
``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL`` for an S3-compatible store (aiobotocore reads them
itself, botocore >= 1.31), ``AWS_MAX_ATTEMPTS``/``AWS_RETRY_MODE`` for retries,
``GOOGLE_APPLICATION_CREDENTIALS`` for gs://. A URL with ``user:password@`` is refused.

**Errors** (:func:`storage_errors`): unreachable store, timeout, HTTP 5xx, throttling, a file
that changed under the job -> :class:`DataUnavailableError` (exit 75: a later attempt lists the
data again and may succeed); no such object, refused or missing credentials ->
:class:`DataError` (exit 2); a protocol whose library is not installed ->
:class:`MissingExtraError`. Messages are one line, name the URL and never a secret.
"""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from dlrover_kfp.errors import (
    DataError,
    DataUnavailableError,
    DlroverKfpError,
    MissingExtraError,
    UserInputError,
)

#: Protocols fsspec serves from the local disk; their StoredFile.url is an absolute path.
_LOCAL = frozenset({"file", "local"})
#: The library each object store needs, and the extra of dlrover-kfp that installs it.
_LIBRARIES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs"}
_EXTRAS = {"s3": "s3", "s3a": "s3"}
#: Environment variables that choose a store's endpoint or credentials: part of the cache key.
_STORE_ENV_PREFIXES = ("AWS_", "GOOGLE_", "GCSFS_", "FSSPEC_")
_GLOB_CHARS = frozenset("*?[")

# Error codes (S3's, plus the bare HTTP statuses botocore reports for bodiless HEAD replies).
_REFUSED_CODES = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "AccountProblem",
        "ExpiredToken",
        "InvalidAccessKeyId",
        "InvalidToken",
        "SignatureDoesNotMatch",
        "401",
        "403",
    }
)
_MISSING_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "NotFound", "404"})
_BUSY_CODES = frozenset(
    {
        "InternalError",
        "RequestLimitExceeded",
        "RequestTimeout",
        "ServiceUnavailable",
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "TooManyRequests",
        "TooManyRequestsException",
    }
)
_NO_CREDENTIALS = frozenset(
    {"NoCredentialsError", "PartialCredentialsError", "DefaultCredentialsError"}
)
_UNREACHABLE = frozenset(
    {
        # botocore / aiobotocore
        "EndpointConnectionError",
        "ConnectTimeoutError",
        "ReadTimeoutError",
        "ConnectionClosedError",
        "ProxyConnectionError",
        "HTTPClientError",
        # aiohttp, fsspec, google-auth
        "ClientConnectionError",
        "ServerTimeoutError",
        "FSTimeoutError",
        "TransportError",
    }
)


@dataclass(frozen=True, slots=True)
class StoredFile:
    """One data file as listed when the job opened its data.

    ``url``: the full URL for a remote file (``s3://bucket/key``), an absolute path for a local
    one. ``version`` changes when the object is rewritten: the ETag or generation an object
    store gives, the mtime in nanoseconds for a local file, ``""`` when the store gives none.
    """

    url: str
    size: int
    version: str


class ReadCounter:
    """Bytes and ranged reads fetched from storage, so that a worker can log "read N bytes for
    M rows" and a test can check that a worker fetched its shards' bytes and no more.

    Shared by every file a dataset opens; a lock, because pyarrow may read from threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes = 0
        self._reads = 0

    def add(self, nbytes: int) -> None:
        with self._lock:
            self._bytes += nbytes
            self._reads += 1

    @property
    def bytes(self) -> int:
        return self._bytes

    @property
    def reads(self) -> int:
        return self._reads


# ------------------------------------------------------------------------------------------------
# Filesystems
# ------------------------------------------------------------------------------------------------

#: protocol -> (what the instance was made for, the instance): one per protocol, the newest.
_FILESYSTEMS: dict[str, tuple[tuple[int, tuple[tuple[str, str], ...]], Any]] = {}
_FILESYSTEMS_LOCK = threading.Lock()


def _fsspec() -> Any:
    try:
        import fsspec  # noqa: PLC0415
    except ImportError:
        raise MissingExtraError(
            "reading data files needs fsspec and pyarrow: pip install 'dlrover-kfp[data]'"
        ) from None
    return fsspec


def _store_environment(environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in environ.items() if k.startswith(_STORE_ENV_PREFIXES)))


def _filesystem(protocol: str, url: str) -> Any:
    """The filesystem for ``protocol``, made for this process and the store's environment now."""
    made_for = (os.getpid(), _store_environment(os.environ))
    with _FILESYSTEMS_LOCK:
        cached = _FILESYSTEMS.get(protocol)
        if cached is None or cached[0] != made_for:
            cached = _FILESYSTEMS[protocol] = (made_for, _new_filesystem(protocol, url))
    return cached[1]


def _new_filesystem(protocol: str, url: str) -> Any:
    fsspec = _fsspec()
    try:
        cls = fsspec.get_filesystem_class(protocol)
    except ImportError:
        library = _LIBRARIES.get(protocol, f"the fsspec implementation of {protocol}://")
        extra = _EXTRAS.get(protocol)
        how = f"pip install 'dlrover-kfp[{extra}]'" if extra else f"pip install {library}"
        raise MissingExtraError(
            f"{display(url)}: reading {protocol}:// needs {library}: {how}"
        ) from None
    except ValueError:
        raise UserInputError(f"{display(url)}: unknown protocol {protocol}://") from None
    options: dict[str, Any] = {"skip_instance_cache": True}
    if protocol not in _LOCAL and protocol != "memory":
        options["use_listings_cache"] = False
    with storage_errors(url):
        return cls(**options)


def _split(url: str) -> tuple[str, str]:
    """(protocol, path without it); ``file`` for a plain path."""
    protocol, path = _fsspec().core.split_protocol(url)
    return (protocol or "file"), path


def _location(url: str) -> tuple[Any, str, bool]:
    """(filesystem, its path, local?) of a StoredFile.url."""
    protocol, path = _split(url)
    return _filesystem(protocol, url), path, protocol in _LOCAL


def display(url: str) -> str:
    """``url`` as it may appear in a message or a log: without any ``user:password@``."""
    authority = _authority(url)
    if "@" not in authority:
        return url
    return url.replace(authority, authority.rsplit("@", 1)[1], 1)


def _authority(url: str) -> str:
    """What lies between ``scheme://`` and the next ``/`` (not urlsplit: a glob's ``[`` there
    would make it raise)."""
    if "://" not in url:
        return ""
    return url.split("://", 1)[1].split("/", 1)[0]


# ------------------------------------------------------------------------------------------------
# Listing
# ------------------------------------------------------------------------------------------------


def resolve(
    path: str,
    base_dir: str | os.PathLike[str],
    *,
    key: str = "data.path",
    suffixes: tuple[str, ...] = (),
) -> tuple[StoredFile, ...]:
    """The files ``path`` names, sorted by URL.

    ``path``: a local path or glob (relative to ``base_dir``, ``~`` expanded), or an fsspec URL
    or glob (``s3://bucket/day=*/*.parquet``). A directory, or a prefix that is one in an object
    store, stands for every file under it, recursively, whose name ends with one of
    ``suffixes`` (any name when empty); names under it that start with ``_`` or ``.`` are
    skipped, with all they hold (Spark's ``_SUCCESS`` and ``_temporary/``, ``.crc`` files), and
    so are files a glob matches whose own name starts so. No file -> :class:`DataError` naming
    ``key``.
    """
    protocol, stripped = _split(path)
    check_url(path, key)
    local = protocol in _LOCAL
    looked_for = ""
    if local:
        stripped = os.path.expanduser(stripped)
        if not os.path.isabs(stripped):
            stripped = os.path.join(os.fspath(base_dir), stripped)
        stripped = os.path.abspath(stripped)
        looked_for = f" (looked for {stripped!r})" if stripped != path else ""
    fs = _filesystem(protocol, path)
    with storage_errors(display(path)):
        infos = _list(fs, fs._strip_protocol(stripped), suffixes)
        files = {
            f.url: f for f in (_stored(fs, info, local) for info in infos) if not _is_marker(f)
        }
    if not files:
        wanted = f" ending {' or '.join(suffixes)}" if suffixes else ""
        raise DataError(f"{key}: no file{wanted} matches {display(path)!r}{looked_for}")
    return tuple(files[u] for u in sorted(files))


def _list(fs: Any, path: str, suffixes: tuple[str, ...]) -> list[Mapping[str, Any]]:
    try:
        if _GLOB_CHARS.isdisjoint(path):
            info = fs.info(path)
            if info["type"] == "directory":
                return _under(fs, path, suffixes)
            return [info]
        found: list[Mapping[str, Any]] = []
        for name, info in sorted(fs.glob(path, detail=True).items()):
            if _hidden(name.rstrip("/").rsplit("/", 1)[-1]):
                continue
            found.extend(_under(fs, name, suffixes) if info["type"] == "directory" else [info])
        return found
    except FileNotFoundError:
        return []  # no such key, prefix or bucket: "no file matches", naming the key


def _under(fs: Any, root: str, suffixes: tuple[str, ...]) -> list[Mapping[str, Any]]:
    """The data files under a directory: every file, recursively, but hidden ones."""
    root = root.rstrip("/")
    wanted = tuple(s.lower() for s in suffixes)
    found = []
    for name, info in sorted(fs.find(root, detail=True, withdirs=False).items()):
        relative = name[len(root) :].strip("/").split("/")
        if info.get("type") != "file" or any(_hidden(part) for part in relative):
            continue
        if wanted and not relative[-1].lower().endswith(wanted):
            continue
        found.append(info)
    return found


def _hidden(name: str) -> bool:
    return name.startswith(("_", "."))


def _is_marker(f: StoredFile) -> bool:
    """An object store's empty "folder/" key, which consoles create: not a data file."""
    return f.url.endswith("/") and f.size == 0


def _stored(fs: Any, info: Mapping[str, Any], local: bool) -> StoredFile:
    name = str(info["name"])
    if local:
        return StoredFile(url=name, size=int(info["size"]), version=_local_version(name))
    return StoredFile(url=fs.unstrip_protocol(name), size=int(info["size"]), version=_version(info))


def _local_version(path: str) -> str:
    return str(os.stat(path).st_mtime_ns)


def _version(info: Mapping[str, Any]) -> str:
    """What an object store changes when an object is rewritten: S3's ETag, GCS's generation."""
    for field in ("ETag", "etag", "generation", "VersionId", "version_id"):
        value = info.get(field)
        if value:
            return str(value).strip('"')
    return ""


def check_url(url: str, key: str) -> None:
    """Refuse a URL that carries credentials (``s3://key:secret@bucket``), without repeating
    them: they belong in the environment."""
    if _split(url)[0] not in _LOCAL and "@" in _authority(url):
        raise UserInputError(
            f"{key}: credentials do not belong in the URL {display(url)!r}; the object store's "
            "credentials come from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
            "GOOGLE_APPLICATION_CREDENTIALS)"
        )


def is_local(url: str) -> bool:
    """Whether ``url`` is a local path (or a ``file://`` URL) rather than an object store's."""
    return _split(url)[0] in _LOCAL


# ------------------------------------------------------------------------------------------------
# Writing
# ------------------------------------------------------------------------------------------------


def upload(local: str | os.PathLike[str], url: str, *, key: str = "--output") -> None:
    """Put the local file ``local`` at ``url`` (an object store), in one PUT: an object store
    replaces an object whole, so a reader sees the old object or the new one, never a part
    (s3fs sends a multipart upload for a large file, which S3 also makes visible only at its
    end). Errors as for reading (:func:`storage_errors`)."""
    protocol, path = _split(url)
    check_url(url, key)
    fs = _filesystem(protocol, url)
    with storage_errors(display(url)):
        fs.put_file(os.fspath(local), fs._strip_protocol(path))


# ------------------------------------------------------------------------------------------------
# Reading
# ------------------------------------------------------------------------------------------------


class CountingFile(io.RawIOBase):
    """A seekable binary file over one :class:`StoredFile` whose every ``read(n)`` fetches
    exactly the bytes it returns (no read-ahead, no block cache: see the module docstring);
    ``bytes_read`` counts them, and so does the dataset's :class:`ReadCounter` if one is given.

    A read that finds the file shorter than listed raises :class:`DataUnavailableError`: the
    object was rewritten (or truncated) under the job."""

    def __init__(
        self,
        stored: StoredFile,
        fetch: Callable[[int, int], bytes],
        counter: ReadCounter | None = None,
        release: Callable[[], None] | None = None,
    ) -> None:
        super().__init__()
        self.stored = stored
        self._fetch = fetch
        self._counter = counter
        self._release = release
        self._position = 0
        self.bytes_read = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self.stored.size}
        if whence not in base:
            raise ValueError(f"invalid whence {whence}")
        position = base[whence] + offset
        if position < 0:
            raise ValueError(f"negative seek position {position}")
        self._position = position
        return position

    def read(self, size: int | None = -1, /) -> bytes:
        start = self._position
        end = self.stored.size if size is None or size < 0 else min(start + size, self.stored.size)
        if start >= end:
            return b""
        with storage_errors(self.stored.url):
            data = self._fetch(start, end)
        if len(data) != end - start:
            _raise_changed(self.stored)
        self._position = end
        self.bytes_read += len(data)
        if self._counter is not None:
            self._counter.add(len(data))
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed and self._release is not None:
            self._release()
        super().close()


def open_file(f: StoredFile, counter: ReadCounter | None = None) -> CountingFile:
    """``f`` opened for reading, after checking that it is still as listed (size and version;
    a changed file -> :class:`DataUnavailableError` naming both sizes)."""
    fs, path, local = _location(f.url)
    with storage_errors(f.url):
        _check_unchanged(f, fs, path, local)
        if local:
            descriptor = os.open(path, os.O_RDONLY)
            return CountingFile(
                f,
                lambda start, end: _pread(descriptor, start, end),
                counter,
                lambda: os.close(descriptor),
            )
    return CountingFile(f, lambda start, end: fs.cat_file(path, start=start, end=end), counter)


def read_range(f: StoredFile, start: int, end: int, counter: ReadCounter | None = None) -> bytes:
    """Bytes ``[start, end)`` of ``f``, in one ranged read, counted in ``counter``. A file now
    shorter than that (truncated or rewritten since listed) -> :class:`DataUnavailableError`."""
    if not 0 <= start <= end <= f.size:
        raise ValueError(f"byte range {start}-{end} is outside {display(f.url)} ({f.size} bytes)")
    fs, path, local = _location(f.url)
    with storage_errors(f.url):
        if local:
            with open(path, "rb") as handle:
                data = _pread(handle.fileno(), start, end)
        else:
            data = fs.cat_file(path, start=start, end=end)
        if len(data) != end - start:
            _check_unchanged(f, fs, path, local)
            _raise_changed(f)
    if counter is not None:
        counter.add(len(data))
    return bytes(data)


def _pread(descriptor: int, start: int, end: int) -> bytes:
    parts = []
    while start < end:
        chunk = os.pread(descriptor, end - start, start)
        if not chunk:
            break
        parts.append(chunk)
        start += len(chunk)
    return b"".join(parts)


def current(f: StoredFile) -> StoredFile | None:
    """``f`` as the store holds it now (its size and version), ``None`` when it is gone; ``f``
    itself when the store cannot say (unreachable): a check of the data during a run must not
    fail the run for a probe that did not get through. A stat for a local file, a HEAD for an
    object."""
    fs, path, local = _location(f.url)
    try:
        info = fs.info(path)
    except FileNotFoundError:
        return None
    except Exception:  # unknown is not changed (see the docstring)
        return f
    version = _local_version(path) if local else _version(info)
    return StoredFile(url=f.url, size=int(info["size"]), version=version)


def _check_unchanged(f: StoredFile, fs: Any, path: str, local: bool) -> None:
    info = fs.info(path)
    size = int(info["size"])
    version = _local_version(path) if local else _version(info)
    if size != f.size:
        raise DataUnavailableError(
            f"{display(f.url)}: changed since the job listed it (size {f.size} -> {size})"
        )
    if f.version and version and version != f.version:
        raise DataUnavailableError(
            f"{display(f.url)}: changed since the job listed it "
            f"(version {f.version} -> {version}, same size {size})"
        )


def _raise_changed(f: StoredFile) -> None:
    raise DataUnavailableError(
        f"{display(f.url)}: changed since the job listed it (fewer than its {f.size} bytes now)"
    )


# ------------------------------------------------------------------------------------------------
# Errors
# ------------------------------------------------------------------------------------------------


@contextmanager
def storage_errors(url: str) -> Iterator[None]:
    """Turns what fsspec and the store libraries raise into this package's errors (see
    :func:`classify`); anything it does not recognise goes through unchanged."""
    try:
        yield
    except DlroverKfpError:
        raise
    except Exception as exc:
        error = classify(exc, url, os.environ)
        if error is None:
            raise
        raise error from exc


def classify(exc: BaseException, url: str, environ: Mapping[str, str]) -> DlroverKfpError | None:
    """The package's error for what a store library raised while reading ``url``, or ``None``.

    Classes are recognised by name along the exception's cause/context chain: the store
    libraries (botocore, aiohttp, google-auth) are optional, and s3fs re-raises a botocore
    ``ClientError`` as a builtin ``OSError`` whose cause keeps the S3 error code."""
    chain = list(_chain(exc))
    names = {cls.__name__ for e in chain for cls in type(e).__mro__}
    shown = display(url)
    remote = "://" in url and not url.startswith("file://")
    if names & _NO_CREDENTIALS:
        return DataError(f"{shown}: no credentials for the object store; {_credentials_hint(url)}")
    code, status = _response_code(chain)
    if code in _REFUSED_CODES or status in (401, 403):
        return DataError(
            f"{shown}: the object store refused the credentials ({_credential_names(url)}): "
            f"{code or f'HTTP {status}'}"
        )
    if code in _MISSING_CODES or status == 404:
        return DataError(f"{shown}: no such object")
    if code in _BUSY_CODES or (status is not None and (status >= 500 or status == 429)):
        return DataUnavailableError(
            f"{shown}: the object store at {_endpoint(chain, url, environ)} is unavailable "
            f"({code or f'HTTP {status}'})"
        )
    if names & _UNREACHABLE or any(isinstance(e, ConnectionError | TimeoutError) for e in chain):
        return DataUnavailableError(
            f"{shown}: cannot reach the object store at {_endpoint(chain, url, environ)}: "
            f"{_reason(chain)}"
        )
    if isinstance(exc, PermissionError):
        if remote:
            return DataError(
                f"{shown}: the object store refused the credentials ({_credential_names(url)})"
            )
        return DataError(f"{shown}: permission denied")
    if isinstance(exc, FileNotFoundError):
        return DataError(f"{shown}: no such {'object' if remote else 'file'}")
    return None


def _chain(exc: BaseException) -> Iterable[BaseException]:
    seen: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo and len(seen) < 32:
        e = todo.pop(0)
        if e is None or any(e is s for s in seen):
            continue
        seen.append(e)
        todo += [e.__cause__, e.__context__]
    return seen


def _response_code(chain: Iterable[BaseException]) -> tuple[str, int | None]:
    """(error code, HTTP status) of the first store reply in the chain: botocore's
    ``ClientError.response``, or an HTTP error's ``code``/``status`` (gcsfs, aiohttp)."""
    for e in chain:
        response = getattr(e, "response", None)
        if isinstance(response, Mapping) and "Error" in response:
            code = str(response["Error"].get("Code", ""))
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            return code, status if isinstance(status, int) else None
        if type(e).__name__ in ("HttpError", "ClientResponseError"):
            status = getattr(e, "code", None) or getattr(e, "status", None)
            if isinstance(status, int):
                return "", status
    return "", None


def _endpoint(chain: Iterable[BaseException], url: str, environ: Mapping[str, str]) -> str:
    """The store's address for a message: the one the failed request went to if botocore says,
    else the one the environment sets, else the store's default."""
    for e in chain:
        details = getattr(e, "kwargs", None)  # botocore keeps the request's URL there
        tried = details.get("endpoint_url") if isinstance(details, Mapping) else None
        if isinstance(tried, str) and "://" in tried:
            return f"{tried.split('://', 1)[0]}://{_authority(display(tried))}"
    protocol = url.split("://", 1)[0] if "://" in url else "file"
    if protocol in ("s3", "s3a"):
        configured = environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL")
        return display(configured) if configured else "the default AWS S3 endpoint"
    return f"the default {protocol}:// endpoint"


def _reason(chain: Iterable[BaseException]) -> str:
    for e in chain:
        if isinstance(e, ConnectionRefusedError):
            return "connection refused"
        if isinstance(e, TimeoutError) or "Timeout" in type(e).__name__:
            return "timed out"
        if type(e).__name__ == "gaierror":
            return "unknown host"
    return "connection failed"


def _credential_names(url: str) -> str:
    if url.startswith(("gs://", "gcs://")):
        return "GOOGLE_APPLICATION_CREDENTIALS"
    return "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN"


def _credentials_hint(url: str) -> str:
    if url.startswith(("gs://", "gcs://")):
        return "set GOOGLE_APPLICATION_CREDENTIALS to a service account's key file"
    return (
        "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or run with a role "
        "that grants them"
    )
