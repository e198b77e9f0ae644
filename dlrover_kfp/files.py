"""Reading and writing the package's documents on disk, with errors that name the file.

Writes are atomic (a temporary file in the same directory, fsync, rename) so that a crash or a
full disk never leaves half a plan or half a model behind.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

from dlrover_kfp.core.documents import load_text, parse
from dlrover_kfp.errors import UserInputError

T = TypeVar("T")


def read_text(path: str | os.PathLike[str]) -> str:
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserInputError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise UserInputError(f"{p}: is a directory, expected a file") from None
    except UnicodeDecodeError:
        raise UserInputError(f"{p}: not UTF-8 text") from None
    except OSError as exc:
        raise UserInputError(f"{p}: cannot read: {exc.strerror}") from None


def read_document(cls: type[T], path: str | os.PathLike[str]) -> T:
    """Read a YAML or JSON file and validate it as ``cls``."""
    source = str(path)
    return parse(cls, load_text(read_text(path), source), source)


def write_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the new one, never half."""
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=directory)
    except OSError as exc:
        raise UserInputError(f"{target}: cannot write: {exc.strerror}") from None
    try:
        # mkstemp creates 0600; documents are meant to be read by others, like any new file.
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise UserInputError(f"{target}: cannot write: {exc.strerror}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def iter_json_lines(path: str | os.PathLike[str]) -> Iterator[tuple[str, int, object]]:
    """``(where, line number, value)`` for every non-blank line of a JSON Lines file.

    ``where`` is ``<file>:<line>``, for the caller's own validation messages. A missing or
    unreadable file, a line that is not UTF-8 and a line that is not JSON are
    :class:`UserInputError` naming the file (and line).
    """
    source = Path(path)
    try:
        handle = source.open("rb")
    except FileNotFoundError:
        raise UserInputError(f"{source}: no such file") from None
    except IsADirectoryError:
        raise UserInputError(f"{source}: is a directory, expected a file") from None
    except OSError as exc:
        raise UserInputError(f"{source}: cannot read: {exc.strerror}") from None
    with handle:
        for number, raw in enumerate(handle, start=1):
            where = f"{source}:{number}"
            try:
                text = raw.decode("utf-8").strip()
            except UnicodeDecodeError:
                raise UserInputError(f"{where}: not UTF-8 text") from None
            if not text:
                continue
            try:
                value = json.loads(text)
            except json.JSONDecodeError as exc:
                raise UserInputError(
                    f"{where}: malformed JSON: {exc.msg} (column {exc.colno})"
                ) from None
            except ValueError as exc:
                # An integer of more digits than int() takes (4300): not a JSONDecodeError.
                problem = str(exc).split(";", 1)[0]
                raise UserInputError(f"{where}: malformed JSON: {problem}") from None
            except RecursionError:
                raise UserInputError(f"{where}: malformed JSON: nested too deeply") from None
            yield where, number, value
