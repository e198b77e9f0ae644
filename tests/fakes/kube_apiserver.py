"""A fake Kubernetes API server that speaks the real wire protocol, for tests.

``FakeApiServer`` serves core/v1 (namespaces, pods with their ``status``, ``binding``,
``eviction`` and ``log`` subresources, secrets, configmaps, services, events, nodes),
``coordination.k8s.io/v1`` leases (MicroTime decoding, no unconditional update) and the
``metrics.k8s.io/v1beta1`` PodMetrics API over plain HTTP on ``127.0.0.1``, so that the unmodified
official ``kubernetes`` Python client and ``kubectl`` work against it::

    with FakeApiServer() as api:
        api.write_kubeconfig(tmp_path / "kubeconfig")
        client = kubernetes.config.new_client_from_config(str(tmp_path / "kubeconfig"))
        ...

What it implements, as the real server does: ``metadata.uid``/``resourceVersion`` (one global
counter bumped by every write)/``creationTimestamp``/``generation``/``generateName``; defaulting
(pod ``restartPolicy``, ``terminationGracePeriodSeconds``, requests from limits, ``qosClass``,
the default not-ready/unreachable tolerations; a service's ``clusterIP``; a secret's
``stringData`` folded into ``data``); canonical quantities (``"0.5"`` reads back ``"500m"``);
validation (422 ``Invalid`` with causes); pod spec immutability; optimistic concurrency (409
``Conflict``); label and field selectors; chunked lists (``limit``/``continue``); watches
(chunked HTTP, ``ADDED``/``MODIFIED``/``DELETED``/``BOOKMARK``/``ERROR``, resume from a
resourceVersion, 410 ``Expired`` once the history is compacted, selector-aware ADDED/DELETED
when an object starts or stops matching); graceful pod deletion when a kubelet is attached;
finalizers; owner-reference garbage collection (Background, Foreground, Orphan); JSON merge,
strategic merge (by the well-known merge keys) and JSON patches; server-side ``Table`` output
for kubectl; discovery; bearer-token authentication; RBAC-like restrictions.

Test controls: fault injection (:meth:`FakeApiServer.fail`, :meth:`~FakeApiServer.storm`,
:meth:`~FakeApiServer.throttle`, :meth:`~FakeApiServer.slow`,
:meth:`~FakeApiServer.reset_connections`), watch expiry (:meth:`~FakeApiServer.compact`,
:meth:`~FakeApiServer.expire_watches`), authorization (:meth:`~FakeApiServer.forbid`,
:meth:`~FakeApiServer.restrict`) and an audit log (:attr:`~FakeApiServer.calls`). Requests that
carry the header ``X-Fake-Kubelet`` (the fake kubelet's) are exempt from authorization and,
while ``faults_exempt_kubelet`` is True (the default), from faults; the audit log marks them
``from_kubelet``.

Deliberate simplifications: no protobuf (JSON only; a request that accepts only protobuf gets
406), no server-side apply (415), no OpenAPI documents (404), no managedFields, no admission
beyond the defaults above, no ``dryRun`` for deletes, and a ``continue`` token resumes from the
*current* state after the last key it returned rather than from a snapshot.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import math
import os
import platform
import queue
import random
import re
import socket
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fractions import Fraction
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

Json = dict[str, Any]

#: Header the fake kubelet sends; such requests skip faults and authorization.
KUBELET_HEADER = "X-Fake-Kubelet"
SERVER_VERSION = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0-fake",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2024-12-11T00:00:00Z",
    "goVersion": "go1.23.4",
    "compiler": "gc",
    "platform": "linux/amd64",
}
DEFAULT_NODE = "fake-node-0"
METRICS_GROUP = "metrics.k8s.io"
METRICS_VERSION = "v1beta1"
COORDINATION_GROUP = "coordination.k8s.io"
_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})

# --------------------------------------------------------------------------------------------
# Time


def rfc3339(t: float | None = None) -> str:
    """A metav1.Time: RFC 3339, UTC, whole seconds, ``Z``."""
    moment = datetime.fromtimestamp(time.time() if t is None else t, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str) -> float:
    text = text.replace("Z", "+00:00")
    return datetime.fromisoformat(text).timestamp()


def human_duration(seconds: float) -> str:
    """kubectl's short age format: ``5s``, ``2m3s``, ``15m``, ``3h4m``, ``2d``..."""
    if seconds < -1:
        return "<invalid>"
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    years = hours // (24 * 365)
    if years < 8:
        days = (hours // 24) % 365
        return f"{years}y{days}d" if days else f"{years}y"
    return f"{years}y"


# --------------------------------------------------------------------------------------------
# Quantities

QUANTITY_ERROR = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)
_QUANTITY_RE = re.compile(
    r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?"
)
_DECIMAL_EXP = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_EXP = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_SUFFIX = {v: k for k, v in _DECIMAL_EXP.items()}


def parse_quantity(value: str | int | float) -> Fraction:
    """A Kubernetes quantity (``"500m"``, ``"0.25"``, ``"2Gi"``, ``"1e3"``) as an exact
    fraction of its base unit. ValueError for anything the real server would refuse."""
    if isinstance(value, bool):
        raise ValueError(QUANTITY_ERROR)
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(QUANTITY_ERROR)
        return Fraction(value)
    m = _QUANTITY_RE.fullmatch(value.strip()) if isinstance(value, str) else None
    if m is None:
        raise ValueError(QUANTITY_ERROR)
    number, suffix = Fraction(m.group(1)), m.group(2) or ""
    if suffix in _BINARY_EXP:
        return number * (1 << _BINARY_EXP[suffix])
    exp = _DECIMAL_EXP[suffix] if suffix in _DECIMAL_EXP else int(suffix[1:])
    return number * Fraction(10) ** exp


def _quantity_style(value: str | int | float) -> str:
    if not isinstance(value, str):
        return "DecimalSI"
    m = _QUANTITY_RE.fullmatch(value.strip())
    suffix = (m.group(2) if m else None) or ""
    if suffix in _BINARY_EXP:
        return "BinarySI"
    if suffix[:1] in ("e", "E"):
        return "DecimalExponent"
    return "DecimalSI"


def format_quantity(value: Fraction | float | int, style: str = "DecimalSI") -> str:
    """Render a quantity in canonical form, as the real server and metrics-server do:
    ``format_quantity(0.25) == "250m"``, ``format_quantity(1234e-9) == "1234n"``,
    ``format_quantity(123456 * 1024, "BinarySI") == "123456Ki"``."""
    v = Fraction(value)
    if style == "BinarySI" and v.denominator == 1 and abs(v) >= 1024:
        n = int(v)
        for exp in (60, 50, 40, 30, 20, 10):
            if n % (2**exp) == 0:
                suffix = next(k for k, e in _BINARY_EXP.items() if e == exp)
                return f"{n >> exp}{suffix}"
        return str(n)
    # Decimal: round away from zero to nano units, then the largest exponent that divides.
    sign = -1 if v < 0 else 1
    nanos = sign * math.ceil(abs(v) * 10**9)
    if nanos == 0:
        return "0"
    exps = range(27, -1, -3)  # in nano units: 10^27 nano = 10^18 = E ... 10^0 nano = n
    for e in exps:
        if nanos % (10**e) == 0:
            mantissa, exp = nanos // (10**e), e - 9
            if style == "DecimalExponent":
                return str(mantissa) if exp == 0 else f"{mantissa}e{exp}"
            return f"{mantissa}{_DECIMAL_SUFFIX[exp]}"
    raise AssertionError("unreachable")


def canonical_quantity(value: str | int | float) -> str:
    """``value`` as the real server stores it (``"0.5"`` -> ``"500m"``, ``"1024Mi"`` ->
    ``"1Gi"``). ValueError if it does not parse."""
    return format_quantity(parse_quantity(value), _quantity_style(value))


# --------------------------------------------------------------------------------------------
# Names and labels

DNS1123_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or"
    " '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used"
    r" for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
DNS1123_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and"
    " must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex"
    " used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
LABEL_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or"
    " '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or"
    " 'my_value',  or '12345', regex used for validation is"
    " '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)
QUALIFIED_NAME_MSG = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end"
    " with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for"
    " validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
_CONFIG_KEY = re.compile(r"[-._a-zA-Z0-9]+")


def is_dns1123_label(name: str) -> bool:
    return len(name) <= 63 and _DNS1123_LABEL.fullmatch(name) is not None


def is_dns1123_subdomain(name: str) -> bool:
    return len(name) <= 253 and _DNS1123_SUBDOMAIN.fullmatch(name) is not None


def label_key_error(key: str) -> str | None:
    """Why ``key`` is not a valid label (or annotation) key, or None."""
    prefix, _, name = key.rpartition("/")
    if "/" in key and not prefix:
        return "prefix part must be non-empty"
    if prefix and not is_dns1123_subdomain(prefix):
        return "prefix part " + DNS1123_SUBDOMAIN_MSG
    if not name:
        return "name part must be non-empty"
    if len(name) > 63:
        return "name part must be no more than 63 characters"
    if _QUALIFIED_NAME.fullmatch(name) is None:
        return QUALIFIED_NAME_MSG
    return None


def label_value_error(value: str) -> str | None:
    if len(value) > 63:
        return "must be no more than 63 characters"
    if value and _QUALIFIED_NAME.fullmatch(value) is None:
        return LABEL_VALUE_MSG
    return None


# --------------------------------------------------------------------------------------------
# Selectors


class SelectorError(ValueError):
    """A label or field selector that does not parse (400 BadRequest)."""


@dataclass(frozen=True, slots=True)
class Requirement:
    """One term of a label selector: ``op`` is =, !=, in, notin, exists or !exists."""

    key: str
    op: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op in ("=", "in"):
            return present and value in self.values
        if self.op in ("!=", "notin"):
            return not present or value not in self.values
        if self.op == "exists":
            return present
        return not present  # !exists


_KEY = r"(?:[A-Za-z0-9][-A-Za-z0-9_.]*/)?[A-Za-z0-9][-A-Za-z0-9_.]*"
_VALUE = r"[-A-Za-z0-9_.]*"
_SET_TERM = re.compile(rf"({_KEY})\s+(in|notin)\s*\(([^()]*)\)")
_EQ_TERM = re.compile(rf"({_KEY})\s*(==|=|!=)\s*({_VALUE})")
_EXISTS_TERM = re.compile(rf"(!?)\s*({_KEY})")


def _split_outside_parens(text: str) -> list[str]:
    terms, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            terms.append(text[start:i])
            start = i + 1
    terms.append(text[start:])
    return terms


def parse_label_selector(text: str) -> list[Requirement]:
    """``a=b,c!=d,e in (x,y),f notin (z),g,!h`` into requirements (all must match)."""
    if not text.strip():
        return []
    reqs = []
    for raw in _split_outside_parens(text):
        term = raw.strip()
        if m := _SET_TERM.fullmatch(term):
            values = tuple(v.strip() for v in m.group(3).split(",") if v.strip())
            reqs.append(Requirement(m.group(1), m.group(2), values))
        elif m := _EQ_TERM.fullmatch(term):
            op = "=" if m.group(2) in ("=", "==") else "!="
            reqs.append(Requirement(m.group(1), op, (m.group(3),)))
        elif m := _EXISTS_TERM.fullmatch(term):
            reqs.append(Requirement(m.group(2), "!exists" if m.group(1) else "exists"))
        else:
            raise SelectorError(f"unable to parse requirement: found '{term}', expected: selector")
    for req in reqs:
        if (why := label_key_error(req.key)) is not None:
            raise SelectorError(f'unable to parse requirement: Invalid value: "{req.key}": {why}')
        for value in req.values:
            if (why := label_value_error(value)) is not None:
                raise SelectorError(f'unable to parse requirement: Invalid value: "{value}": {why}')
    return reqs


def labels_match(reqs: Iterable[Requirement], labels: Mapping[str, str] | None) -> bool:
    labels = labels or {}
    return all(r.matches(labels) for r in reqs)


def _split_unescaped(text: str, sep: str) -> list[str]:
    parts, cur, i = [], [], 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            cur.append(text[i : i + 2])
            i += 2
            continue
        if ch == sep:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
        i += 1
    parts.append("".join(cur))
    return parts


def parse_field_selector(text: str) -> list[tuple[str, str, str]]:
    """``metadata.name=x,status.phase!=Running`` into (field, op, value) triples."""
    if not text.strip():
        return []
    terms = []
    for raw in _split_unescaped(text, ","):
        term = raw.strip()
        m = re.fullmatch(r"([^=!]+?)\s*(==|!=|=)\s*(.*)", term)
        if m is None:
            raise SelectorError(f"invalid selector: '{text}'; can't understand '{term}'")
        value = re.sub(r"\\(.)", r"\1", m.group(3))
        terms.append((m.group(1), "!=" if m.group(2) == "!=" else "=", value))
    return terms


# --------------------------------------------------------------------------------------------
# Patches

# The patchMergeKey of the lists a strategic merge patch merges element-wise (any path).
_MERGE_KEYS: dict[str, tuple[str, ...]] = {
    "containers": ("name",),
    "initContainers": ("name",),
    "ephemeralContainers": ("name",),
    "env": ("name",),
    "volumes": ("name",),
    "volumeMounts": ("mountPath",),
    "imagePullSecrets": ("name",),
    "conditions": ("type",),
    "ownerReferences": ("uid",),
    "ports": ("containerPort", "port"),
    "podIPs": ("ip",),
    "hostIPs": ("ip",),
    "addresses": ("type",),
    "hostAliases": ("ip",),
}
_MERGE_PRIMITIVES = frozenset({"finalizers"})


def json_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: maps merge recursively, ``null`` deletes, everything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = json_merge_patch(result.get(key), value)
    return result


def _merge_key(element: Json, candidates: tuple[str, ...]) -> tuple[str, Any] | None:
    for key in candidates:
        if key in element:
            return key, element[key]
    return None


