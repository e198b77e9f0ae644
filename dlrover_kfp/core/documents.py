"""Turning text and mappings into contract objects and back, with errors a user can act on.

Parsing is pure: it takes text or a mapping plus a ``source`` label (a file name, usually) used
only in messages. Reading files happens at the edge (``dlrover_kfp.files``).
"""

from __future__ import annotations

import json
import re
from typing import Any, TypeVar

import yaml
from pydantic import TypeAdapter, ValidationError

from dlrover_kfp.errors import SpecError

T = TypeVar("T")


_ADAPTERS: dict[type[Any], TypeAdapter[Any]] = {}


def _adapter(cls: type[Any]) -> TypeAdapter[Any]:
    """One TypeAdapter per contract type (building one costs milliseconds)."""
    adapter = _ADAPTERS.get(cls)
    if adapter is None:
        adapter = _ADAPTERS[cls] = TypeAdapter(cls)
    return adapter


def _loc(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


def _describe(error: Any, prefix: str) -> str:
    """One error of pydantic's as one human line: ``key: what is wrong (got value)``."""
    kind, loc, msg = error["type"], tuple(error["loc"]), str(error["msg"])
    key = _loc(tuple(p for p in loc if not (isinstance(p, str) and p in _UNION_TAGS)))
    key = f"{prefix}.{key}" if prefix and key else (prefix or key)
    if kind in ("unexpected_keyword_argument", "extra_forbidden"):
        return f"{key}: unknown key"
    if kind in ("missing", "missing_keyword_only_argument", "missing_argument"):
        return f"{key}: required key is missing"
    if kind == "value_error":
        msg = msg.removeprefix("Value error, ")
        # Cross-field checks name their own keys; do not repeat the parent's.
        if ":" in msg.split(" ", 1)[0]:
            return msg
        return f"{key}: {msg}" if key else msg
    got = error.get("input")
    shown = "" if isinstance(got, dict | list) else f" (got {got!r})"
    return f"{key}: {msg[0].lower() + msg[1:]}{shown}" if key else f"{msg}{shown}"


#: Discriminated-union tags pydantic inserts into locations; not keys the user wrote.
#: Discriminator values of tagged unions: pydantic puts them into an error's key path
#: (``data.criteo.path``), which is not a key the user wrote, so messages leave them out.
_UNION_TAGS: set[str] = {"criteo", "parquet", "csv", "tsv", "synthetic"}


def register_union_tags(*tags: str) -> None:
    """Declare more discriminator values (a module defining a tagged union calls this)."""
    _UNION_TAGS.update(tags)


def parse(cls: type[T], data: object, source: str, *, prefix: str = "") -> T:
    """Validate ``data`` as ``cls``; raise :class:`SpecError` naming ``source`` and the key."""
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        result: T = _adapter(cls).validate_python(data)
        return result
    except ValidationError as exc:
        errors = exc.errors()
        first = _describe(errors[0], prefix)
        more = (
            f" (and {len(errors) - 1} more problem{'s' * (len(errors) > 2)})"
            if len(errors) > 1
            else ""
        )
        raise SpecError(f"{source}: {first}{more}") from None


def to_dict(obj: object) -> dict[str, Any]:
    """A contract object as plain JSON-compatible data (the form every file holds)."""
    result: dict[str, Any] = _adapter(type(obj)).dump_python(obj, mode="json")
    return result


def to_json(obj: object, *, indent: int | None = 2) -> str:
    return json.dumps(to_dict(obj), indent=indent, sort_keys=False)


def json_schema(cls: type[Any]) -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of a contract type, as accepted on input."""
    schema: dict[str, Any] = _adapter(cls).json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema


#: Deepest nesting a document may have. The package's documents are a few levels deep; the
#: limit exists because PyYAML's scanner does work quadratic in the depth of ``[[[...`` (100 KB
#: of brackets would take minutes) and its composer recurses once per level.
MAX_DEPTH = 100


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` (same tags, same results) that refuses nesting beyond MAX_DEPTH as
    soon as it sees it, before the scanner's cost grows."""

    _depth = 0

    def fetch_flow_collection_start(self, TokenClass: Any) -> None:  # noqa: N803 (PyYAML's name)
        if self.flow_level >= MAX_DEPTH:
            raise yaml.scanner.ScannerError(
                None, None, f"nested deeper than {MAX_DEPTH} levels", self.get_mark()
            )
        super().fetch_flow_collection_start(TokenClass)

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self._depth >= MAX_DEPTH:
            raise yaml.composer.ComposerError(
                None,
                None,
                f"nested deeper than {MAX_DEPTH} levels",
                self.peek_event().start_mark,  # type: ignore[no-untyped-call]
            )
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


# YAML 1.1 (PyYAML) reads a float only with a dot: ``1e-06`` and ``1E+3`` are strings there, but
# numbers in JSON and YAML 1.2. A job spec's ``learning_rate: 1e-6`` or a profile that
# json.dumps wrote (``1e-05``) must read as a number, so the loader also resolves exponent-only
# floats (``[-+]?D+[eE][-+]?D+``); the 1.1 forms keep their own resolver, tried first.
_BoundedLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def load_text(text: str, source: str) -> object:
    """Parse YAML (a superset of JSON) text; malformed text names the source and the line."""
    try:
        return yaml.load(text, Loader=_BoundedLoader)  # a SafeLoader: safe on untrusted text
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        raise SpecError(f"{source}{where}: malformed YAML: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{source}: malformed YAML: {exc}") from None
    except (ValueError, OverflowError) as exc:
        # A scalar that resolves to an impossible value: a timestamp with month 13, an integer
        # of more digits than int() takes. PyYAML lets these through as plain errors.
        problem = str(exc).split(";", 1)[0]
        raise SpecError(f"{source}: malformed YAML: unreadable value: {problem}") from None
    except RecursionError:
        raise SpecError(f"{source}: malformed YAML: nested too deeply") from None