def _merge_list(current: list[Any], patch: list[Any], candidates: tuple[str, ...]) -> list[Any]:
    if any(isinstance(e, dict) and e.get("$patch") == "replace" for e in patch):
        return [copy.deepcopy(e) for e in patch if not (isinstance(e, dict) and "$patch" in e)]
    result = copy.deepcopy(current)
    for element in patch:
        if not isinstance(element, dict):
            result.append(copy.deepcopy(element))
            continue
        key = _merge_key(element, candidates)
        index = next(
            (
                i
                for i, e in enumerate(result)
                if key is not None and isinstance(e, dict) and e.get(key[0]) == key[1]
            ),
            None,
        )
        if element.get("$patch") == "delete":
            if index is not None:
                del result[index]
        elif index is None:
            result.append(strategic_merge_patch({}, element))
        else:
            result[index] = strategic_merge_patch(result[index], element)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """A strategic merge patch, with the well-known list merge keys applied by field name
    (``containers`` by ``name``, ``conditions`` by ``type``...) and the ``$patch``,
    ``$deleteFromPrimitiveList`` directives; other lists are replaced as in a merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys") or key.startswith("$setElementOrder/"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            result[name] = [x for x in result.get(name) or [] if x not in value]
            continue
        current = result.get(key)
        if value is None or (isinstance(value, dict) and value.get("$patch") == "delete"):
            result.pop(key, None)
        elif isinstance(value, dict):
            result[key] = strategic_merge_patch(current, value)
        elif isinstance(value, list) and key in _MERGE_PRIMITIVES:
            current = list(current or [])
            result[key] = current + [x for x in value if x not in current]
        elif isinstance(value, list) and key in _MERGE_KEYS:
            result[key] = _merge_list(list(current or []), value, _MERGE_KEYS[key])
        else:
            result[key] = copy.deepcopy(value)
    return result


class PatchError(ValueError):
    """A JSON patch that cannot be applied (422 for a failed ``test``, else 400...)."""


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _resolve(doc: Any, tokens: list[str]) -> Any:
    for token in tokens:
        if isinstance(doc, dict):
            if token not in doc:
                raise PatchError(f"path not found: {token}")
            doc = doc[token]
        elif isinstance(doc, list):
            try:
                doc = doc[int(token)]
            except (ValueError, IndexError) as e:
                raise PatchError(f"invalid index {token}") from e
        else:
            raise PatchError(f"cannot descend into {token}")
    return doc


def json_patch(doc: Any, ops: list[Json]) -> Any:
    """RFC 6902 (add, remove, replace, move, copy, test)."""
    doc = copy.deepcopy(doc)

    def add(tokens: list[str], value: Any) -> None:
        nonlocal doc
        if not tokens:
            doc = value
            return
        parent = _resolve(doc, tokens[:-1])
        last = tokens[-1]
        if isinstance(parent, dict):
            parent[last] = value
        elif isinstance(parent, list):
            if last == "-":
                parent.append(value)
            else:
                index = int(last)
                if not 0 <= index <= len(parent):
                    raise PatchError(f"index {index} out of range")
                parent.insert(index, value)
        else:
            raise PatchError("cannot add to a scalar")

    def remove(tokens: list[str]) -> Any:
        if not tokens:
            raise PatchError("cannot remove the root")
        parent = _resolve(doc, tokens[:-1])
        last = tokens[-1]
        try:
            if isinstance(parent, dict):
                return parent.pop(last)
            if isinstance(parent, list):
                return parent.pop(int(last))
        except (KeyError, ValueError, IndexError) as e:
            raise PatchError(f"unable to remove nonexistent key: {last}") from e
        raise PatchError("cannot remove from a scalar")

    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(f"invalid operation {op!r}")
        kind, tokens = op["op"], _pointer(op["path"])
        if kind == "add":
            add(tokens, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            remove(tokens)
        elif kind == "replace":
            _resolve(doc, tokens)  # must exist
            if tokens:
                remove(tokens)
            add(tokens, copy.deepcopy(op.get("value")))
        elif kind in ("move", "copy"):
            source = _pointer(op.get("from", ""))
            value = copy.deepcopy(_resolve(doc, source))
            if kind == "move":
                remove(source)
            add(tokens, value)
        elif kind == "test":
            if _resolve(doc, tokens) != op.get("value"):
                raise PatchError(f"testing value {op['path']} failed")
        else:
            raise PatchError(f"unknown operation {kind!r}")
    return doc


# --------------------------------------------------------------------------------------------
# Errors


class ApiError(Exception):
    """An error response: rendered as a ``Status`` object."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        details: Json | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message
        self.details = details
        self.headers = dict(headers or {})

    def status(self) -> Json:
        body: Json = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
        }
        if self.details is not None:
            body["details"] = self.details
        body["code"] = self.code
        return body


REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def status_error(code: int, message: str | None = None, **details: Any) -> ApiError:
    """A generic error of ``code`` with the reason the real server gives it."""
    reason = REASONS.get(code, "Unknown")
    if message is None:
        message = {
            429: "Too many requests, please try again later.",
            500: "Internal error occurred: injected fault",
            503: "the server is currently unable to handle the request",
            504: "the server was unable to return a response in the time allotted",
            410: "The resourceVersion for the provided watch is too old.",
        }.get(code, f"injected {reason}")
    return ApiError(code, reason, message, details or None)


@dataclass(frozen=True, slots=True)
class Cause:
    field: str
    reason: str  # FieldValueRequired, FieldValueInvalid, FieldValueForbidden, ...
    message: str

    @staticmethod
    def required(path: str) -> Cause:
        return Cause(path, "FieldValueRequired", "Required value")

    @staticmethod
    def invalid(path: str, value: Any, why: str) -> Cause:
        shown = json.dumps(value) if isinstance(value, str) else str(value)
        return Cause(path, "FieldValueInvalid", f"Invalid value: {shown}: {why}")

    @staticmethod
    def duplicate(path: str, value: Any) -> Cause:
        return Cause(path, "FieldValueDuplicate", f"Duplicate value: {json.dumps(value)}")

    @staticmethod
    def unsupported(path: str, value: Any, allowed: Iterable[str]) -> Cause:
        options = ", ".join(json.dumps(a) for a in allowed)
        return Cause(
            path,
            "FieldValueNotSupported",
            f"Unsupported value: {json.dumps(value)}: supported values: {options}",
        )

    @staticmethod
    def forbidden(path: str, why: str) -> Cause:
        return Cause(path, "FieldValueForbidden", f"Forbidden: {why}")


def invalid(kind: str, name: str, causes: list[Cause], group: str = "") -> ApiError:
    rendered = [f"{c.field}: {c.message}" if c.field else c.message for c in causes]
    summary = rendered[0] if len(rendered) == 1 else "[" + ", ".join(rendered) + "]"
    details: Json = {
        "name": name,
        "kind": kind,
        "causes": [{"reason": c.reason, "message": c.message, "field": c.field} for c in causes],
    }
    if group:
        details["group"] = group
    return ApiError(422, "Invalid", f'{kind} "{name}" is invalid: {summary}', details)


# --------------------------------------------------------------------------------------------
# Resources


@dataclass(frozen=True, slots=True)
class Resource:
    name: str  # plural, as in the URL
    singular: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    verbs: tuple[str, ...] = (
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch",
    )
    subresources: Mapping[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    has_status: bool = False
    categories: tuple[str, ...] = ()
    #: the API group ("" for core/v1, served under /api) and version
    group: str = ""
    version: str = "v1"

    @property
    def list_kind(self) -> str:
        return self.kind + "List"

    @property
    def qualified(self) -> str:
        """``pods`` or ``leases.coordination.k8s.io``, as the server's messages name it."""
        return f"{self.name}.{self.group}" if self.group else self.name

    def details(self, name: str) -> Json:
        """A Status's ``details`` for an object of this resource."""
        out: Json = {"name": name, "kind": self.name}
        if self.group:
            out["group"] = self.group
        return out

    @property
    def api_version(self) -> str:
        """``v1`` or ``coordination.k8s.io/v1``: what objects of it carry as ``apiVersion``."""
        return f"{self.group}/{self.version}" if self.group else self.version


_STATUS_SUB = ("", ("get", "patch", "update"))
RESOURCES: dict[str, Resource] = {
    r.name: r
    for r in (
        Resource(
            "pods",
            "pod",
            "Pod",
            True,
            ("po",),
            subresources={
                "status": ("Pod", ("get", "patch", "update")),
                "binding": ("Binding", ("create",)),
                "eviction": ("Eviction", ("create",)),
                "log": ("Pod", ("get",)),
            },
            has_status=True,
            categories=("all",),
        ),
        Resource("secrets", "secret", "Secret", True),
        Resource("configmaps", "configmap", "ConfigMap", True, ("cm",)),
        Resource(
            "services",
            "service",
            "Service",
            True,
            ("svc",),
            subresources={"status": ("Service", ("get", "patch", "update"))},
            has_status=True,
            categories=("all",),
        ),
        Resource("events", "event", "Event", True, ("ev",)),
        Resource(
            "nodes",
            "node",
            "Node",
            False,
            ("no",),
            subresources={"status": ("Node", ("get", "patch", "update"))},
            has_status=True,
        ),
        Resource(
            "namespaces",
            "namespace",
            "Namespace",
            False,
            ("ns",),
            verbs=("create", "delete", "get", "list", "patch", "update", "watch"),
            subresources={
                "status": ("Namespace", ("get", "patch", "update")),
                "finalize": ("Namespace", ("update",)),
            },
            has_status=True,
        ),
        # What leader election uses (client-go's leaderelection, the Kubernetes backend's one
        # master per job): no status, no subresources.
        Resource("leases", "lease", "Lease", True, group=COORDINATION_GROUP),
    )
}


def resource_for(group: str, version: str, name: str) -> Resource | None:
    """The resource a request's URL names, if this server serves it."""
    res = RESOURCES.get(name)
    if res is None or (res.group, res.version) != (group, version):
        return None
    return res


def _api_resource_list(group: str = "") -> Json:
    resources = []
    for res in RESOURCES.values():
        if res.group != group:
            continue
        entry: Json = {
            "name": res.name,
            "singularName": res.singular,
            "namespaced": res.namespaced,
            "kind": res.kind,
            "verbs": list(res.verbs),
        }
        if res.short_names:
            entry["shortNames"] = list(res.short_names)
        if res.categories:
            entry["categories"] = list(res.categories)
        entry["storageVersionHash"] = base64.b64encode(res.name.encode()).decode()[:11]
        resources.append(entry)
        for sub, (kind, verbs) in res.subresources.items():
            resources.append(
                {
                    "name": f"{res.name}/{sub}",
                    "singularName": "",
                    "namespaced": res.namespaced,
                    "kind": kind,
                    "verbs": list(verbs),
                }
            )
    version = f"{group}/v1" if group else "v1"
    body: Json = {"kind": "APIResourceList", "groupVersion": version, "resources": resources}
    if group:
        body["apiVersion"] = "v1"
    return body


def _metrics_resource_list() -> Json:
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{METRICS_GROUP}/{METRICS_VERSION}",
        "resources": [
            {
                "name": "nodes",
                "singularName": "",
                "namespaced": False,
                "kind": "NodeMetrics",
                "verbs": ["get", "list"],
            },
            {
                "name": "pods",
                "singularName": "",
                "namespaced": True,
                "kind": "PodMetrics",
                "verbs": ["get", "list"],
            },
        ],
    }


# --------------------------------------------------------------------------------------------
# Defaulting and validation


def _labels_causes(meta: Json, path: str = "metadata") -> list[Cause]:
    causes: list[Cause] = []
    labels = meta.get("labels")
    if labels is not None and not isinstance(labels, dict):
        return [Cause.invalid(f"{path}.labels", str(labels), "must be a map")]
    for key, value in (labels or {}).items():
        if (why := label_key_error(key)) is not None:
            causes.append(Cause.invalid(f"{path}.labels", key, why))
        if not isinstance(value, str):
            causes.append(Cause.invalid(f"{path}.labels", str(value), "must be a string"))
        elif (why := label_value_error(value)) is not None:
            causes.append(Cause.invalid(f"{path}.labels", value, why))
    for key, value in (meta.get("annotations") or {}).items():
        if (why := label_key_error(key.lower())) is not None:
            causes.append(Cause.invalid(f"{path}.annotations", key, why))
        if not isinstance(value, str):
            causes.append(Cause.invalid(f"{path}.annotations", str(value), "must be a string"))
    return causes


def _name_causes(res: Resource, meta: Json) -> list[Cause]:
    name = meta.get("name")
    if not name:
        return [_name_required()]
    if res.name in ("namespaces",):
        if not is_dns1123_label(name):
            return [Cause.invalid("metadata.name", name, DNS1123_LABEL_MSG)]
    elif res.name != "events" and not is_dns1123_subdomain(name):
        return [Cause.invalid("metadata.name", name, DNS1123_SUBDOMAIN_MSG)]
    return []


def _name_required() -> Cause:
    return Cause(
        "metadata.name", "FieldValueRequired", "Required value: name or generateName is required"
    )


def _decode_quantities(obj: Json) -> None:
    """Canonicalize every container's resource quantities in place; a quantity that does not
    parse fails the whole request with 400, as it fails JSON decoding on the real server."""
    spec = obj.get("spec") or {}
    for key in ("containers", "initContainers"):
        for container in spec.get(key) or []:
            if not isinstance(container, dict):
                continue
            resources = container.get("resources") or {}
            for kind in ("limits", "requests"):
                values = resources.get(kind)
                if not isinstance(values, dict):
                    continue
                for name, value in list(values.items()):
                    try:
                        values[name] = canonical_quantity(value)
                    except (ValueError, TypeError, ZeroDivisionError) as e:
                        raise ApiError(
                            400,
                            "BadRequest",
                            f'{obj.get("kind", "Pod")} in version "v1" cannot be handled as a'
                            f" {obj.get('kind', 'Pod')}: {QUANTITY_ERROR}",
                        ) from e


#: metav1.MicroTime's wire format (Go's ``RFC3339Micro``): exactly six fraction digits.
MICRO_TIME_LAYOUT = "2006-01-02T15:04:05.000000Z07:00"
_MICRO_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}(?:Z|[+-]\d{2}:\d{2})")
#: LeaseSpec's fields and their Go types (coordination.k8s.io/v1).
_LEASE_FIELDS = {
    "holderIdentity": "string",
    "leaseDurationSeconds": "int32",
    "acquireTime": "MicroTime",
    "renewTime": "MicroTime",
    "leaseTransitions": "int32",
}


def _go_type_name(value: Any) -> str:
    """How Go's encoding/json names a JSON value it cannot put in a field."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number" if isinstance(value, int) or value.is_integer() else f"number {value}"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def micro_time(text: str) -> str:
    """A MicroTime as the real server decodes and re-encodes it: RFC 3339 with exactly six
    fraction digits on the way in (anything else fails JSON decoding), UTC with ``Z`` out.
    ValueError with Go's message otherwise."""
    if not _MICRO_TIME.fullmatch(text):
        rest = text[19:] if len(text) >= 19 else text
        raise ValueError(
            f'parsing time "{text}" as "{MICRO_TIME_LAYOUT}": cannot parse "{rest}" as ".000000"'
        )
    moment = datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _decode_lease(lease: Json) -> None:
    """Decode a Lease's spec in place as the API server's JSON decoder does: a field of the
    wrong JSON type, an int32 out of range or a MicroTime not in ``RFC3339Micro`` fails the
    request with 400 (before any validation); MicroTimes are re-encoded in UTC."""
    spec = lease.get("spec")
    if spec is None:
        return
    error = None
    if not isinstance(spec, dict):
        error = f"json: cannot unmarshal {_go_type_name(spec)} into Go struct field Lease.spec"
    else:
        for name, kind in _LEASE_FIELDS.items():
            value = spec.get(name)
            if value is None:
                spec.pop(name, None)  # null is the zero value: omitted, as Go's omitempty
                continue
            where = f"Go struct field LeaseSpec.spec.{name} of type"
            if kind == "string" and not isinstance(value, str):
                error = f"json: cannot unmarshal {_go_type_name(value)} into {where} string"
            elif kind == "int32" and (
                isinstance(value, bool)
                or not isinstance(value, int)
                or not -(2**31) <= value < 2**31
            ):
                error = f"json: cannot unmarshal {_go_type_name(value)} into {where} int32"
            elif kind == "MicroTime":
                if not isinstance(value, str):
                    error = (
                        f"json: cannot unmarshal {_go_type_name(value)} into Go value of type"
                        " string"
                    )
                else:
                    try:
                        spec[name] = micro_time(value)
                    except ValueError as e:
                        error = str(e)
            if error:
                break
    if error:
        raise ApiError(
            400,
            "BadRequest",
            f'Lease in version "v1" cannot be handled as a Lease: {error}',
        )


def _lease_causes(lease: Json) -> list[Cause]:
    """ValidateLeaseSpec's rules for the fields above."""
    spec = lease.get("spec") or {}
    causes = []
    duration = spec.get("leaseDurationSeconds")
    if duration is not None and duration <= 0:
        causes.append(
            Cause.invalid("spec.leaseDurationSeconds", duration, "must be greater than 0")
        )
    transitions = spec.get("leaseTransitions")
    if transitions is not None and transitions < 0:
        causes.append(
            Cause.invalid(
                "spec.leaseTransitions", transitions, "must be greater than or equal to 0"
            )
        )
    return causes


def _default_pod(pod: Json) -> None:
    spec = pod.setdefault("spec", {})
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("priority", 0)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    for key in ("containers", "initContainers"):
        for container in spec.get(key) or []:
            if not isinstance(container, dict):
                continue
            image = container.get("image") or ""
            tag = image.rsplit("/", 1)[-1]
            latest = "@" not in tag and (":" not in tag or tag.endswith(":latest"))
            container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
            container.setdefault("terminationMessagePath", "/dev/termination-log")
            container.setdefault("terminationMessagePolicy", "File")
            resources = container.setdefault("resources", {})
            limits = resources.get("limits") or {}
            if limits:
                requests = resources.setdefault("requests", {})
                for name, value in limits.items():
                    requests.setdefault(name, value)
            for port in container.get("ports") or []:
                if isinstance(port, dict):
                    port.setdefault("protocol", "TCP")
    # The DefaultTolerationSeconds admission plugin.
    tolerations = spec.setdefault("tolerations", [])
    for taint in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        if not any(isinstance(t, dict) and t.get("key") == taint for t in tolerations):
            tolerations.append(
                {
                    "key": taint,
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                }
            )


def qos_class(pod: Json) -> str:
    """Guaranteed (every container: cpu and memory limits, requests equal to them),
    BestEffort (no container requests or limits cpu or memory), else Burstable."""
    containers = (pod.get("spec") or {}).get("containers") or []
    any_set, guaranteed = False, bool(containers)
    for container in containers:
        resources = container.get("resources") or {}
        limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
        for name in ("cpu", "memory"):
            if name in limits or name in requests:
                any_set = True
            if name not in limits or (
                name in requests and parse_quantity(requests[name]) != parse_quantity(limits[name])
            ):
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def _validate_container(container: Any, path: str, names: set[str]) -> list[Cause]:
    if not isinstance(container, dict):
        return [Cause.invalid(path, str(container), "must be an object")]
    causes: list[Cause] = []
    name = container.get("name")
    if not name:
        causes.append(Cause.required(f"{path}.name"))
    elif not is_dns1123_label(name):
        causes.append(Cause.invalid(f"{path}.name", name, DNS1123_LABEL_MSG))
    elif name in names:
        causes.append(Cause.duplicate(f"{path}.name", name))
    else:
        names.add(name)
    if not container.get("image"):
        causes.append(Cause.required(f"{path}.image"))
    resources = container.get("resources") or {}
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    for kind, values in (("limits", limits), ("requests", requests)):
        for rname, value in values.items():
            if parse_quantity(value) < 0:
                causes.append(
                    Cause.invalid(
                        f"{path}.resources.{kind}[{rname}]",
                        value,
                        "must be greater than or equal to 0",
                    )
                )
    for rname, value in requests.items():
        if rname in limits and parse_quantity(value) > parse_quantity(limits[rname]):
            causes.append(
                Cause.invalid(
                    f"{path}.resources.requests",
                    value,
                    f"must be less than or equal to {rname} limit of {limits[rname]}",
                )
            )
    for i, env in enumerate(container.get("env") or []):
        env_name = env.get("name") if isinstance(env, dict) else None
        if not env_name:
            causes.append(Cause.required(f"{path}.env[{i}].name"))
        elif _ENV_NAME.fullmatch(env_name) is None:
            causes.append(
                Cause.invalid(
                    f"{path}.env[{i}].name",
                    env_name,
                    "a valid environment variable name must consist of alphabetic characters,"
                    " digits, '_', '-', or '.', and must not start with a digit",
                )
            )
    for i, port in enumerate(container.get("ports") or []):
        number = port.get("containerPort") if isinstance(port, dict) else None
        if not isinstance(number, int) or not 0 < number < 65536:
            causes.append(
                Cause.invalid(
                    f"{path}.ports[{i}].containerPort",
                    number,
                    "must be between 1 and 65535, inclusive",
                )
            )
    return causes


def _validate_pod(pod: Json) -> list[Cause]:
    spec = pod.get("spec") or {}
    causes: list[Cause] = []
    containers = spec.get("containers")
    if not containers:
        causes.append(Cause.required("spec.containers"))
    names: set[str] = set()
    for i, container in enumerate(containers or []):
        causes.extend(_validate_container(container, f"spec.containers[{i}]", names))
    for i, container in enumerate(spec.get("initContainers") or []):
        causes.extend(_validate_container(container, f"spec.initContainers[{i}]", names))
    policy = spec.get("restartPolicy")
    if policy not in ("Always", "OnFailure", "Never"):
        causes.append(
            Cause.unsupported("spec.restartPolicy", policy, ("Always", "OnFailure", "Never"))
        )
    grace = spec.get("terminationGracePeriodSeconds")
    if not isinstance(grace, int) or grace < 0:
        causes.append(
            Cause.invalid(
                "spec.terminationGracePeriodSeconds", grace, "must be greater than or equal to 0"
            )
        )
    deadline = spec.get("activeDeadlineSeconds")
    if deadline is not None and (not isinstance(deadline, int) or deadline <= 0):
        causes.append(
            Cause.invalid("spec.activeDeadlineSeconds", deadline, "must be greater than 0")
        )
    return causes


POD_UPDATE_FORBIDDEN = (
    "pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only"
    " additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be"
    " set to 1 if it was previously negative)"
)


def _diff_paths(a: Any, b: Any, path: str, out: list[str]) -> None:
    if len(out) >= 5 or a == b:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            _diff_paths(a.get(key), b.get(key), f"{path}.{key}", out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _diff_paths(x, y, f"{path}[{i}]", out)
    else:
        out.append(f"{path}: {json.dumps(a)} -> {json.dumps(b)}")


def _pod_update_causes(old: Json, new: Json) -> list[Cause]:
    old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
    causes = []
    allowed = copy.deepcopy(new_spec)
    for key in ("containers", "initContainers"):
        olds, news = old_spec.get(key) or [], allowed.get(key) or []
        if len(olds) == len(news):
            for o, n in zip(olds, news, strict=True):
                if isinstance(o, dict) and isinstance(n, dict):
                    if not n.get("image"):
                        causes.append(Cause.required(f"spec.{key}[*].image"))
                    n["image"] = o.get("image")
    old_deadline = old_spec.get("activeDeadlineSeconds")
    new_deadline = allowed.get("activeDeadlineSeconds")
    if new_deadline != old_deadline and (
        old_deadline is None or (isinstance(new_deadline, int) and 0 < new_deadline <= old_deadline)
    ):
        allowed["activeDeadlineSeconds"] = old_deadline
        if old_deadline is None:
            allowed.pop("activeDeadlineSeconds", None)
    old_tol, new_tol = old_spec.get("tolerations") or [], allowed.get("tolerations") or []
    if all(t in new_tol for t in old_tol):
        allowed["tolerations"] = copy.deepcopy(old_spec.get("tolerations"))
        if "tolerations" not in old_spec:
            allowed.pop("tolerations", None)
    if allowed != old_spec:
        diff: list[str] = []
        _diff_paths(old_spec, allowed, "spec", diff)
        causes.append(
            Cause.forbidden("spec", POD_UPDATE_FORBIDDEN + "\n  changed: " + "; ".join(diff))
        )
    return causes


# --------------------------------------------------------------------------------------------
# Field selectors


def _dig(obj: Json, dotted: str) -> Any:
    cur: Any = obj
    for part in dotted.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


_FIELDS: dict[str, frozenset[str]] = {
    "pods": frozenset(
        {
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        }
    ),
    "events": frozenset(
        {
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        }
    ),
    "secrets": frozenset({"type"}),
    "nodes": frozenset({"spec.unschedulable"}),
    "namespaces": frozenset({"status.phase"}),
}


def check_fields(resource: str, terms: list[tuple[str, str, str]]) -> None:
    """SelectorError (400) for a field the resource cannot be selected by."""
    for name, _, _ in terms:
        if name not in ("metadata.name", "metadata.namespace") and name not in _FIELDS.get(
            resource, frozenset()
        ):
            raise SelectorError(f"field label not supported: {name}")


def field_value(resource: str, obj: Json, name: str) -> str:
    if name == "source":
        value = _dig(obj, "source.component")
    elif name in {"spec.hostNetwork", "spec.unschedulable"}:
        value = "true" if _dig(obj, name) else "false"
    else:
        value = _dig(obj, name)
    return "" if value is None else str(value)


def fields_match(resource: str, terms: list[tuple[str, str, str]], obj: Json) -> bool:
    for name, op, value in terms:
        actual = field_value(resource, obj, name)
        if (actual == value) != (op == "="):
            return False
    return True


# --------------------------------------------------------------------------------------------
# Tables (server-side printing for kubectl)


def _col(name: str, description: str = "", priority: int = 0, fmt: str = "") -> Json:
    return {
        "name": name,
        "type": "string",
        "format": fmt,
        "description": description,
        "priority": priority,
    }


def pod_display_status(pod: Json) -> tuple[str, int, int, int]:
    """(STATUS column, ready containers, total containers, restarts), as kubectl prints."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    total = len(spec.get("containers") or [])
    reason = status.get("reason") or status.get("phase") or "Unknown"
    ready = restarts = 0
    running = False
    for cs in reversed(status.get("containerStatuses") or []):
        restarts += int(cs.get("restartCount") or 0)
        state = cs.get("state") or {}
        waiting, terminated = state.get("waiting"), state.get("terminated")
        if waiting and waiting.get("reason"):
            reason = waiting["reason"]
        elif terminated and terminated.get("reason"):
            reason = terminated["reason"]
        elif terminated:
            code = terminated.get("exitCode", 0)
            signal = terminated.get("signal")
            reason = f"Signal:{signal}" if signal else f"ExitCode:{code}"
        elif cs.get("ready") and state.get("running"):
            running = True
            ready += 1
    if reason == "Completed" and running:
        reason = "Running"
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        reason = "Unknown" if status.get("reason") == "NodeLost" else "Terminating"
    return reason, ready, total, restarts


def _age(obj: Json, now: float) -> str:
    created = (obj.get("metadata") or {}).get("creationTimestamp")
    return human_duration(now - parse_rfc3339(created)) if created else "<unknown>"


def _table_columns(resource: str) -> list[Json]:
    name = _col("Name", "Name must be unique within a namespace.", fmt="name")
    age = _col(
        "Age",
        "CreationTimestamp is a timestamp representing the server time when this"
        " object was created.",
    )
    if resource == "pods":
        return [
            name,
            _col("Ready", "The aggregate readiness state of this pod for accepting traffic."),
            _col("Status", "The aggregate status of the containers in this pod."),
            _col(
                "Restarts",
                "The number of times the containers in this pod have been"
                " restarted and when the last container in this pod has restarted.",
            ),
            age,
            _col("IP", "IP address allocated to the pod.", 1),
            _col("Node", "Name of the node the pod is assigned to.", 1),
            _col("Nominated Node", "Name of the node where the pod is nominated.", 1),
            _col("Readiness Gates", "Pod readiness gates.", 1),
        ]
    if resource == "services":
        return [
            name,
            _col("Type"),
            _col("Cluster-IP"),
            _col("External-IP"),
            _col("Port(s)"),
            age,
            _col("Selector", priority=1),
        ]
    if resource == "nodes":
        return [
            name,
            _col("Status"),
            _col("Roles"),
            age,
            _col("Version"),
            _col("Internal-IP", priority=1),
            _col("External-IP", priority=1),
            _col("OS-Image", priority=1),
            _col("Kernel-Version", priority=1),
            _col("Container-Runtime", priority=1),
        ]
    if resource == "namespaces":
        return [name, _col("Status"), age]
    if resource == "secrets":
        return [name, _col("Type"), _col("Data"), age]
    if resource == "configmaps":
        return [name, _col("Data"), age]
    if resource == "events":
        return [
            _col("Last Seen"),
            _col("Type"),
            _col("Reason"),
            _col("Object"),
            _col("Message"),
            _col("Subobject", priority=1),
            _col("Source", priority=1),
            _col("First Seen", priority=1),
            _col("Count", priority=1),
            _col("Name", priority=1, fmt="name"),
        ]
    return [name, age]


def _table_cells(resource: str, obj: Json, now: float) -> list[Any]:
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    name = meta.get("name", "")
    if resource == "pods":
        shown, ready, total, restarts = pod_display_status(obj)
        gates = spec.get("readinessGates") or []
        return [
            name,
            f"{ready}/{total}",
            shown,
            str(restarts),
            _age(obj, now),
            status.get("podIP") or "<none>",
            spec.get("nodeName") or "<none>",
            status.get("nominatedNodeName") or "<none>",
            f"0/{len(gates)}" if gates else "<none>",
        ]
    if resource == "services":
        ports = ",".join(
            f"{p.get('port')}/{p.get('protocol', 'TCP')}" for p in spec.get("ports") or []
        )
        selector = ",".join(f"{k}={v}" for k, v in (spec.get("selector") or {}).items())
        return [
            name,
            spec.get("type", "ClusterIP"),
            spec.get("clusterIP") or "<none>",
            "<none>",
            ports or "<none>",
            _age(obj, now),
            selector or "<none>",
        ]
    if resource == "nodes":
        ready_status = next(
            (c.get("status") for c in status.get("conditions") or [] if c.get("type") == "Ready"),
            "Unknown",
        )
        shown = {"True": "Ready", "False": "NotReady"}.get(ready_status or "", "NotReady")
        if spec.get("unschedulable"):
            shown += ",SchedulingDisabled"
        info = status.get("nodeInfo") or {}
        ip = next(
            (
                a.get("address")
                for a in status.get("addresses") or []
                if a.get("type") == "InternalIP"
            ),
            "<none>",
        )
        return [
            name,
            shown,
            "<none>",
            _age(obj, now),
            info.get("kubeletVersion", ""),
            ip,
            "<none>",
            info.get("osImage", ""),
            info.get("kernelVersion", ""),
            info.get("containerRuntimeVersion", ""),
        ]
    if resource == "namespaces":
        return [name, status.get("phase", "Active"), _age(obj, now)]
    if resource == "secrets":
        return [name, obj.get("type", "Opaque"), len(obj.get("data") or {}), _age(obj, now)]
    if resource == "configmaps":
        return [name, len(obj.get("data") or {}) + len(obj.get("binaryData") or {}), _age(obj, now)]
    if resource == "events":
        involved = obj.get("involvedObject") or {}
        last = obj.get("lastTimestamp") or obj.get("eventTime") or meta.get("creationTimestamp")
        first = obj.get("firstTimestamp") or last
        return [
            human_duration(now - parse_rfc3339(last)) if last else "<unknown>",
            obj.get("type", ""),
            obj.get("reason", ""),
            f"{str(involved.get('kind', '')).lower()}/{involved.get('name', '')}",
            obj.get("message", ""),
            involved.get("fieldPath", ""),
            (obj.get("source") or {}).get("component", ""),
            human_duration(now - parse_rfc3339(first)) if first else "<unknown>",
            obj.get("count", 1),
            name,
        ]
    return [name, _age(obj, now)]


def make_table(resource: str, objs: list[Json], include: str, list_meta: Json) -> Json:
    now = time.time()
    rows = []
    for obj in objs:
        row: Json = {"cells": _table_cells(resource, obj, now)}
        if include == "Object":
            row["object"] = obj
        elif include != "None":
            row["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj.get("metadata") or {},
            }
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta,
        "columnDefinitions": _table_columns(resource),
        "rows": rows,
    }


# --------------------------------------------------------------------------------------------
# Audit and faults


@dataclass(frozen=True, slots=True)
class ApiCall:
    """One request, as an audit log records it. ``verb`` is the RBAC verb (get, list, watch,
    create, update, patch, delete, deletecollection); ``resource`` is empty for non-resource
    paths (discovery, /version), whose ``verb`` is the lower-cased HTTP method. ``code`` is the
    HTTP status sent, 0 when the connection was reset without a response."""

    verb: str
    api_group: str
    api_version: str
    resource: str
    subresource: str
    namespace: str
    name: str
    user_agent: str
    code: int
    from_kubelet: bool
    method: str
    path: str
    at: float

    @property
    def rbac_resource(self) -> str:
        """``pods`` or ``pods/status``: what a Role's ``resources`` names."""
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


@dataclass(slots=True)
class _RequestInfo:
    method: str
    path: str
    query: dict[str, str]
    verb: str = ""
    group: str = ""
    version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    is_resource: bool = False
    watch: bool = False


@dataclass(slots=True)
class _Fault:
    kind: str  # fail, reset, slow
    code: int = 500
    remaining: int | None = None  # None: until ``until``
    until: float = math.inf
    delay_s: float = 0.0
    retry_after: int | None = None
    message: str | None = None
    verb: str | None = None
    resource: str | None = None

    def applies(self, info: _RequestInfo) -> bool:
        if self.verb is not None and info.verb != self.verb:
            return False
        if self.resource is not None:
            target = f"{info.resource}/{info.subresource}" if info.subresource else info.resource
            if self.resource != target:
                return False
        return True


# --------------------------------------------------------------------------------------------
# Watches


@dataclass(slots=True)
class _Event:
    rv: int
    type: str  # ADDED, MODIFIED, DELETED
    resource: str
    namespace: str
    obj: Json  # never mutated after commit
    old: Json | None


class _Watcher:
    _CLOSE = b""

    def __init__(
        self,
        resource: str,
        namespace: str,
        labels: list[Requirement],
        fields: list[tuple[str, str, str]],
        from_kubelet: bool,
    ) -> None:
        self.resource, self.namespace = resource, namespace
        self.labels, self.fields = labels, fields
        self.from_kubelet = from_kubelet
        self.bookmarks = False
        self.queue: queue.SimpleQueue[bytes] = queue.SimpleQueue()

    def matches(self, obj: Json) -> bool:
        meta = obj.get("metadata") or {}
        if self.namespace and meta.get("namespace", "") != self.namespace:
            return False
        return labels_match(self.labels, meta.get("labels")) and fields_match(
            self.resource, self.fields, obj
        )

    def offer(self, event: _Event) -> None:
        if event.resource != self.resource:
            return
        now = self.matches(event.obj)
        before = event.old is not None and event.type == "MODIFIED" and self.matches(event.old)
        if event.type == "MODIFIED":
            if now and before:
                kind = "MODIFIED"
            elif now:
                kind = "ADDED"  # started matching the selector
            elif before:
                kind = "DELETED"  # stopped matching it
            else:
                return
        elif not now:
            return
        else:
            kind = event.type
        self.send(kind, event.obj)

    def send(self, kind: str, obj: Json) -> None:
        line = json.dumps({"type": kind, "object": obj}, separators=(",", ":")) + "\n"
        self.queue.put(line.encode())

    def close(self) -> None:
        self.queue.put(self._CLOSE)


# --------------------------------------------------------------------------------------------
# The server


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256

    def __init__(self, api: FakeApiServer) -> None:
        self.api = api
        self.open_sockets: set[socket.socket] = set()
        self.sockets_lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.sockets_lock:
            self.open_sockets.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.sockets_lock:
            self.open_sockets.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away (or a connection closed by :meth:`FakeApiServer.close`)
        is normal; anything else is a bug in the fake and is printed."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class FakeApiServer:
    """A Kubernetes API server on ``127.0.0.1`` (see the module docstring).

    ``token`` / ``require_token``: when a token is set (or ``require_token`` makes one up),
    every request must carry ``Authorization: Bearer <token>``, else 401 Unauthorized. Note
    that kubectl (client-go) never sends credentials to a plain-http server, so kubectl only
    works against a server that requires none; the official Python client does send them.
    ``node_name``: the Ready node registered at start (None: no node).
    ``history_limit``: how many events are kept for watches to resume from; older ones are
    compacted away (a watch from before them gets 410 Expired).
    ``user``: the user name 403 messages name.
    """

    def __init__(
        self,
        *,
        token: str | None = None,
        require_token: bool = False,
        history_limit: int = 20000,
        user: str = "system:serviceaccount:default:default",
        node_name: str | None = DEFAULT_NODE,
    ) -> None:
        if token is None and require_token:
            token = "fake-" + uuid.uuid4().hex
        #: The bearer token every request must carry, or None for no authentication.
        self.token = token
        self.user = user
        #: Whether the kubelet's requests (header ``X-Fake-Kubelet``) skip injected faults.
        self.faults_exempt_kubelet = True
        #: Whether a kubelet runs pods; makes deleting a bound, running pod graceful.
        self.kubelet_attached = False
        #: When False, ``metrics.k8s.io`` is absent: 404 on its paths, not in ``/apis``.
        self.serve_metrics = True
        #: Seconds between BOOKMARK events on watches that allow them.
        self.bookmark_interval_s = 5.0
        #: ``(namespace, pod) -> log text`` for ``pods/log`` (set by the fake kubelet).
        self.log_provider: Callable[[str, str], str | None] | None = None
        self._lock = threading.RLock()
        self._store: dict[str, dict[tuple[str, str], Json]] = {r: {} for r in RESOURCES}
        self._rv = 0
        self._history: deque[_Event] = deque()
        self._history_limit = history_limit
        self._compacted_rv = 0
        self._watchers: set[_Watcher] = set()
        self._faults: list[_Fault] = []
        self._forbidden: set[tuple[str, str]] = set()  # (verb, resource[/sub])
        self._rules: list[Json] | None = None
        self._calls: list[ApiCall] = []
        self._calls_lock = threading.Lock()
        self._metrics: dict[tuple[str, str], tuple[float, int, float, float]] = {}
        self._service_ips = 0
        self._gc_queue: queue.SimpleQueue[tuple[str, str, str, str] | None] = queue.SimpleQueue()
        self._gc_pending: list[tuple[str, str, str]] = []
        self._closed = False
        for ns in ("default", "kube-system", "kube-public"):
            self._create_internal(
                "namespaces",
                {"metadata": {"name": ns}},
                "",
            )
        if node_name:
            self.add_node(node_name)
        self._http = _HttpServer(self)
        self.port: int = self._http.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._serve_thread = threading.Thread(
            target=self._http.serve_forever,
            kwargs={"poll_interval": 0.05},
            daemon=True,
            name="fake-apiserver",
        )
        self._serve_thread.start()
        self._gc_thread = threading.Thread(target=self._gc_loop, daemon=True, name="fake-gc")
        self._gc_thread.start()

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop serving: open watches end, open connections are closed. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            watchers, self._watchers = list(self._watchers), set()
        for watcher in watchers:
            watcher.close()
        self._gc_queue.put(None)
        self._http.shutdown()
        with self._http.sockets_lock:
            sockets = list(self._http.open_sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._http.server_close()
        self._gc_thread.join(timeout=5)

    @property
    def closed(self) -> bool:
        return self._closed

    def write_kubeconfig(
        self,
        path: str | os.PathLike[str],
        namespace: str = "default",
        token: str | None = None,
    ) -> Path:
        """A kubeconfig for this server that the official client and kubectl accept. The
        bearer token is ``token``, else the server's own, else the fixed ``fake-token``
        (accepted when the server requires none). JSON, which is valid YAML."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "contexts": [
                {
                    "name": "fake",
                    "context": {"cluster": "fake", "user": "fake", "namespace": namespace},
                }
            ],
            "current-context": "fake",
            "users": [{"name": "fake", "user": {"token": token or self.token or "fake-token"}}],
            "preferences": {},
        }
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(config, indent=2))
        return out

    # -- test controls: faults ---------------------------------------------------------------

    def fail(
        self,
        count: int = 1,
        code: int = 500,
        *,
        verb: str | None = None,
        resource: str | None = None,
        message: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        """The next ``count`` API requests (optionally only of ``verb`` on ``resource``, e.g.
        ``"create"``, ``"pods"`` or ``"pods/status"``) get a ``code`` Status."""
        with self._lock:
            self._faults.append(
                _Fault(
                    "fail",
                    code,
                    remaining=count,
                    verb=verb,
                    resource=resource,
                    message=message,
                    retry_after=retry_after,
                )
            )

    def storm(
        self,
        seconds: float,
        code: int = 500,
        *,
        verb: str | None = None,
        resource: str | None = None,
    ) -> None:
        """Every API request fails with ``code`` for ``seconds``."""
        with self._lock:
            self._faults.append(
                _Fault("fail", code, until=time.monotonic() + seconds, verb=verb, resource=resource)
            )

    def throttle(self, seconds: float, retry_after: int = 1) -> None:
        """429 TooManyRequests with ``Retry-After: retry_after`` for ``seconds``."""
        with self._lock:
            self._faults.append(
                _Fault("fail", 429, until=time.monotonic() + seconds, retry_after=retry_after)
            )

    def slow(self, delay_s: float, duration_s: float) -> None:
        """Delay every API request by ``delay_s`` for the next ``duration_s`` seconds."""
        with self._lock:
            self._faults.append(
                _Fault("slow", until=time.monotonic() + duration_s, delay_s=delay_s)
            )

    def reset_connections(
        self, count: int = 1, *, verb: str | None = None, resource: str | None = None
    ) -> None:
        """Close the connection of the next ``count`` API requests without any response.
        (urllib3, under the official client, retries an idempotent request up to 3 times on
        its own: a single reset of a GET goes unnoticed; one of a POST raises.)"""
        with self._lock:
            self._faults.append(_Fault("reset", remaining=count, verb=verb, resource=resource))

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def forbid(self, verb: str, resource: str) -> None:
        """Answer 403 Forbidden to ``verb`` on ``resource`` (``"pods"``, ``"pods/status"``)."""
        with self._lock:
            self._forbidden.add((verb, resource))

    def allow(self, verb: str, resource: str) -> None:
        with self._lock:
            self._forbidden.discard((verb, resource))

    def restrict(self, rules: list[Json] | None) -> None:
        """Authorize like a Role with these ``rules`` (``apiGroups``, ``resources``,
        ``verbs``, optional ``resourceNames``; ``"*"`` wildcards): anything else is 403.
        Discovery and ``/version`` stay open; ``None`` lifts the restriction."""
        with self._lock:
            self._rules = copy.deepcopy(rules)

    # -- test controls: watches --------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        with self._lock:
            return self._rv

    def compact(self) -> None:
        """Drop the event history, as etcd compaction does: a watch from an older
        resourceVersion gets an immediate ERROR 410 Expired event, then the stream ends."""
        with self._lock:
            self._history.clear()
            self._compacted_rv = self._rv

    def expire_watches(self) -> int:
        """Send ERROR 410 Expired to every open watch and end it. Returns how many."""
        with self._lock:
            watchers, self._watchers = list(self._watchers), set()
        status = status_error(410).status()
        for watcher in watchers:
            watcher.send("ERROR", status)
            watcher.close()
        return len(watchers)

    def send_bookmarks(self) -> None:
        """A BOOKMARK now on every open watch that allows them."""
        with self._lock:
            watchers = list(self._watchers)
        for watcher in watchers:
            if watcher.bookmarks:
                watcher.send("BOOKMARK", self._bookmark(watcher.resource))

    @property
    def open_watches(self) -> int:
        with self._lock:
            return len(self._watchers)

    # -- test controls: audit ----------------------------------------------------------------

    @property
    def calls(self) -> list[ApiCall]:
        """Every request so far, in order (a copy)."""
        with self._calls_lock:
            return list(self._calls)

    def client_calls(self) -> list[ApiCall]:
        """The requests not made by the fake kubelet."""
        return [c for c in self.calls if not c.from_kubelet]

    def rbac_verbs(self, *, include_kubelet: bool = False) -> set[tuple[str, str, str]]:
        """``(api_group, resource[/subresource], verb)`` of every resource request made."""
        return {
            (c.api_group, c.rbac_resource, c.verb)
            for c in self.calls
            if c.resource and (include_kubelet or not c.from_kubelet)
        }

    def clear_calls(self) -> None:
        with self._calls_lock:
            self._calls.clear()

    def _record(self, call: ApiCall) -> None:
        with self._calls_lock:
            self._calls.append(call)

    # -- test controls: metrics and objects --------------------------------------------------

    def set_pod_metrics(
        self,
        namespace: str,
        name: str,
        cpu_cores: float,
        memory_bytes: int,
        *,
        window_s: float = 0.5,
    ) -> None:
        """The usage metrics-server reports for pod ``name`` from now on."""
        with self._lock:
            self._metrics[(namespace, name)] = (
                float(cpu_cores),
                int(memory_bytes),
                time.time(),
                window_s,
            )

    def clear_pod_metrics(self, namespace: str, name: str) -> None:
        with self._lock:
            self._metrics.pop((namespace, name), None)

    def get_object(self, resource: str, namespace: str, name: str) -> Json | None:
        """A copy of a stored object (no HTTP, not audited), or None."""
        with self._lock:
            obj = self._store[resource].get((namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def list_objects(self, resource: str, namespace: str | None = None) -> list[Json]:
        with self._lock:
            return [
                copy.deepcopy(o)
                for (ns, _), o in sorted(self._store[resource].items())
                if namespace is None or ns == namespace
            ]

    def create_object(self, resource: str, obj: Json, namespace: str = "") -> Json:
        """Create an object in-process, with the same defaulting and validation (raises
        :class:`ApiError`)."""
        return self._create_internal(resource, copy.deepcopy(obj), namespace)

    def add_node(
        self, name: str, cpu: float | None = None, memory_bytes: int | None = None
    ) -> Json:
        """Register a Ready node (the default ``fake-node-0`` is registered at start)."""
        cpu = float(os.cpu_count() or 1) if cpu is None else cpu
        if memory_bytes is None:
            try:
                memory_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            except (ValueError, OSError, AttributeError):
                memory_bytes = 8 << 30
        now = rfc3339()
        capacity = {
            "cpu": format_quantity(Fraction(cpu).limit_denominator(1000)),
            "memory": format_quantity(memory_bytes // 1024 * 1024, "BinarySI"),
            "pods": "110",
            "ephemeral-storage": "64Gi",
        }
        node = {
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "beta.kubernetes.io/os": "linux",
                    "beta.kubernetes.io/arch": "amd64",
                },
            },
            "spec": {"podCIDR": "10.244.0.0/24", "podCIDRs": ["10.244.0.0/24"]},
            "status": {
                "capacity": capacity,
                "allocatable": dict(capacity),
                "conditions": [
                    _node_condition("MemoryPressure", "False", "KubeletHasSufficientMemory", now),
                    _node_condition("DiskPressure", "False", "KubeletHasNoDiskPressure", now),
                    _node_condition("PIDPressure", "False", "KubeletHasSufficientPID", now),
                    _node_condition("Ready", "True", "KubeletReady", now),
                ],
                "addresses": [
                    {"type": "InternalIP", "address": "127.0.0.1"},
                    {"type": "Hostname", "address": name},
                ],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                "nodeInfo": {
                    "machineID": "",
                    "systemUUID": "",
                    "bootID": "",
                    "kernelVersion": platform.release(),
                    "osImage": "fake-kubelet",
                    "containerRuntimeVersion": "fake://1.0.0",
                    "kubeletVersion": "v1.32.0",
                    "kubeProxyVersion": "",
                    "operatingSystem": "linux",
                    "architecture": "amd64",
                },
            },
        }
        with self._lock:
            if (("", name)) in self._store["nodes"]:
                return copy.deepcopy(self._store["nodes"][("", name)])
            return self._create_internal("nodes", node, "")

    # -- store -------------------------------------------------------------------------------

    def _commit(
        self, resource: str, key: tuple[str, str], obj: Json | None, kind: str, old: Json | None
    ) -> Json:
        """Write under the lock: bump the counter, store (or remove), record, notify."""
        self._rv += 1
        if obj is None:
            assert old is not None
            final = copy.deepcopy(old)
            final["metadata"]["resourceVersion"] = str(self._rv)
            del self._store[resource][key]
            if resource == "pods":
                self._metrics.pop(key, None)
        else:
            final = obj
            final["metadata"]["resourceVersion"] = str(self._rv)
            self._store[resource][key] = final
        event = _Event(self._rv, kind, resource, key[0], final, old)
        self._history.append(event)
        while len(self._history) > self._history_limit:
            self._compacted_rv = self._history.popleft().rv
        for watcher in list(self._watchers):
            watcher.offer(event)
        if obj is None:
            uid = old["metadata"].get("uid", "") if old else ""
            if uid:
                self._gc_queue.put(("removed", uid, "", ""))
        return final

    def _get_stored(self, res: Resource, namespace: str, name: str) -> Json:
        obj = self._store[res.name].get((namespace, name))
        if obj is None:
            raise ApiError(
                404,
                "NotFound",
                f'{res.qualified} "{name}" not found',
                res.details(name),
            )
        return obj

    def _check_namespace(self, namespace: str) -> None:
        if namespace and ("", namespace) not in self._store["namespaces"]:
            raise ApiError(
                404,
                "NotFound",
                f'namespaces "{namespace}" not found',
                {"name": namespace, "kind": "namespaces"},
            )
        ns = self._store["namespaces"].get(("", namespace)) if namespace else None
        if ns is not None and (ns.get("metadata") or {}).get("deletionTimestamp"):
            raise ApiError(
                403,
                "Forbidden",
                f"unable to create new content in namespace {namespace} because it is being"
                " terminated",
            )

    def _prepare_new(self, res: Resource, obj: Json, namespace: str) -> Json:
        """Decode, default and validate an object to create; raises ApiError."""
        if not isinstance(obj, dict):
            raise ApiError(400, "BadRequest", "the body of the request was not an object")
        kind = obj.get("kind")
        if kind and kind != res.kind:
            raise ApiError(
                400,
                "BadRequest",
                f"the API version in the data ({obj.get('apiVersion')}) does not match the"
                f" expected API version ({res.api_version}) or kind {kind} is not {res.kind}",
            )
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise ApiError(400, "BadRequest", "metadata must be an object")
        body_ns = meta.get("namespace")
        if res.namespaced:
            if body_ns and body_ns != namespace:
                raise ApiError(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent"
                    " on the request",
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        obj["kind"], obj["apiVersion"] = res.kind, res.api_version
        if not meta.get("name") and meta.get("generateName"):
            alphabet = "bcdfghjklmnpqrstvwxz2456789"
            meta["name"] = meta["generateName"] + "".join(random.choices(alphabet, k=5))
        if res.name == "pods":
            _decode_quantities(obj)
            _default_pod(obj)
        elif res.name == "secrets":
            _fold_secret(obj)
        elif res.name == "services":
            self._default_service(obj)
        elif res.name == "leases":
            _decode_lease(obj)
        elif res.name == "namespaces":
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta.get("name", "")
            obj.setdefault("spec", {"finalizers": ["kubernetes"]})
            obj["status"] = {"phase": "Active"}
        causes = _name_causes(res, meta) + _labels_causes(meta)
        if res.name == "pods":
            causes += _validate_pod(obj)
        elif res.name in ("secrets", "configmaps"):
            for key in list(obj.get("data") or {}) + list(obj.get("binaryData") or {}):
                if _CONFIG_KEY.fullmatch(key) is None:
                    causes.append(
                        Cause.invalid(
                            f"data[{key}]",
                            key,
                            "a valid config key must consist of alphanumeric characters, '-',"
                            " '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name',"
                            " regex used for validation is '[-._a-zA-Z0-9]+')",
                        )
                    )
        elif res.name == "events" and not obj.get("involvedObject"):
            causes.append(Cause.required("involvedObject"))
        elif res.name == "leases":
            causes += _lease_causes(obj)
        if causes:
            raise invalid(res.kind, meta.get("name") or "", causes, res.group)
        if res.name == "pods":
            status = {"phase": "Pending", "qosClass": qos_class(obj)}
            obj["status"] = status
        for system in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion"):
            meta.pop(system, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = rfc3339()
        meta["generation"] = 1
        return obj

    def _default_service(self, svc: Json) -> None:
        spec = svc.setdefault("spec", {})
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        if spec.get("clusterIP") != "None" and not spec.get("clusterIP"):
            self._service_ips += 1
            n = self._service_ips
            spec["clusterIP"] = f"10.96.{n // 250}.{n % 250 + 2}"
        spec.setdefault("clusterIPs", [spec["clusterIP"]])
        spec.setdefault("ipFamilies", ["IPv4"])
        spec.setdefault("ipFamilyPolicy", "SingleStack")
        spec.setdefault("internalTrafficPolicy", "Cluster")
        for port in spec.get("ports") or []:
            if isinstance(port, dict):
                port.setdefault("protocol", "TCP")
                port.setdefault("targetPort", port.get("port"))
        svc["status"] = {"loadBalancer": {}}

    def _create_internal(
        self, resource: str, obj: Json, namespace: str, dry_run: bool = False
    ) -> Json:
        res = RESOURCES[resource]
        with self._lock:
            if res.namespaced:
                self._check_namespace(namespace)
            obj = self._prepare_new(res, obj, namespace if res.namespaced else "")
            key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
            if key in self._store[resource]:
                name = key[1]
                raise ApiError(
                    409,
                    "AlreadyExists",
                    f'{res.qualified} "{name}" already exists',
                    res.details(name),
                )
            if dry_run:
                return obj
            return copy.deepcopy(self._commit(resource, key, obj, "ADDED", None))

    def _update_internal(
        self,
        res: Resource,
        namespace: str,
        name: str,
        new: Json,
        subresource: str = "",
        *,
        require_rv: bool = False,
        dry_run: bool = False,
    ) -> Json:
        """Replace an object (or its status) with ``new``; ``new`` is a whole object."""
        with self._lock:
            old = self._get_stored(res, namespace, name)
            if not isinstance(new, dict):
                raise ApiError(400, "BadRequest", "the body of the request was not an object")
            meta = new.get("metadata")
            if not isinstance(meta, dict):
                meta = new["metadata"] = {}
            if meta.get("name", name) != name:
                raise ApiError(
                    400,
                    "BadRequest",
                    f"the name of the object ({meta.get('name')}) does not match the name on"
                    f" the URL ({name})",
                )
            rv = meta.get("resourceVersion")
            if rv and str(rv) != old["metadata"]["resourceVersion"]:
                raise ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {res.qualified} "{name}": the object has'
                    " been modified; please apply your changes to the latest version and try"
                    " again",
                    res.details(name),
                )
            # Leases allow no unconditional update (their strategy's AllowUnconditionalUpdate
            # is false): the holder's write must prove it read the current version.
            if not rv and require_rv and res.name in ("pods", "leases"):
                raise invalid(
                    res.kind,
                    name,
                    [
                        Cause.invalid(
                            "metadata.resourceVersion",
                            "0x0",
                            "must be specified for an update",
                        )
                    ],
                )
            if subresource == "status":
                updated = copy.deepcopy(old)
                updated["status"] = copy.deepcopy(new.get("status") or {})
            else:
                updated = copy.deepcopy(new)
                updated["kind"], updated["apiVersion"] = res.kind, res.api_version
                umeta = updated["metadata"]
                for system in (
                    "uid",
                    "creationTimestamp",
                    "namespace",
                    "name",
                    "generation",
                    "deletionTimestamp",
                    "deletionGracePeriodSeconds",
                ):
                    if system in old["metadata"]:
                        umeta[system] = old["metadata"][system]
                    else:
                        umeta.pop(system, None)
                if res.has_status:
                    if "status" in old:
                        updated["status"] = copy.deepcopy(old["status"])
                    else:
                        updated.pop("status", None)
                if res.name == "pods":
                    _decode_quantities(updated)
                    _default_pod(updated)
                elif res.name == "secrets":
                    _fold_secret(updated)
                elif res.name == "leases":
                    _decode_lease(updated)
                causes = _labels_causes(umeta)
                if res.name == "pods":
                    causes += _validate_pod(updated)
                    if not causes:
                        causes += _pod_update_causes(old, updated)
                elif res.name == "leases":
                    causes += _lease_causes(updated)
                if causes:
                    raise invalid(res.kind, name, causes, res.group)
                if updated.get("spec") != old.get("spec"):
                    umeta["generation"] = int(old["metadata"].get("generation", 1)) + 1
            if dry_run:
                return updated
            if updated == old:
                return copy.deepcopy(old)  # a no-op write does not bump the resourceVersion
            final = self._commit(res.name, (namespace, name), updated, "MODIFIED", old)
            self._maybe_finish_deletion(res, namespace, name)
            current = self._store[res.name].get((namespace, name), final)
            return copy.deepcopy(current if current is not None else final)

    def _patch_internal(
        self,
        res: Resource,
        namespace: str,
        name: str,
        content_type: str,
        patch: Any,
        subresource: str = "",
        dry_run: bool = False,
    ) -> Json:
        with self._lock:
            old = self._get_stored(res, namespace, name)
            try:
                if content_type == "application/json-patch+json":
                    if not isinstance(patch, list):
                        raise PatchError("a JSON patch must be a list of operations")
                    patched = json_patch(old, patch)
                elif content_type == "application/merge-patch+json":
                    patched = json_merge_patch(old, patch)
                elif content_type == "application/strategic-merge-patch+json":
                    patched = strategic_merge_patch(old, patch)
                else:
                    raise ApiError(
                        415,
                        "UnsupportedMediaType",
                        f"the body of the request was in an unknown format - accepted media"
                        f" types include: application/json-patch+json,"
                        f" application/merge-patch+json, application/strategic-merge-patch+json"
                        f' (got "{content_type}")',
                    )
            except PatchError as e:
                code = 422 if "testing value" in str(e) else 400
                raise ApiError(code, REASONS[code], str(e)) from e
            if not isinstance(patched, dict):
                raise ApiError(400, "BadRequest", "the patched object is not an object")
            meta = patched.setdefault("metadata", {})
            # A resourceVersion in the patch is a precondition; the stored one is not.
            patch_rv = None
            if isinstance(patch, dict):
                patch_rv = (patch.get("metadata") or {}).get("resourceVersion")
            elif json_patch_touches_rv(patch):
                patch_rv = meta.get("resourceVersion")
            meta["resourceVersion"] = patch_rv or old["metadata"]["resourceVersion"]
            if subresource != "status" and res.has_status:
                patched["status"] = copy.deepcopy(old.get("status"))
                if patched["status"] is None:
                    del patched["status"]
            return self._update_internal(
                res, namespace, name, patched, subresource, dry_run=dry_run
            )

    def _delete_internal(
        self,
        res: Resource,
        namespace: str,
        name: str,
        options: Json,
    ) -> Json:
        """Delete (or start deleting) one object; returns it as the real server does."""
        with self._lock:
            old = self._get_stored(res, namespace, name)
            meta = old["metadata"]
            pre = options.get("preconditions") or {}
            if pre.get("uid") and pre["uid"] != meta.get("uid"):
                raise ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {res.qualified} "{name}": Precondition'
                    " failed:"
                    f" UID in precondition: {pre['uid']}, UID in object meta: {meta.get('uid')}",
                    res.details(name),
                )
            if pre.get("resourceVersion") and pre["resourceVersion"] != meta["resourceVersion"]:
                raise ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {res.qualified} "{name}": Precondition'
                    " failed:"
                    f" ResourceVersion in precondition: {pre['resourceVersion']},"
                    f" ResourceVersion in object meta: {meta['resourceVersion']}",
                    res.details(name),
                )
            propagation = options.get("propagationPolicy")
            if propagation is None and options.get("orphanDependents") is not None:
                propagation = "Orphan" if options["orphanDependents"] else "Background"
            propagation = propagation or "Background"
            if propagation not in ("Background", "Foreground", "Orphan"):
                raise invalid(
                    "DeleteOptions",
                    "",
                    [
                        Cause.unsupported(
                            "propagationPolicy", propagation, ("Foreground", "Background", "Orphan")
                        )
                    ],
                )
            grace = options.get("gracePeriodSeconds")
            if res.name == "pods":
                spec, status = old.get("spec") or {}, old.get("status") or {}
                if grace is None:
                    grace = int(spec.get("terminationGracePeriodSeconds", 30))
                graceful = (
                    self.kubelet_attached
                    and bool(spec.get("nodeName"))
                    and status.get("phase") not in _TERMINAL_PHASES
                    and grace > 0
                )
                if not graceful:
                    grace = 0
            elif res.name == "namespaces":
                return self._delete_namespace(name, old)
            else:
                graceful, grace = False, 0
            finalizers = list(meta.get("finalizers") or [])
            has_dependents = propagation != "Background" and bool(
                self._dependents(meta.get("uid", ""))
            )
            if propagation == "Foreground" and has_dependents:
                finalizers.append("foregroundDeletion")
            elif propagation == "Orphan" and has_dependents:
                finalizers.append("orphan")
            if not graceful and not finalizers:
                return copy.deepcopy(
                    self._commit(res.name, (namespace, name), None, "DELETED", old)
                )
            # Graceful (a running pod on a kubelet) or finalizers: mark for deletion.
            if meta.get("deletionTimestamp"):
                current = int(meta.get("deletionGracePeriodSeconds") or 0)
                if grace >= current and set(finalizers) == set(meta.get("finalizers") or []):
                    return copy.deepcopy(old)
            updated = copy.deepcopy(old)
            umeta = updated["metadata"]
            if not umeta.get("deletionTimestamp") or grace < int(
                umeta.get("deletionGracePeriodSeconds") or 0
            ):
                umeta["deletionTimestamp"] = rfc3339(time.time() + grace)
                umeta["deletionGracePeriodSeconds"] = grace
            if finalizers:
                umeta["finalizers"] = list(dict.fromkeys(finalizers))
            umeta["generation"] = int(umeta.get("generation", 1)) + 1
            final = self._commit(res.name, (namespace, name), updated, "MODIFIED", old)
            if "foregroundDeletion" in finalizers or "orphan" in finalizers:
                self._gc_queue.put(("finalize", res.name, namespace, name))
            self._maybe_finish_deletion(res, namespace, name)
            return copy.deepcopy(final)

    def _delete_namespace(self, name: str, old: Json) -> Json:
        """Namespaces terminate: marked ``Terminating``, emptied by the namespace controller
        (here the GC thread), then removed."""
        if name in ("default", "kube-system", "kube-public"):
            raise ApiError(
                403,
                "Forbidden",
                f'namespaces "{name}" is forbidden: this namespace may not be deleted',
                {"name": name, "kind": "namespaces"},
            )
        if old["metadata"].get("deletionTimestamp"):
            return copy.deepcopy(old)
        updated = copy.deepcopy(old)
        updated["metadata"]["deletionTimestamp"] = rfc3339()
        updated["metadata"]["deletionGracePeriodSeconds"] = 0
        updated["status"] = {"phase": "Terminating"}
        final = self._commit("namespaces", ("", name), updated, "MODIFIED", old)
        self._gc_queue.put(("finalize", "namespaces", "", name))
        return copy.deepcopy(final)

    def _maybe_finish_deletion(self, res: Resource, namespace: str, name: str) -> None:
        """Remove an object marked for deletion once no finalizer and no grace period hold it."""
        obj = self._store[res.name].get((namespace, name))
        if obj is None:
            return
        meta = obj["metadata"]
        if not meta.get("deletionTimestamp") or meta.get("finalizers"):
            return
        if res.name == "pods" and int(meta.get("deletionGracePeriodSeconds") or 0) > 0:
            return
        self._commit(res.name, (namespace, name), None, "DELETED", obj)

    def _dependents(self, uid: str) -> list[tuple[str, tuple[str, str], Json]]:
        if not uid:
            return []
        found = []
        for resource, objs in self._store.items():
            for key, obj in objs.items():
                refs = obj["metadata"].get("ownerReferences") or []
                if any(isinstance(r, dict) and r.get("uid") == uid for r in refs):
                    found.append((resource, key, obj))
        return found

    def _uid_exists(self, uid: str) -> bool:
        return any(
            obj["metadata"].get("uid") == uid
            for objs in self._store.values()
            for obj in objs.values()
        )

    # -- garbage collector -------------------------------------------------------------------

    def _gc_loop(self) -> None:
        while True:
            try:
                item = self._gc_queue.get(timeout=0.05)
            except queue.Empty:
                item = ("tick", "", "", "")
            if item is None:
                return
            # An ApiError: raced with another deletion; the next tick sees the new state.
            with contextlib.suppress(ApiError):
                self._gc_step(item)

    def _gc_step(self, item: tuple[str, str, str, str]) -> None:
        kind = item[0]
        with self._lock:
            if self._closed:
                return
            if kind == "removed":
                uid = item[1]
                for resource, key, obj in self._dependents(uid):
                    refs = obj["metadata"].get("ownerReferences") or []
                    others = [r for r in refs if r.get("uid") != uid]
                    res = RESOURCES[resource]
                    if others and any(self._uid_exists(r.get("uid", "")) for r in others):
                        updated = copy.deepcopy(obj)
                        _set_owner_refs(updated, others)
                        self._commit(resource, key, updated, "MODIFIED", obj)
                    elif not obj["metadata"].get("deletionTimestamp"):
                        self._delete_internal(res, key[0], key[1], {})
            elif kind == "finalize":
                self._gc_pending.append((item[1], item[2], item[3]))
            still = []
            for resource, namespace, name in self._gc_pending:
                res = RESOURCES[resource]
                owner = self._store[resource].get((namespace, name))
                if owner is None:
                    continue
                if resource == "namespaces":
                    contents = [
                        (r, key, obj)
                        for r, objs in self._store.items()
                        for key, obj in objs.items()
                        if RESOURCES[r].namespaced and key[0] == name
                    ]
                    for r, key, obj in contents:
                        if not obj["metadata"].get("deletionTimestamp"):
                            self._delete_internal(RESOURCES[r], key[0], key[1], {})
                    if any(key in self._store[r] for r, key, _ in contents):
                        still.append((resource, namespace, name))
                    else:
                        self._commit("namespaces", ("", name), None, "DELETED", owner)
                    continue
                finalizers = owner["metadata"].get("finalizers") or []
                uid = owner["metadata"].get("uid", "")
                dependents = self._dependents(uid)
                if "orphan" in finalizers:
                    for dres, dkey, dobj in dependents:
                        updated = copy.deepcopy(dobj)
                        _set_owner_refs(
                            updated,
                            [r for r in dobj["metadata"]["ownerReferences"] if r.get("uid") != uid],
                        )
                        self._commit(dres, dkey, updated, "MODIFIED", dobj)
                    dependents = []
                    self._drop_finalizer(res, namespace, name, "orphan")
                elif "foregroundDeletion" in finalizers:
                    for dres, dkey, dobj in dependents:
                        if not dobj["metadata"].get("deletionTimestamp"):
                            self._delete_internal(
                                RESOURCES[dres],
                                dkey[0],
                                dkey[1],
                                {"propagationPolicy": "Foreground"},
                            )
                    if not self._dependents(uid):
                        self._drop_finalizer(res, namespace, name, "foregroundDeletion")
                    else:
                        still.append((resource, namespace, name))
            self._gc_pending = still

    def _drop_finalizer(self, res: Resource, namespace: str, name: str, finalizer: str) -> None:
        obj = self._store[res.name].get((namespace, name))
        if obj is None:
            return
        updated = copy.deepcopy(obj)
        remaining = [f for f in obj["metadata"].get("finalizers") or [] if f != finalizer]
        if remaining:
            updated["metadata"]["finalizers"] = remaining
        else:
            updated["metadata"].pop("finalizers", None)
        self._commit(res.name, (namespace, name), updated, "MODIFIED", obj)
        self._maybe_finish_deletion(res, namespace, name)

    # -- lists and watches -------------------------------------------------------------------

    def _select(
        self,
        res: Resource,
        namespace: str,
        labels: list[Requirement],
        fields: list[tuple[str, str, str]],
    ) -> list[tuple[tuple[str, str], Json]]:
        out = []
        for key, obj in sorted(self._store[res.name].items()):
            if namespace and key[0] != namespace:
                continue
            if labels_match(labels, obj["metadata"].get("labels")) and fields_match(
                res.name, fields, obj
            ):
                out.append((key, obj))
        return out

    def _list(
        self, res: Resource, namespace: str, query: Mapping[str, str]
    ) -> tuple[Json, list[Json]]:
        labels = parse_label_selector(query.get("labelSelector", ""))
        fields = parse_field_selector(query.get("fieldSelector", ""))
        check_fields(res.name, fields)
        with self._lock:
            selected = self._select(res, namespace, labels, fields)
            rv = self._rv
            token = query.get("continue")
            if token:
                try:
                    state = json.loads(base64.b64decode(token))
                    start, token_rv = state["start"], int(state["rv"])
                except (ValueError, KeyError, TypeError) as e:
                    raise ApiError(400, "BadRequest", f"continue key is not valid: {e}") from e
                if token_rv < self._compacted_rv:
                    raise ApiError(
                        410,
                        "Expired",
                        "The provided continue parameter is too old to display a consistent"
                        " list result. You can start a new list without the continue"
                        " parameter, or use the continue token in this response to retrieve"
                        " the remainder of the results. Continuing with the provided token"
                        " results in an inconsistent list - objects that were created,"
                        " modified, or deleted between the time the first chunk was returned"
                        " and now may show up in the list.",
                    )
                rv = token_rv
                selected = [(k, o) for k, o in selected if "/".join(k) > start]
            limit = int(query.get("limit") or 0)
            meta: Json = {"resourceVersion": str(rv)}
            if limit > 0 and len(selected) > limit:
                last = "/".join(selected[limit - 1][0])
                meta["continue"] = base64.b64encode(
                    json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": last}).encode()
                ).decode()
                if not labels and not fields:
                    meta["remainingItemCount"] = len(selected) - limit
                selected = selected[:limit]
            return meta, [copy.deepcopy(o) for _, o in selected]

    def _bookmark(self, resource: str) -> Json:
        res = RESOURCES[resource]
        return {
            "kind": res.kind,
            "apiVersion": res.api_version,
            "metadata": {"resourceVersion": str(self._rv)},
        }

    def _open_watch(
        self, res: Resource, namespace: str, query: Mapping[str, str], from_kubelet: bool
    ) -> _Watcher:
        labels = parse_label_selector(query.get("labelSelector", ""))
        fields = parse_field_selector(query.get("fieldSelector", ""))
        check_fields(res.name, fields)
        watcher = _Watcher(res.name, namespace, labels, fields, from_kubelet)
        bookmarks = query.get("allowWatchBookmarks") in ("1", "true", "True")
        watcher.bookmarks = bookmarks
        rv_text = query.get("resourceVersion", "")
        with self._lock:
            if self._closed:
                watcher.close()
                return watcher
            send_initial = query.get("sendInitialEvents") in ("1", "true", "True")
            if rv_text in ("", "0") or send_initial:
                for _, obj in self._select(res, namespace, labels, fields):
                    watcher.send("ADDED", obj)
                if send_initial and bookmarks:
                    mark = self._bookmark(res.name)
                    mark["metadata"]["annotations"] = {"k8s.io/initial-events-end": "true"}
                    watcher.send("BOOKMARK", mark)
            else:
                try:
                    since = int(rv_text)
                except ValueError as e:
                    raise ApiError(400, "BadRequest", f"invalid resource version: {rv_text}") from e
                if since < self._compacted_rv:
                    watcher.send(
                        "ERROR",
                        ApiError(
                            410,
                            "Expired",
                            f"too old resource version: {since} ({self._compacted_rv})",
                        ).status(),
                    )
                    watcher.close()
                    return watcher
                for event in self._history:
                    if event.rv > since:
                        watcher.offer(event)
            self._watchers.add(watcher)
        return watcher

    def _close_watch(self, watcher: _Watcher) -> None:
        with self._lock:
            self._watchers.discard(watcher)

    # -- metrics -----------------------------------------------------------------------------

    def _pod_metrics(self, namespace: str, name: str) -> Json | None:
        pod = self._store["pods"].get((namespace, name))
        usage = self._metrics.get((namespace, name))
        if pod is None or usage is None:
            return None
        cpu, memory, at, window = usage
        containers = (pod.get("spec") or {}).get("containers") or [{}]
        return {
            "kind": "PodMetrics",
            "apiVersion": f"{METRICS_GROUP}/{METRICS_VERSION}",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "creationTimestamp": rfc3339(),
                "labels": copy.deepcopy(pod["metadata"].get("labels") or {}),
            },
            "timestamp": rfc3339(at),
            "window": f"{window:g}s",
            "containers": [
                {
                    "name": containers[0].get("name", ""),
                    "usage": {
                        "cpu": format_quantity(Fraction(round(cpu * 1e9), 10**9)),
                        "memory": format_quantity(memory, "BinarySI"),
                    },
                }
            ],
        }

    # -- authorization and faults ------------------------------------------------------------

    def _authorize(self, info: _RequestInfo) -> None:
        if not info.is_resource:
            return
        target = f"{info.resource}/{info.subresource}" if info.subresource else info.resource
        with self._lock:
            denied = (info.verb, target) in self._forbidden
            rules = self._rules
        if not denied and rules is not None:
            denied = not any(_rule_allows(rule, info, target) for rule in rules)
        if not denied:
            return
        scope = (
            f' in the namespace "{info.namespace}"' if info.namespace else " at the cluster scope"
        )
        subject = f'{info.resource} "{info.name}"' if info.name else info.resource
        details: Json = {"kind": info.resource}
        if info.name:
            details["name"] = info.name
        if info.group:
            details["group"] = info.group
        raise ApiError(
            403,
            "Forbidden",
            f'{subject} is forbidden: User "{self.user}" cannot {info.verb} resource'
            f' "{target}" in API group "{info.group}"{scope}',
            details,
        )

    def _take_fault(self, info: _RequestInfo) -> tuple[float, _Fault | None]:
        """(delay, the fault to apply) for a request; consumes counted faults."""
        now = time.monotonic()
        delay, chosen = 0.0, None
        with self._lock:
            self._faults = [
                f
                for f in self._faults
                if f.until > now and (f.remaining is None or f.remaining > 0)
            ]
            for fault in self._faults:
                if not fault.applies(info):
                    continue
                if fault.kind == "slow":
                    delay = max(delay, fault.delay_s)
                elif chosen is None:
                    chosen = fault
                    if fault.remaining is not None:
                        fault.remaining -= 1
        return delay, chosen


def json_patch_touches_rv(ops: Any) -> bool:
    return isinstance(ops, list) and any(
        isinstance(op, dict) and str(op.get("path", "")).startswith("/metadata/resourceVersion")
        for op in ops
    )


def _rule_allows(rule: Json, info: _RequestInfo, target: str) -> bool:
    groups, resources = rule.get("apiGroups") or [], rule.get("resources") or []
    verbs, names = rule.get("verbs") or [], rule.get("resourceNames") or []
    if "*" not in groups and info.group not in groups:
        return False
    if "*" not in resources and target not in resources:
        return False
    if "*" not in verbs and info.verb not in verbs:
        return False
    return not names or info.name in names


def _set_owner_refs(obj: Json, refs: list[Json]) -> None:
    if refs:
        obj["metadata"]["ownerReferences"] = refs
    else:  # an empty list is omitted, as Go's omitempty does
        obj["metadata"].pop("ownerReferences", None)


def _node_condition(kind: str, status: str, reason: str, now: str) -> Json:
    messages = {
        "KubeletReady": "kubelet is posting ready status",
        "KubeletHasSufficientMemory": "kubelet has sufficient memory available",
        "KubeletHasNoDiskPressure": "kubelet has no disk pressure",
        "KubeletHasSufficientPID": "kubelet has sufficient PID available",
    }
    return {
        "type": kind,
        "status": status,
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
        "reason": reason,
        "message": messages.get(reason, reason),
    }


def _fold_secret(secret: Json) -> None:
    """``stringData`` is write-only: merged into ``data`` (base64), as the real server does."""
    secret.setdefault("type", "Opaque")
    data = secret.get("data") or {}
    for key, value in data.items():
        try:
            base64.b64decode(value, validate=True)
        except (ValueError, TypeError) as e:
            raise ApiError(
                400,
                "BadRequest",
                f'Secret in version "v1" cannot be handled as a Secret: illegal base64 data in'
                f" data[{key}]",
            ) from e
    for key, value in (secret.pop("stringData", None) or {}).items():
        data[key] = base64.b64encode(str(value).encode()).decode()
    if data:
        secret["data"] = data


# --------------------------------------------------------------------------------------------
# HTTP


def _parse_query(raw: str) -> dict[str, str]:
    return {k: v[-1] for k, v in parse_qs(raw, keep_blank_values=True).items()}


def route(method: str, path: str, query: dict[str, str]) -> _RequestInfo:
    """Where a request goes, with its RBAC verb (the real server's RequestInfo)."""
    info = _RequestInfo(method, path, query)
    parts = [p for p in path.split("/") if p]
    info.verb = method.lower()
    if not parts or parts[0] not in ("api", "apis"):
        return info
    if parts[0] == "api":
        if len(parts) < 3:
            info.version = parts[1] if len(parts) == 2 else ""
            return info
        info.version, rest = parts[1], parts[2:]
    else:
        if len(parts) < 4:
            info.group = parts[1] if len(parts) > 1 else ""
            info.version = parts[2] if len(parts) > 2 else ""
            return info
        info.group, info.version, rest = parts[1], parts[2], parts[3:]
    info.is_resource = True
    watch_path = rest[0] == "watch"
    if watch_path:
        rest = rest[1:]
    if (
        len(rest) >= 3
        and rest[0] == "namespaces"
        and not (len(rest) == 3 and rest[2] in ("status", "finalize"))
    ):
        info.namespace, rest = rest[1], rest[2:]
    info.resource = rest[0] if rest else ""
    info.name = rest[1] if len(rest) > 1 else ""
    info.subresource = "/".join(rest[2:]) if len(rest) > 2 else ""
    if info.resource == "namespaces" and info.name:
        info.namespace = info.name
    info.watch = watch_path or query.get("watch", "") in ("1", "true", "True")
    verbs = {"POST": "create", "PUT": "update", "PATCH": "patch"}
    if method == "GET":
        if info.watch:
            info.verb = "watch"
        else:
            info.verb = "get" if info.name else "list"
    elif method == "DELETE":
        info.verb = "delete" if info.name else "deletecollection"
    else:
        info.verb = verbs.get(method, method.lower())
    return info


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes: without TCP_NODELAY, Nagle's algorithm and
    # the client's delayed ACK add 40 ms to every response.
    disable_nagle_algorithm = True
    server: _HttpServer
    server_version = "fake-apiserver"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    # -- plumbing ----------------------------------------------------------------------------

    @property
    def api(self) -> FakeApiServer:
        return self.server.api

    def _send_json(self, code: int, body: Any, headers: Mapping[str, str] | None = None) -> None:
        data = json.dumps(body, separators=(",", ":")).encode()
        self._send_bytes(code, data, "application/json", headers)

    def _send_bytes(
        self,
        code: int,
        data: bytes,
        content_type: str,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self._record(code)  # before the client can see the response
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache, private")
        self.send_header("Audit-Id", str(uuid.uuid4()))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _serve(self, method: str) -> None:
        split = urlsplit(self.path)
        query = _parse_query(split.query)
        info = route(method, split.path, query)
        body = self._read_body()
        from_kubelet = self.headers.get(KUBELET_HEADER) is not None
        self._info, self._from_kubelet, self._recorded = info, from_kubelet, False
        try:
            if not (from_kubelet and self.api.faults_exempt_kubelet):
                delay, fault = self.api._take_fault(info)
                if delay:
                    time.sleep(delay)
                if fault is not None and fault.kind == "reset":
                    self._record(0)
                    self.close_connection = True
                    with contextlib.suppress(OSError):
                        self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if fault is not None:
                    error = status_error(fault.code, fault.message)
                    if fault.retry_after is not None or fault.code == 429:
                        retry = fault.retry_after if fault.retry_after is not None else 1
                        error.headers["Retry-After"] = str(retry)
                        error.details = {"retryAfterSeconds": retry}
                    raise error
            if self.api.closed:
                raise status_error(503, "the server is shutting down")
            self._authenticate()
            if not from_kubelet:
                self.api._authorize(info)
            if info.watch and method == "GET":
                self._serve_watch(info, from_kubelet)
                return
            self._dispatch(info, body)
        except ApiError as e:
            with contextlib.suppress(OSError):
                self._send_json(e.code, e.status(), e.headers)
        except SelectorError as e:
            with contextlib.suppress(OSError):
                self._send_json(400, ApiError(400, "BadRequest", str(e)).status())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as e:  # a bug in the fake: report it as the server would
            with contextlib.suppress(OSError):
                self._send_json(
                    500,
                    ApiError(500, "InternalError", f"Internal error occurred: {e!r}").status(),
                )
        finally:
            self._record(0)  # nothing was sent: the client went away

    def _record(self, code: int) -> None:
        """Audit this request once, with the status it is answered with."""
        if self._recorded:
            return
        self._recorded = True
        info = self._info
        self.api._record(
            ApiCall(
                verb=info.verb,
                api_group=info.group,
                api_version=info.version,
                resource=info.resource,
                subresource=info.subresource,
                namespace=info.namespace,
                name=info.name,
                user_agent=self.headers.get("User-Agent", ""),
                code=code,
                from_kubelet=self._from_kubelet,
                method=info.method,
                path=self.path,
                at=time.time(),
            )
        )

    def _authenticate(self) -> None:
        if self.api.token is None:
            return
        if self.headers.get("Authorization", "") != f"Bearer {self.api.token}":
            raise ApiError(401, "Unauthorized", "Unauthorized")

    def _accepts_table(self) -> bool:
        return "as=Table" in self.headers.get("Accept", "")

    def _check_accept(self) -> None:
        accept = self.headers.get("Accept", "")
        if accept and not any(
            t in accept for t in ("application/json", "*/*", "application/*", "text/plain")
        ):
            raise ApiError(
                406,
                "NotAcceptable",
                "only the following media types are accepted: application/json, application/yaml",
            )

    # -- routes ------------------------------------------------------------------------------

    def _dispatch(self, info: _RequestInfo, body: bytes) -> None:
        path = info.path.rstrip("/")
        if not info.is_resource:
            self._discovery(path)
            return
        self._check_accept()
        if info.group == METRICS_GROUP:
            self._metrics(info)
            return
        found = resource_for(info.group, info.version, info.resource)
        if found is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        res = found
        if res.namespaced and not info.namespace and info.name:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        namespace = info.namespace if res.namespaced else ""
        if info.subresource and info.subresource not in res.subresources:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        method = info.method
        query = info.query
        dry_run = query.get("dryRun") == "All"
        if method == "GET":
            if info.subresource == "log":
                self._pod_log(namespace, info.name, query)
            elif info.name:
                with self.api._lock:
                    obj = copy.deepcopy(self.api._get_stored(res, namespace, info.name))
                if self._accepts_table():
                    self._send_json(
                        200,
                        make_table(
                            res.name,
                            [obj],
                            query.get("includeObject", "Metadata"),
                            {"resourceVersion": str(self.api._rv)},
                        ),
                    )
                else:
                    self._send_json(200, obj)
            else:
                meta, items = self.api._list(res, namespace, query)
                if self._accepts_table():
                    self._send_json(
                        200,
                        make_table(res.name, items, query.get("includeObject", "Metadata"), meta),
                    )
                else:
                    for item in items:
                        item.pop("kind", None)
                        item.pop("apiVersion", None)
                    self._send_json(
                        200,
                        {
                            "kind": res.list_kind,
                            "apiVersion": res.api_version,
                            "metadata": meta,
                            "items": items,
                        },
                    )
            return
        payload = self._json_body(body)
        if method == "POST":
            if info.subresource == "binding":
                self._bind(namespace, info.name, payload)
            elif info.subresource == "eviction":
                self._evict(namespace, info.name, payload)
            elif info.name:
                raise ApiError(
                    405,
                    "MethodNotAllowed",
                    "the server does not allow this method on the requested resource",
                )
            else:
                obj = self.api._create_internal(res.name, payload, namespace, dry_run)
                self._send_json(201, obj)
        elif method == "PUT":
            if not info.name:
                raise ApiError(
                    405,
                    "MethodNotAllowed",
                    "the server does not allow this method on the requested resource",
                )
            obj = self.api._update_internal(
                res,
                namespace,
                info.name,
                payload,
                info.subresource,
                require_rv=True,
                dry_run=dry_run,
            )
            self._send_json(200, obj)
        elif method == "PATCH":
            content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            if content_type == "application/apply-patch+yaml":
                raise ApiError(
                    415,
                    "UnsupportedMediaType",
                    "server-side apply is not supported by the fake API server",
                )
            obj = self.api._patch_internal(
                res, namespace, info.name, content_type, payload, info.subresource, dry_run
            )
            self._send_json(200, obj)
        elif method == "DELETE":
            options = payload if isinstance(payload, dict) else {}
            for key in ("gracePeriodSeconds",):
                if key in query and options.get(key) is None:
                    options[key] = int(query[key])
            for key in ("propagationPolicy",):
                if key in query and not options.get(key):
                    options[key] = query[key]
            if "orphanDependents" in query and options.get("orphanDependents") is None:
                options["orphanDependents"] = query["orphanDependents"] in ("true", "1")
            if info.name:
                obj = self.api._delete_internal(res, namespace, info.name, options)
                legacy = options.get("orphanDependents") is False
                with self.api._lock:
                    still = (namespace, info.name) in self.api._store[res.name]
                self._send_json(202 if legacy and still else 200, obj)
            else:
                meta, items = self.api._list(res, namespace, query)
                deleted = []
                for item in items:
                    with contextlib.suppress(ApiError):
                        deleted.append(
                            self.api._delete_internal(
                                res,
                                namespace or item["metadata"].get("namespace", ""),
                                item["metadata"]["name"],
                                dict(options),
                            )
                        )
                self._send_json(
                    200,
                    {
                        "kind": res.list_kind,
                        "apiVersion": res.api_version,
                        "metadata": {"resourceVersion": str(self.api._rv)},
                        "items": deleted,
                    },
                )
        else:
            raise ApiError(405, "MethodNotAllowed", "method not allowed")

    def _json_body(self, body: bytes) -> Any:
        if not body:
            return {}
        try:
            return json.loads(body)
        except ValueError as e:
            raise ApiError(400, "BadRequest", f"the request body is not valid JSON: {e}") from e

    def _discovery(self, path: str) -> None:
        api = self.api
        if path in ("/healthz", "/livez", "/readyz"):
            self._send_bytes(200, b"ok", "text/plain; charset=utf-8")
        elif path == "/version":
            self._send_json(200, SERVER_VERSION)
        elif path == "/api":
            self._send_json(
                200,
                {
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [
                        {"clientCIDR": "0.0.0.0/0", "serverAddress": f"127.0.0.1:{api.port}"}
                    ],
                },
            )
        elif path == "/api/v1":
            self._send_json(200, _api_resource_list())
        elif path == "/apis":
            cv = {"groupVersion": f"{COORDINATION_GROUP}/v1", "version": "v1"}
            groups = [{"name": COORDINATION_GROUP, "versions": [cv], "preferredVersion": cv}]
            if api.serve_metrics:
                gv = {
                    "groupVersion": f"{METRICS_GROUP}/{METRICS_VERSION}",
                    "version": METRICS_VERSION,
                }
                groups.append({"name": METRICS_GROUP, "versions": [gv], "preferredVersion": gv})
            self._send_json(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
        elif path == f"/apis/{COORDINATION_GROUP}":
            cv = {"groupVersion": f"{COORDINATION_GROUP}/v1", "version": "v1"}
            self._send_json(
                200,
                {
                    "kind": "APIGroup",
                    "apiVersion": "v1",
                    "name": COORDINATION_GROUP,
                    "versions": [cv],
                    "preferredVersion": cv,
                },
            )
        elif path == f"/apis/{COORDINATION_GROUP}/v1":
            self._send_json(200, _api_resource_list(COORDINATION_GROUP))
        elif path == f"/apis/{METRICS_GROUP}" and api.serve_metrics:
            gv = {"groupVersion": f"{METRICS_GROUP}/{METRICS_VERSION}", "version": METRICS_VERSION}
            self._send_json(
                200,
                {
                    "kind": "APIGroup",
                    "apiVersion": "v1",
                    "name": METRICS_GROUP,
                    "versions": [gv],
                    "preferredVersion": gv,
                },
            )
        elif path == f"/apis/{METRICS_GROUP}/{METRICS_VERSION}" and api.serve_metrics:
            self._send_json(200, _metrics_resource_list())
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})

    def _metrics(self, info: _RequestInfo) -> None:
        api = self.api
        if not api.serve_metrics or info.version != METRICS_VERSION:
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        if info.resource != "pods" or info.method != "GET" or info.watch:
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        labels = parse_label_selector(info.query.get("labelSelector", ""))
        with api._lock:
            if info.name:
                found = api._pod_metrics(info.namespace, info.name)
                if found is None:
                    raise ApiError(
                        404,
                        "NotFound",
                        f'podmetrics.metrics.k8s.io "{info.name}" not found',
                        {"name": info.name, "group": METRICS_GROUP, "kind": "pods"},
                    )
                self._send_json(200, found)
                return
            items = []
            for ns, name in sorted(api._metrics):
                if info.namespace and ns != info.namespace:
                    continue
                found = api._pod_metrics(ns, name)
                if found is not None and labels_match(labels, found["metadata"]["labels"]):
                    items.append(found)
        self._send_json(
            200,
            {
                "kind": "PodMetricsList",
                "apiVersion": f"{METRICS_GROUP}/{METRICS_VERSION}",
                "metadata": {},
                "items": items,
            },
        )

    def _pod_log(self, namespace: str, name: str, query: Mapping[str, str]) -> None:
        api = self.api
        with api._lock:
            api._get_stored(RESOURCES["pods"], namespace, name)
        provider = api.log_provider
        text = provider(namespace, name) if provider is not None else None
        if text is None:
            raise ApiError(
                400, "BadRequest", f'container in pod "{name}" is waiting to start: no logs yet'
            )
        tail = query.get("tailLines")
        if tail:
            lines = text.splitlines(keepends=True)
            text = "".join(lines[-int(tail) :]) if int(tail) > 0 else ""
        self._send_bytes(200, text.encode(), "text/plain")

    def _bind(self, namespace: str, name: str, binding: Json) -> None:
        api = self.api
        target = (binding.get("target") or {}).get("name")
        if not target:
            raise invalid("Binding", name, [Cause.required("target.name")])
        res = RESOURCES["pods"]
        with api._lock:
            pod = api._get_stored(res, namespace, name)
            if (pod.get("metadata") or {}).get("deletionTimestamp"):
                raise ApiError(
                    409, "Conflict", f"pod {name} is being deleted, cannot be assigned to a host"
                )
            current = (pod.get("spec") or {}).get("nodeName")
            if current:
                raise ApiError(
                    409,
                    "Conflict",
                    f'pod {name} is already assigned to node "{current}"',
                    {"name": name, "kind": "pods"},
                )
            updated = copy.deepcopy(pod)
            updated["spec"]["nodeName"] = target
            status = updated.setdefault("status", {})
            conditions = [
                c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"
            ]
            conditions.insert(
                0,
                {
                    "type": "PodScheduled",
                    "status": "True",
                    "lastProbeTime": None,
                    "lastTransitionTime": rfc3339(),
                },
            )
            status["conditions"] = conditions
            api._commit("pods", (namespace, name), updated, "MODIFIED", pod)
        self._send_json(
            201,
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "code": 201,
            },
        )

    def _evict(self, namespace: str, name: str, eviction: Json) -> None:
        """The Eviction API (no PodDisruptionBudgets): a DisruptionTarget condition, then a
        delete with the eviction's options."""
        api = self.api
        res = RESOURCES["pods"]
        with api._lock:
            pod = api._get_stored(res, namespace, name)
            status = pod.get("status") or {}
            if status.get("phase") not in _TERMINAL_PHASES:
                updated = copy.deepcopy(pod)
                add_condition(
                    updated,
                    "DisruptionTarget",
                    "True",
                    "EvictionByEvictionAPI",
                    "Eviction API: evicting",
                )
                api._commit("pods", (namespace, name), updated, "MODIFIED", pod)
            api._delete_internal(res, namespace, name, eviction.get("deleteOptions") or {})
        self._send_json(
            201,
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "code": 201,
            },
        )

    def _serve_watch(self, info: _RequestInfo, from_kubelet: bool) -> None:
        api = self.api
        found = resource_for(info.group, info.version, info.resource)
        if info.group == METRICS_GROUP or found is None:
            raise ApiError(
                405 if info.group == METRICS_GROUP else 404,
                REASONS[405 if info.group == METRICS_GROUP else 404],
                "the server does not allow this method on the requested resource",
            )
        res = found
        namespace = info.namespace if res.namespaced else ""
        query = dict(info.query)
        if info.name:  # the legacy /watch/.../NAME path
            query["fieldSelector"] = ",".join(
                x for x in (query.get("fieldSelector", ""), f"metadata.name={info.name}") if x
            )
        watcher = api._open_watch(res, namespace, query, from_kubelet)
        timeout = float(query.get("timeoutSeconds") or 0)
        deadline = time.monotonic() + timeout if timeout > 0 else math.inf
        self._record(200)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.send_header("Audit-Id", str(uuid.uuid4()))
        self.end_headers()
        bookmarks = watcher.bookmarks
        next_mark = time.monotonic() + api.bookmark_interval_s
        try:
            while True:
                now = time.monotonic()
                if now >= deadline:
                    break
                wait = min(deadline - now, 0.25)
                try:
                    line = watcher.queue.get(timeout=wait)
                except queue.Empty:
                    if api.closed:
                        break
                    if bookmarks and time.monotonic() >= next_mark:
                        with api._lock:
                            mark = api._bookmark(res.name)
                        watcher.send("BOOKMARK", mark)
                        next_mark = time.monotonic() + api.bookmark_interval_s
                    continue
                if line == _Watcher._CLOSE:
                    break
                # Batch what is already queued into one write.
                chunk = [line]
                closing = False
                while len(chunk) < 256:
                    try:
                        more = watcher.queue.get_nowait()
                    except queue.Empty:
                        break
                    if more == _Watcher._CLOSE:
                        closing = True
                        break
                    chunk.append(more)
                for item in chunk:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(item), item))
                if closing:
                    break
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.close_connection = True
        finally:
            api._close_watch(watcher)
            if api.closed:
                self.close_connection = True


def add_condition(pod: Json, kind: str, status: str, reason: str, message: str) -> None:
    """Set (replace) a pod condition in place."""
    pod_status = pod.setdefault("status", {})
    conditions = [c for c in pod_status.get("conditions") or [] if c.get("type") != kind]
    conditions.append(
        {
            "type": kind,
            "status": status,
            "lastProbeTime": None,
            "lastTransitionTime": rfc3339(),
            "reason": reason,
            "message": message,
        }
    )
    pod_status["conditions"] = conditions


def iter_watch_lines(stream: Iterator[bytes]) -> Iterator[Json]:
    """Decode newline-delimited watch events from a byte stream (for tests)."""
    buffer = b""
    for chunk in stream:
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                yield json.loads(line)
