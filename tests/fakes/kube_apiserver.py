"""A fake Kubernetes API server, as small as what the product asks of one, for tests.

The Kubernetes backend (``dlrover_kfp/backends/kubernetes.py``) talks to it through the
unmodified official client, the fake kubelet (:mod:`.kubelet`) runs its pods, and ``kubectl get
pods`` / ``kubectl describe pod`` read them. It serves exactly what those make, on ``127.0.0.1``:

* ``pods``: create, get, list and watch (by label selector, in a namespace or all of them),
  delete (grace period, uid and resourceVersion preconditions), patch (strategic merge of its
  metadata: a cancel annotation; the spec but images may not change, 422; the status is kept);
  ``pods/status`` get, update and patch (strategic merge) and ``pods/binding`` create: what the
  kubelet writes; ``pods/resize`` patch (strategic merge; Kubernetes 1.33+ in-place resize),
  absent while ``serve_resize`` is False, as on an older cluster; ``pods/log`` get (RBAC
  ``get`` on ``pods/log``): the options decoded and validated and the container chosen here
  (400/422 as the real server), an unscheduled pod's log empty, the rest proxied to the kubelet
  of the pod's node (:attr:`FakeApiServer.log_sources`; 500 when none answers for it) and
  streamed back as chunked ``text/plain``;
* ``events`` (core/v1): create, get, list (label selector, and a field selector on the
  fields the real server indexes: ``involvedObject.*``, ``reason``, ``type``, ``source``, ...,
  ``=``/``==``/``!=``: what ``kubectl describe pod`` sends), patch (strategic merge: a repeat's
  ``count``/``lastTimestamp``); core/v1's own validation only (legacyValidateEvent: the
  namespace is the involved object's, an event with ``eventTime`` names its reporter, action
  and reason; ``type`` is free there: Normal|Warning is checked by ``events.k8s.io`` only, which
  is not served); times decoded as metav1.Time/MicroTime (a naive one is 400);
* ``secrets``: create, get, update, delete;
* ``coordination.k8s.io/v1`` ``leases``: create, get, update, delete;
* ``metrics.k8s.io/v1beta1`` pods: list by label selector (absent while ``serve_metrics`` is
  False, as on a cluster without metrics-server);
* ``/version``, discovery, and server-side ``Table`` output of pods for kubectl.

What it does as the real server does, for those: ``metadata.uid``/``resourceVersion`` (one
global counter bumped by every write)/``creationTimestamp``; the defaults the backend's objects
meet (pod ``restartPolicy``, ``terminationGracePeriodSeconds``, ``serviceAccountName``
``default`` as the admission plugin sets it, requests from limits, ``qosClass``, a fieldRef's
``apiVersion``; a secret's ``stringData`` folded into ``data``); ``generateName``; canonical
quantities (``"0.5"``
reads back ``"500m"``); validation of names, labels, containers and leases (422 ``Invalid`` with
causes; an env var's ``valueFrom`` as the server checks it: one source, no ``value`` beside it,
a fieldRef path an env var may read; a quantity or a Lease field that does not decode is 400);
optimistic concurrency (409
``Conflict``, and no Lease update without a ``resourceVersion``); 409 ``AlreadyExists``; watches
(chunked HTTP, ``ADDED``/``MODIFIED``/``DELETED``/``BOOKMARK``/``ERROR``, an object whose
labels start or stop matching the selector sent as ADDED or DELETED, resume from a
resourceVersion, 410 ``Expired`` once the history is compacted, ``timeoutSeconds``); graceful
deletion of a pod bound to a node whose kubelet is attached; owner-reference garbage
collection (background propagation).

Test controls, the faults the tests inject: :meth:`FakeApiServer.fail` (the next requests of a
verb on a resource), :meth:`~FakeApiServer.storm` (every request, for a while),
:meth:`~FakeApiServer.throttle` (429 with ``Retry-After``), :meth:`~FakeApiServer.forbid` (403),
:meth:`~FakeApiServer.compact` and :meth:`~FakeApiServer.expire_watches` (410), and
``serve_metrics``; an audit log (:attr:`~FakeApiServer.calls`, :meth:`~FakeApiServer.rbac_verbs`)
checks the backend's Role. Requests with the header ``X-Fake-Kubelet`` (the fake kubelet's and
the fake scheduler's: the cluster's own, not the product's) skip faults and authorization and
are marked ``from_kubelet`` in the audit log.

Everything else is refused with the status a real server gives what it does not serve (404,
405, 400 for a field selector but on events, or a set-based label selector, 415 for other
patch types), so that
a call the product starts making fails here loudly instead of meeting a half-built imitation.
Also not done: namespaces and service accounts are not objects (namespaces a fixed set,
:data:`NAMESPACES`; any ``serviceAccountName`` is accepted); no authentication; JSON only (events
are listed, not rendered as a server-side table); lists are not paginated (a ``limit`` smaller
than the list is 400); events do not expire.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import math
import os
import queue
import re
import socket
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fractions import Fraction
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, Self
from urllib.parse import parse_qs, urlsplit

from tests.fakes.container_log import PodLogOptions

Json = dict[str, Any]

#: Header the fake kubelet sends; such requests skip faults and authorization.
KUBELET_HEADER = "X-Fake-Kubelet"
SERVER_VERSION = {
    "major": "1",
    "minor": "34",
    "gitVersion": "v1.34.0-fake",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2024-12-11T00:00:00Z",
    "goVersion": "go1.23.4",
    "compiler": "gc",
    "platform": "linux/amd64",
}
DEFAULT_NODE = "fake-node-0"
#: The namespaces that exist; a request for another one is 404, as for a missing namespace.
NAMESPACES = frozenset({"default", "kube-system", "kube-public"})
METRICS_GROUP = "metrics.k8s.io"
METRICS_VERSION = "v1beta1"
COORDINATION_GROUP = "coordination.k8s.io"
USER = "system:serviceaccount:default:default"
_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})

# --------------------------------------------------------------------------------------------
# Time


def rfc3339(t: float | None = None) -> str:
    """A metav1.Time: RFC 3339, UTC, whole seconds, ``Z``."""
    moment = datetime.fromtimestamp(time.time() if t is None else t, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def human_duration(seconds: float) -> str:
    """kubectl's age column in its first unit (``42s``, ``7m``, ``5h``, ``3d``). kubectl adds
    a second unit in some ranges (``2m3s``); no test reads an age."""
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    if s < 180 * 60:
        return f"{s // 60}m"
    if s < 48 * 3600:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


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
    fraction of its base unit. ValueError for anything the real server would refuse.

    The fake's own parser, not the product's: a fake that judged the product's quantities with
    the product's parser would agree with any bug in it."""
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
    """Why ``key`` is not a valid label key, or None."""
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
# Label selectors


class SelectorError(ValueError):
    """A selector that does not parse, or one the fake does not serve (400 BadRequest)."""


@dataclass(frozen=True, slots=True)
class Requirement:
    """One term of an equality-based label selector: ``op`` is ``=`` or ``!=``."""

    key: str
    op: str
    value: str

    def matches(self, labels: Mapping[str, str]) -> bool:
        # != matches an object without the label, as on the real server
        return (labels.get(self.key) == self.value) is (self.op == "=")


_EQ_TERM = re.compile(r"\s*([^=!\s]+)\s*(==|=|!=)\s*([^,\s]*)\s*")


def parse_label_selector(text: str) -> list[Requirement]:
    """``a=b,c!=d`` (``==`` reads as ``=``) into requirements that must all match: what the
    backend (``job=...``) and ``kubectl -l`` send. Set-based terms (``in``, ``notin``, ``key``,
    ``!key``) are not served: SelectorError, as for a malformed selector."""
    if not text.strip():
        return []
    reqs = []
    for term in text.split(","):
        m = _EQ_TERM.fullmatch(term)
        if m is None:
            raise SelectorError(
                f"unable to parse requirement: found '{term.strip()}', expected: key=value or"
                " key!=value (the fake serves no set-based selectors)"
            )
        key, op, value = m.groups()
        for shown, why in ((key, label_key_error(key)), (value, label_value_error(value))):
            if why is not None:
                raise SelectorError(f'unable to parse requirement: Invalid value: "{shown}": {why}')
        reqs.append(Requirement(key, "!=" if op == "!=" else "=", value))
    return reqs


def labels_match(reqs: list[Requirement], labels: Mapping[str, str] | None) -> bool:
    labels = labels or {}
    return all(r.matches(labels) for r in reqs)


# --------------------------------------------------------------------------------------------
# Strategic merge patch (of pods/status and pods/resize, the patches served)

#: The lists a strategic merge patch merges element by element, by their ``patchMergeKey``. In a
#: pod's status only ``conditions`` has one (``containerStatuses`` is replaced whole); in its
#: spec, ``containers`` (by name: what a resize patches).
_MERGE_KEYS = {"conditions": "type", "containers": "name"}


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Maps merge recursively, ``null`` deletes, lists with a merge key (:data:`_MERGE_KEYS`)
    merge by it, anything else replaces. Directives (``$patch``...) are not served: 400."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            raise ApiError(
                400, "BadRequest", f"the fake API server serves no patch directive {key}"
            )
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            result[key] = strategic_merge_patch(result.get(key), value)
        elif isinstance(value, list) and key in _MERGE_KEYS:
            result[key] = _merge_list(list(result.get(key) or []), value, _MERGE_KEYS[key])
        else:
            result[key] = copy.deepcopy(value)
    return result


def _merge_list(current: list[Any], patch: list[Any], key: str) -> list[Any]:
    result = copy.deepcopy(current)
    for element in patch:
        index = next(
            (
                i
                for i, e in enumerate(result)
                if isinstance(e, dict)
                and isinstance(element, dict)
                and e.get(key) == element.get(key)
            ),
            None,
        )
        if index is None:
            result.append(copy.deepcopy(element))
        else:
            result[index] = strategic_merge_patch(result[index], element)
    return result


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
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}
NOT_FOUND = "the server could not find the requested resource"


def status_error(code: int, message: str | None = None) -> ApiError:
    """A generic error of ``code`` with the reason and message the real server gives it."""
    reason = REASONS.get(code, "Unknown")
    if message is None:
        message = {
            429: "Too many requests, please try again later.",
            500: "Internal error occurred: injected fault",
            503: "the server is currently unable to handle the request",
            504: "the server was unable to return a response in the time allotted",
            410: "The resourceVersion for the provided watch is too old.",
        }.get(code, f"injected {reason}")
    return ApiError(code, reason, message)


def not_served(what: str) -> ApiError:
    """405 for a verb the fake does not serve on a resource it serves."""
    return ApiError(
        405,
        "MethodNotAllowed",
        f"the server does not allow this method on the requested resource ({what}: not served"
        " by the fake API server)",
    )


@dataclass(frozen=True, slots=True)
class Cause:
    field: str
    reason: str  # FieldValueRequired, FieldValueInvalid, ...
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
    def forbidden(path: str, why: str) -> Cause:
        return Cause(path, "FieldValueForbidden", f"Forbidden: {why}")

    @staticmethod
    def unsupported(path: str, value: Any, allowed: tuple[str, ...]) -> Cause:
        options = ", ".join(json.dumps(a) for a in allowed)
        return Cause(
            path,
            "FieldValueNotSupported",
            f"Unsupported value: {json.dumps(value)}: supported values: {options}",
        )


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
    """A namespaced resource and the verbs served on it (discovery lists them; any other verb
    is 405)."""

    name: str  # plural, as in the URL
    singular: str
    kind: str
    verbs: tuple[str, ...]
    short_names: tuple[str, ...] = ()
    #: subresource -> (kind, verbs)
    subresources: Mapping[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    #: the API group ("" for core/v1, served under /api) and version
    group: str = ""
    version: str = "v1"

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

    def verbs_of(self, subresource: str) -> tuple[str, ...]:
        return self.subresources[subresource][1] if subresource else self.verbs


RESOURCES: dict[str, Resource] = {
    r.name: r
    for r in (
        Resource(
            "pods",
            "pod",
            "Pod",
            ("create", "delete", "get", "list", "patch", "watch"),
            ("po",),
            subresources={
                "status": ("Pod", ("get", "patch", "update")),
                "binding": ("Binding", ("create",)),
                "resize": ("Pod", ("patch",)),
                "log": ("Pod", ("get",)),
            },
        ),
        # what the job master reports on its pods (core/v1, as kubectl describe reads them)
        Resource("events", "event", "Event", ("create", "get", "list", "patch"), ("ev",)),
        # the backend writes the job's Secret; the kubelet reads it for secretKeyRefs
        Resource("secrets", "secret", "Secret", ("create", "delete", "get", "update")),
        # one master per job (the backend's Lease): no status, no subresources
        Resource(
            "leases",
            "lease",
            "Lease",
            ("create", "delete", "get", "update"),
            group=COORDINATION_GROUP,
        ),
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
            "namespaced": True,
            "kind": res.kind,
            "verbs": list(res.verbs),
        }
        if res.short_names:
            entry["shortNames"] = list(res.short_names)
        resources.append(entry)
        for sub, (kind, verbs) in res.subresources.items():
            resources.append(
                {
                    "name": f"{res.name}/{sub}",
                    "singularName": "",
                    "namespaced": True,
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
                "name": "pods",
                "singularName": "",
                "namespaced": True,
                "kind": "PodMetrics",
                "verbs": ["list"],
            },
        ],
    }


def _api_group(name: str, version: str) -> Json:
    gv = {"groupVersion": f"{name}/{version}", "version": version}
    return {"name": name, "versions": [gv], "preferredVersion": gv}


# --------------------------------------------------------------------------------------------
# Decoding, defaulting and validation


def _labels_causes(meta: Json) -> list[Cause]:
    labels = meta.get("labels")
    if labels is not None and not isinstance(labels, dict):
        return [Cause.invalid("metadata.labels", str(labels), "must be a map")]
    causes: list[Cause] = []
    for key, value in (labels or {}).items():
        if (why := label_key_error(key)) is not None:
            causes.append(Cause.invalid("metadata.labels", key, why))
        if not isinstance(value, str):
            causes.append(Cause.invalid("metadata.labels", str(value), "must be a string"))
        elif (why := label_value_error(value)) is not None:
            causes.append(Cause.invalid("metadata.labels", value, why))
    return causes


def _name_causes(meta: Json, resource: str = "") -> list[Cause]:
    """The name rules: a DNS-1123 subdomain; for an event (whose core/v1 validation leaves the
    name alone) only the generic rule of any name: a valid path segment."""
    name = meta.get("name")
    if not name:
        return [Cause("metadata.name", "FieldValueRequired", "Required value: name is required")]
    if resource == "events":
        if name in (".", "..") or "/" in name or "%" in name:
            why = "may not be '.' or '..' and may not contain '/' or '%'"
            return [Cause.invalid("metadata.name", name, why)]
        return []
    if not is_dns1123_subdomain(name):
        return [Cause.invalid("metadata.name", name, DNS1123_SUBDOMAIN_MSG)]
    return []


def generate_name(prefix: str) -> str:
    """``metadata.generateName`` made a name, as the server's SimpleNameGenerator does: the
    prefix (cut to leave room) and five random characters of an alphabet without vowels."""
    alphabet = "bcdfghjklmnpqrstvwxz2456789"
    suffix = "".join(alphabet[b % len(alphabet)] for b in os.urandom(5))
    return prefix[: 63 - len(suffix)] + suffix


def _decode_quantities(obj: Json) -> None:
    """Canonicalize every container's resource quantities in place; a quantity that does not
    parse fails the whole request with 400, as it fails JSON decoding on the real server."""
    for container in (obj.get("spec") or {}).get("containers") or []:
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
                        f'Pod in version "v1" cannot be handled as a Pod: {QUANTITY_ERROR}',
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


def _lease_field_error(name: str, kind: str, value: Any, spec: Json) -> str | None:
    """Go's decoding error for one LeaseSpec field (a MicroTime is re-encoded in ``spec``)."""
    where = f"Go struct field LeaseSpec.spec.{name} of type"
    if kind == "string" and not isinstance(value, str):
        return f"json: cannot unmarshal {_go_type_name(value)} into {where} string"
    if kind == "int32" and (
        isinstance(value, bool) or not isinstance(value, int) or not -(2**31) <= value < 2**31
    ):
        return f"json: cannot unmarshal {_go_type_name(value)} into {where} int32"
    if kind == "MicroTime":
        if not isinstance(value, str):
            return f"json: cannot unmarshal {_go_type_name(value)} into Go value of type string"
        try:
            spec[name] = micro_time(value)
        except ValueError as e:
            return str(e)
    return None


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
            if (error := _lease_field_error(name, kind, value, spec)) is not None:
                break
    if error:
        raise ApiError(
            400, "BadRequest", f'Lease in version "v1" cannot be handled as a Lease: {error}'
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


_META_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:\d{2})")
#: Field lengths a core/v1 event with an ``eventTime`` may not exceed.
_EVENT_LIMITS = {"reportingInstance": 128, "action": 128, "reason": 128, "message": 1024}


def meta_time(text: str) -> str:
    """A metav1.Time as the server decodes and re-encodes it: RFC 3339 with a zone on the way
    in (a fraction allowed), UTC whole seconds with ``Z`` out. ValueError with Go's message."""
    if not _META_TIME.fullmatch(text):
        seconds = re.match(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?", text)
        rest = text[seconds.end() :] if seconds else text
        raise ValueError(
            f'parsing time "{text}" as "2006-01-02T15:04:05Z07:00": cannot parse "{rest}" as'
            f' "{"Z07:00" if seconds else "2006-01-02T15:04:05Z07:00"}"'
        )
    moment = datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _decode_event(event: Json) -> None:
    """An Event's times decoded and re-encoded as the server's JSON decoder does (a time that
    does not parse, or a count that is not an int32, fails the request with 400)."""
    error = None
    for name, decode in (
        ("firstTimestamp", meta_time),
        ("lastTimestamp", meta_time),
        ("eventTime", micro_time),
    ):
        value = event.get(name)
        if value is None:
            event.pop(name, None)
            continue
        try:
            event[name] = decode(value) if isinstance(value, str) else decode(str(value))
        except ValueError as e:
            error = str(e)
    count = event.get("count")
    if count is not None and (
        isinstance(count, bool) or not isinstance(count, int) or not -(2**31) <= count < 2**31
    ):
        error = f"json: cannot unmarshal {_go_type_name(count)} into Go struct field Event.count"
    if error:
        raise ApiError(
            400, "BadRequest", f'Event in version "v1" cannot be handled as a Event: {error}'
        )


def _event_causes(event: Json) -> list[Cause]:
    """What the real server checks of a core/v1 Event (legacyValidateEvent; the stricter rules,
    such as ``type`` being Normal or Warning, are the events.k8s.io API's): its namespace is
    its object's; with an ``eventTime`` (a "new" event) the reporting fields it needs."""
    namespace = event["metadata"]["namespace"]
    involved = event.get("involvedObject") or {}
    object_namespace = involved.get("namespace") or ""
    mismatch = Cause.invalid(
        "involvedObject.namespace", object_namespace, "does not match event.namespace"
    )
    if not event.get("eventTime"):
        wrong = (
            namespace not in ("", "default")
            if not object_namespace
            else (namespace != object_namespace)
        )
        return [mismatch] if wrong else []
    causes = []
    if not object_namespace and namespace not in ("default", "kube-system"):
        causes.append(mismatch)
    component = event.get("reportingComponent") or ""
    if not component:
        causes.append(Cause.required("reportingComponent"))
    elif (why := label_key_error(component)) is not None:
        causes.append(Cause.invalid("reportingComponent", component, why))
    for name, limit in _EVENT_LIMITS.items():
        value = event.get(name) or ""
        if not value and name != "message":
            causes.append(Cause.required(name))
        elif len(value) > limit:
            causes.append(Cause.invalid(name, "", f"can have at most {limit} characters"))
    return causes


#: The fields a list of events may be selected by (the server's event field label conversion),
#: and where each is in the object.
_EVENT_FIELDS = {
    "involvedObject.kind": ("involvedObject", "kind"),
    "involvedObject.namespace": ("involvedObject", "namespace"),
    "involvedObject.name": ("involvedObject", "name"),
    "involvedObject.uid": ("involvedObject", "uid"),
    "involvedObject.apiVersion": ("involvedObject", "apiVersion"),
    "involvedObject.resourceVersion": ("involvedObject", "resourceVersion"),
    "involvedObject.fieldPath": ("involvedObject", "fieldPath"),
    "reason": ("reason",),
    "reportingComponent": ("reportingComponent",),
    "source": ("source", "component"),
    "type": ("type",),
    "metadata.namespace": ("metadata", "namespace"),
    "metadata.name": ("metadata", "name"),
}


def _event_field(event: Json, label: str) -> str:
    value: Any = event
    for key in _EVENT_FIELDS[label]:
        value = value.get(key) if isinstance(value, dict) else None
    if label == "source" and not value:  # the server's GetAttrs falls back to this
        value = event.get("reportingComponent")
    return str(value or "")


@dataclass(frozen=True, slots=True)
class FieldRequirement:
    """One term of a field selector: ``label=value`` (``==``) or ``label!=value``."""

    label: str
    value: str
    equal: bool

    def matches(self, event: Json) -> bool:
        return (_event_field(event, self.label) == self.value) == self.equal


def parse_event_field_selector(text: str) -> list[FieldRequirement]:
    """A field selector on events (what ``kubectl describe`` sends: ``involvedObject.name=...,
    involvedObject.namespace=...``); SelectorError (400) for another field or syntax."""
    requirements = []
    for term in filter(None, (t.strip() for t in text.split(","))):
        match = re.fullmatch(r"([^=!]+)(==|!=|=)(.*)", term)
        if match is None:
            raise SelectorError(f"invalid selector: '{text}'; can't understand '{term}'")
        label, op, value = match.group(1).strip(), match.group(2), match.group(3).strip()
        if label not in _EVENT_FIELDS:
            raise SelectorError(
                f'"{label}" is not a known field selector: only "{", ".join(_EVENT_FIELDS)}"'
            )
        requirements.append(FieldRequirement(label, value, op != "!="))
    return requirements


def _default_pod(pod: Json) -> None:
    """The defaults a pod's reading depends on: its restart policy, its grace period (what a
    delete without one waits), and requests from limits (its QoS class)."""
    spec = pod.setdefault("spec", {})
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    # the ServiceAccount admission plugin's: a pod runs as its namespace's "default" account
    spec.setdefault("serviceAccountName", "default")
    for container in spec.get("containers") or []:
        if not isinstance(container, dict):
            continue
        resources = container.setdefault("resources", {})
        limits = resources.get("limits") or {}
        if limits:
            requests = resources.setdefault("requests", {})
            for name, value in limits.items():
                requests.setdefault(name, value)


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


def _resources_causes(resources: Json, path: str) -> list[Cause]:
    causes = []
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
    return causes


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
    causes += _resources_causes(container.get("resources") or {}, path)
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
        if isinstance(env, dict) and env.get("valueFrom") is not None:
            causes += _value_from_causes(env, f"{path}.env[{i}]")
    return causes


#: The fieldRef paths an env var may name (validEnvDownwardAPIFieldPathExpressions), and the
#: ones that the conversion of a downward-API field label accepts at all.
ENV_FIELD_PATHS = (
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "spec.nodeName",
    "spec.serviceAccountName",
    "status.hostIP",
    "status.hostIPs",
    "status.podIP",
    "status.podIPs",
)
_FIELD_LABELS = frozenset(
    {
        *ENV_FIELD_PATHS,
        *("metadata.annotations", "metadata.labels", "spec.restartPolicy", "spec.schedulerName"),
        "status.phase",
    }
)
_SUBSCRIPTED = re.compile(r"(metadata\.(?:labels|annotations))\['(.*)'\]|(.*)\[.*\]")
_VALUE_SOURCES = ("fieldRef", "resourceFieldRef", "configMapKeyRef", "secretKeyRef")


def _value_from_causes(env: Json, path: str) -> list[Cause]:
    """An env var's ``valueFrom`` as the real server validates it: one source, no ``value``
    beside it, and a ``fieldRef`` (its ``apiVersion`` defaulted to v1) that names a path an
    env var may read."""
    source = env["valueFrom"]
    where = f"{path}.valueFrom"
    if not isinstance(source, dict):
        return [Cause.invalid(where, str(source), "must be an object")]
    count = sum(1 for key in _VALUE_SOURCES if source.get(key) is not None)
    if count == 0:
        why = (
            "must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` or"
            " `secretKeyRef`"
        )
        return [Cause.invalid(where, "", why)]
    if count > 1:
        return [Cause.invalid(where, "", "may not have more than one field specified at a time")]
    if env.get("value"):
        return [Cause.invalid(where, "", "may not be specified when `value` is not empty")]
    ref = source.get("fieldRef")
    if ref is None:
        return []
    ref.setdefault("apiVersion", "v1")
    return _field_ref_causes(ref, f"{where}.fieldRef")


def _field_ref_causes(ref: Json, where: str) -> list[Cause]:
    field_path = str(ref.get("fieldPath") or "")
    if not field_path:
        return [Cause.required(f"{where}.fieldPath")]
    if ref["apiVersion"] != "v1":
        why = f"error converting fieldPath: unsupported pod version: {ref['apiVersion']}"
        return [Cause.invalid(f"{where}.fieldPath", field_path, why)]
    subscripted = _SUBSCRIPTED.fullmatch(field_path)
    if subscripted is not None and subscripted.group(1) is None:
        why = f"error converting fieldPath: field label does not support subscript: {field_path}"
        return [Cause.invalid(f"{where}.fieldPath", field_path, why)]
    if subscripted is not None:
        key = subscripted.group(2)
        bad_key = label_key_error(key.lower() if "annotations" in field_path else key)
        return [] if bad_key is None else [Cause.invalid(where, key, bad_key)]
    if field_path not in _FIELD_LABELS:
        why = f"error converting fieldPath: field label not supported: {field_path}"
        return [Cause.invalid(f"{where}.fieldPath", field_path, why)]
    if field_path not in ENV_FIELD_PATHS:
        return [Cause.unsupported(f"{where}.fieldPath", field_path, tuple(sorted(ENV_FIELD_PATHS)))]
    return []


def _without_resources(pod: Json) -> Json:
    """The pod with its containers' cpu and memory taken out: what a resize may not change."""
    rest = copy.deepcopy(pod)
    for container in (rest.get("spec") or {}).get("containers") or []:
        for values in (container.get("resources") or {}).values():
            if isinstance(values, dict):
                values.pop("cpu", None)
                values.pop("memory", None)
    return rest


_POD_UPDATE_MSG = (
    "pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only"
    " additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set"
    " to 1 if it was previously negative)"
)


def _pod_update_causes(old: Json, new: Json) -> list[Cause]:
    """ValidatePodUpdate, as far as this server's pods go: the metadata may change, of the spec
    only the containers' images."""
    specs = []
    for pod in (old, new):
        spec = copy.deepcopy(pod.get("spec") or {})
        for container in spec.get("containers") or []:
            if isinstance(container, dict):
                container.pop("image", None)
        specs.append(spec)
    return [] if specs[0] == specs[1] else [Cause.forbidden("spec", _POD_UPDATE_MSG)]


def _resize_causes(old: Json, new: Json) -> list[Cause]:
    """Why a resize to ``new`` is invalid (the real server's ValidatePodResize, as far as a
    single-container Guaranteed pod meets it)."""
    if _without_resources(old) != _without_resources(new):
        return [Cause.forbidden("spec", "only cpu and memory resources are mutable")]
    causes = []
    for i, container in enumerate(new["spec"].get("containers") or []):
        causes += _resources_causes(container.get("resources") or {}, f"spec.containers[{i}]")
    if not causes and qos_class(new) != qos_class(old):
        causes.append(
            Cause.forbidden("spec", "Pod QOS Class may not change as a result of resizing")
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
    return causes


def _secret_causes(secret: Json) -> list[Cause]:
    return [
        Cause.invalid(
            f"data[{key}]",
            key,
            "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g."
            " 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is"
            " '[-._a-zA-Z0-9]+')",
        )
        for key in secret.get("data") or {}
        if _CONFIG_KEY.fullmatch(key) is None
    ]


def _fold_secret(secret: Json) -> None:
    """``data`` must be base64; ``stringData`` is write-only: merged into ``data``."""
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


def _decode(res: Resource, obj: Json) -> list[Cause]:
    """Decode and default ``obj`` in place (400 for what does not decode); its validation
    causes (names and labels apart)."""
    if res.name == "pods":
        _decode_quantities(obj)
        _default_pod(obj)
        return _validate_pod(obj)
    if res.name == "secrets":
        _fold_secret(obj)
        return _secret_causes(obj)
    if res.name == "events":
        _decode_event(obj)
        return _event_causes(obj)
    _decode_lease(obj)
    return _lease_causes(obj)


# --------------------------------------------------------------------------------------------
# Tables (server-side printing for kubectl)


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
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        reason = "Unknown" if status.get("reason") == "NodeLost" else "Terminating"
    return reason, ready, total, restarts


def _col(name: str, description: str, priority: int = 0, fmt: str = "") -> Json:
    return {
        "name": name,
        "type": "string",
        "format": fmt,
        "description": description,
        "priority": priority,
    }


_POD_COLUMNS = [
    _col("Name", "Name must be unique within a namespace.", fmt="name"),
    _col("Ready", "The aggregate readiness state of this pod for accepting traffic."),
    _col("Status", "The aggregate status of the containers in this pod."),
    _col("Restarts", "The number of times the containers in this pod have been restarted."),
    _col("Age", "CreationTimestamp is the server time when this object was created."),
    _col("IP", "IP address allocated to the pod.", 1),
    _col("Node", "Name of the node the pod is assigned to.", 1),
]


def _pod_cells(pod: Json, now: float) -> list[Any]:
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    shown, ready, total, restarts = pod_display_status(pod)
    created = meta.get("creationTimestamp")
    age = datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp() if created else now
    return [
        meta.get("name", ""),
        f"{ready}/{total}",
        shown,
        str(restarts),
        human_duration(now - age),
        status.get("podIP") or "<none>",
        spec.get("nodeName") or "<none>",
    ]


def pod_table(pods: list[Json], include: str, list_meta: Json) -> Json:
    """What ``kubectl get pods`` asks for (``Accept: ...;as=Table``) and prints as it is."""
    now = time.time()
    rows = []
    for pod in pods:
        row: Json = {"cells": _pod_cells(pod, now)}
        if include == "Object":
            row["object"] = pod
        elif include != "None":
            row["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": pod.get("metadata") or {},
            }
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta,
        "columnDefinitions": _POD_COLUMNS,
        "rows": rows,
    }


# --------------------------------------------------------------------------------------------
# Audit and faults


@dataclass(frozen=True, slots=True)
class ApiCall:
    """One request, as an audit log records it. ``verb`` is the RBAC verb (get, list, watch,
    create, update, patch, delete); ``resource`` is empty for non-resource paths (discovery,
    /version), whose ``verb`` is the lower-cased HTTP method. ``code`` is the HTTP status sent,
    0 when the client went away before one was."""

    verb: str
    api_group: str
    resource: str
    subresource: str
    namespace: str
    name: str
    code: int
    from_kubelet: bool
    method: str
    path: str

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

    @property
    def target(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


@dataclass(slots=True)
class _Fault:
    """Requests (of ``verb`` on ``resource`` when set) fail with ``code`` until ``until`` or
    for the next ``remaining`` of them."""

    code: int
    until: float = math.inf
    remaining: int | None = None
    retry_after: int = 1
    message: str | None = None
    verb: str | None = None
    resource: str | None = None

    def applies(self, info: _RequestInfo) -> bool:
        return self.verb in (None, info.verb) and self.resource in (None, info.target)

    def error(self) -> ApiError:
        error = status_error(self.code, self.message)
        if self.code == 429:
            error.headers["Retry-After"] = str(self.retry_after)
            error.details = {"retryAfterSeconds": self.retry_after}
        return error


# --------------------------------------------------------------------------------------------
# Watches


@dataclass(frozen=True, slots=True)
class _Event:
    rv: int
    type: str  # ADDED, MODIFIED, DELETED
    resource: str
    obj: Json  # never mutated after commit
    old_labels: Mapping[str, str] | None = None  # a MODIFIED object's labels before it


class _Watcher:
    """One open watch: the events it matches, queued as the lines it sends. As the real
    watch cache does, a change that makes an object start matching the label selector is sent
    as ADDED, one that makes it stop matching as DELETED (a patch of a pod's labels)."""

    _CLOSE = b""

    def __init__(
        self, resource: str, namespace: str, labels: list[Requirement], bookmarks: bool
    ) -> None:
        self.resource, self.namespace, self.labels = resource, namespace, labels
        self.bookmarks = bookmarks
        self.queue: queue.SimpleQueue[bytes] = queue.SimpleQueue()

    def offer(self, event: _Event) -> None:
        meta = event.obj.get("metadata") or {}
        if event.resource != self.resource:
            return
        if self.namespace and meta.get("namespace", "") != self.namespace:
            return
        matches = labels_match(self.labels, meta.get("labels"))
        if event.type != "MODIFIED" or event.old_labels is None:
            if matches:
                self.send(event.type, event.obj)
            return
        matched = labels_match(self.labels, event.old_labels)
        if matches or matched:
            kind = "MODIFIED" if matches and matched else ("ADDED" if matches else "DELETED")
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


class LogSource(Protocol):
    """A node's kubelet, as ``pods/NAME/log`` reaches it (its ``/containerLogs`` endpoint)."""

    def container_log(
        self, namespace: str, name: str, container: str, options: PodLogOptions
    ) -> Iterator[bytes]: ...


class FakeApiServer:
    """A Kubernetes API server on ``127.0.0.1`` (see the module docstring). Use as a context
    manager.

    ``history_limit``: how many events are kept for watches to resume from; older ones are
    compacted away (a watch from before them gets 410 Expired).
    """

    def __init__(self, *, history_limit: int = 20000) -> None:
        #: The nodes a kubelet runs pods on; deleting a running pod bound to one is graceful.
        self.kubelet_nodes: set[str] = set()
        #: The kubelet of each node, that ``pods/NAME/log`` is proxied to.
        self.log_sources: dict[str, LogSource] = {}
        #: When False, ``metrics.k8s.io`` is absent: 404 on its paths, not in ``/apis``.
        self.serve_metrics = True
        #: When False, ``pods/resize`` is 404, as on a cluster older than 1.33.
        self.serve_resize = True
        #: Seconds between BOOKMARK events on watches that allow them.
        self.bookmark_interval_s = 5.0
        self._lock = threading.RLock()
        self._store: dict[str, dict[tuple[str, str], Json]] = {r: {} for r in RESOURCES}
        self._rv = 0
        self._history: deque[_Event] = deque()
        self._history_limit = history_limit
        self._compacted_rv = 0
        self._watchers: set[_Watcher] = set()
        self._faults: list[_Fault] = []
        self._forbidden: set[tuple[str, str]] = set()  # (verb, resource[/sub])
        self._calls: list[ApiCall] = []
        self._calls_lock = threading.Lock()
        self._metrics: dict[tuple[str, str], tuple[float, int, float, float]] = {}
        self._closed = False
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
        self._http.shutdown()
        with self._http.sockets_lock:
            sockets = list(self._http.open_sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._http.server_close()

    @property
    def closed(self) -> bool:
        return self._closed

    def write_kubeconfig(self, path: str | os.PathLike[str], namespace: str = "default") -> Path:
        """A kubeconfig for this server that the official client and kubectl accept (JSON,
        which is valid YAML). Its token is never checked: kubectl sends none over plain
        HTTP, the official client sends it."""
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
            "users": [{"name": "fake", "user": {"token": "fake-token"}}],
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
    ) -> None:
        """The next ``count`` API requests (optionally only of ``verb`` on ``resource``, e.g.
        ``"create"``, ``"pods"`` or ``"pods/status"``) get a ``code`` Status."""
        with self._lock:
            self._faults.append(
                _Fault(code, remaining=count, message=message, verb=verb, resource=resource)
            )

    def storm(self, seconds: float, code: int = 500) -> None:
        """Every API request fails with ``code`` for ``seconds``."""
        with self._lock:
            self._faults.append(_Fault(code, until=time.monotonic() + seconds))

    def throttle(self, seconds: float, retry_after: int = 1) -> None:
        """429 TooManyRequests with ``Retry-After: retry_after`` for ``seconds``."""
        with self._lock:
            self._faults.append(
                _Fault(429, until=time.monotonic() + seconds, retry_after=retry_after)
            )

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

    # -- test controls: watches --------------------------------------------------------------

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

    def rbac_verbs(self) -> set[tuple[str, str, str]]:
        """``(api_group, resource[/subresource], verb)`` of every resource request made by
        a client (not the kubelet)."""
        return {(c.api_group, c.rbac_resource, c.verb) for c in self.client_calls() if c.resource}

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

    def create_object(self, resource: str, obj: Json, namespace: str) -> Json:
        """Create an object in-process, with the same decoding, defaulting and validation
        (raises :class:`ApiError`)."""
        return self._create(RESOURCES[resource], copy.deepcopy(obj), namespace)

    # -- store -------------------------------------------------------------------------------

    def _commit(
        self, resource: str, key: tuple[str, str], obj: Json | None, kind: str, old: Json | None
    ) -> Json:
        """Write under the lock: bump the counter, store (or remove), record, notify; a
        removal lets the garbage collector delete what the object owned."""
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
        old_labels = (old["metadata"].get("labels") or {}) if old is not None else None
        event = _Event(self._rv, kind, resource, final, old_labels)
        self._history.append(event)
        while len(self._history) > self._history_limit:
            self._compacted_rv = self._history.popleft().rv
        for watcher in list(self._watchers):
            watcher.offer(event)
        if obj is None:
            self._collect_garbage(final["metadata"].get("uid", ""))
        return final

    def _collect_garbage(self, uid: str) -> None:
        """Background propagation, as the garbage collector does it after the owner is gone
        (here at once): a dependent none of whose owners remains is deleted, as by a client
        (a running pod on a kubelet gracefully). A dependent with another owner left stays,
        its reference to the gone one with it (the real collector removes that reference)."""
        live = {o["metadata"].get("uid") for objs in self._store.values() for o in objs.values()}
        for resource, objs in self._store.items():
            for key, obj in list(objs.items()):
                refs = obj["metadata"].get("ownerReferences") or []
                owners = {r.get("uid") for r in refs if isinstance(r, dict)}
                if uid not in owners or owners & live or key not in objs:
                    continue
                if not obj["metadata"].get("deletionTimestamp"):
                    self._delete(RESOURCES[resource], key[0], key[1], {})

    def _get_stored(self, res: Resource, namespace: str, name: str) -> Json:
        obj = self._store[res.name].get((namespace, name))
        if obj is None:
            raise ApiError(
                404, "NotFound", f'{res.qualified} "{name}" not found', res.details(name)
            )
        return obj

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
        if meta.get("namespace") and meta["namespace"] != namespace:
            raise ApiError(
                400,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent"
                " on the request",
            )
        meta["namespace"] = namespace
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = generate_name(str(meta["generateName"]))
        obj["kind"], obj["apiVersion"] = res.kind, res.api_version
        causes = _decode(res, obj)
        causes = _name_causes(meta, res.name) + _labels_causes(meta) + causes
        if causes:
            raise invalid(res.kind, meta.get("name") or "", causes, res.group)
        if res.name == "pods":
            obj["status"] = {"phase": "Pending", "qosClass": qos_class(obj)}
        for system in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion"):
            meta.pop(system, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = rfc3339()
        return obj

    def _create(self, res: Resource, obj: Json, namespace: str) -> Json:
        with self._lock:
            if namespace not in NAMESPACES:
                raise ApiError(
                    404,
                    "NotFound",
                    f'namespaces "{namespace}" not found',
                    {"name": namespace, "kind": "namespaces"},
                )
            obj = self._prepare_new(res, obj, namespace)
            key = (namespace, obj["metadata"]["name"])
            if key in self._store[res.name]:
                raise ApiError(
                    409,
                    "AlreadyExists",
                    f'{res.qualified} "{key[1]}" already exists',
                    res.details(key[1]),
                )
            return copy.deepcopy(self._commit(res.name, key, obj, "ADDED", None))

    def _update(
        self, res: Resource, namespace: str, name: str, new: Any, subresource: str = ""
    ) -> Json:
        """Replace an object, or a pod's status, with ``new`` (a whole object), at the
        resourceVersion it carries if any (409 if it is not the stored one)."""
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
            if not rv and res.name == "leases":
                raise invalid(
                    res.kind,
                    name,
                    [
                        Cause.invalid(
                            "metadata.resourceVersion", "0x0", "must be specified for an update"
                        )
                    ],
                    res.group,
                )
            if subresource == "status":
                updated = copy.deepcopy(old)
                updated["status"] = copy.deepcopy(new.get("status") or {})
            else:
                updated = self._replacement(res, old, new)
            if updated == old:
                return copy.deepcopy(old)  # a no-op write does not bump the resourceVersion
            return copy.deepcopy(
                self._commit(res.name, (namespace, name), updated, "MODIFIED", old)
            )

    def _replacement(self, res: Resource, old: Json, new: Json) -> Json:
        """``new`` decoded and validated as the replacement of ``old`` (a secret, a lease, an
        event, or a pod's metadata), its system fields kept."""
        updated = copy.deepcopy(new)
        updated["kind"], updated["apiVersion"] = res.kind, res.api_version
        umeta = updated["metadata"]
        for system in (
            "uid",
            "creationTimestamp",
            "namespace",
            "name",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
        ):
            if system in old["metadata"]:
                umeta[system] = old["metadata"][system]
            else:
                umeta.pop(system, None)
        causes = _labels_causes(umeta) + _decode(res, updated)
        if res.name == "pods":  # its status is the kubelet's, through pods/status
            updated["status"] = copy.deepcopy(old.get("status") or {})
            causes += _pod_update_causes(old, updated)
        if causes:
            raise invalid(res.kind, umeta["name"], causes, res.group)
        return updated

    def _patch(
        self,
        res: Resource,
        namespace: str,
        name: str,
        content_type: str,
        patch: Any,
        subresource: str = "status",
    ) -> Json:
        """A strategic merge patch (what the kubelet sends, and what the official client sends
        for a dict) of a pod's status, a pod (its metadata: :func:`_pod_update_causes`) or an
        event. A resourceVersion in the patch is a precondition."""
        if content_type != "application/strategic-merge-patch+json":
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - the fake API server accepts"
                f' only application/strategic-merge-patch+json (got "{content_type}")',
            )
        with self._lock:
            old = self._get_stored(res, namespace, name)
            patched = strategic_merge_patch(old, patch)
            if not isinstance(patched, dict):
                raise ApiError(400, "BadRequest", "the patched object is not an object")
            meta = patched.setdefault("metadata", {})
            patch_rv = (patch.get("metadata") or {}).get("resourceVersion")
            meta["resourceVersion"] = patch_rv or old["metadata"]["resourceVersion"]
            return self._update(res, namespace, name, patched, subresource)

    def _resize(self, namespace: str, name: str, content_type: str, patch: Any) -> Json:
        """A strategic merge patch of ``pods/NAME/resize``: the desired resources of the
        pod's containers change, nothing else may (422), the QoS class neither (422); the
        kubelet then actuates it and reports it in the status. As on 1.34+, a memory limit
        may go down (resizePolicy ``NotRequired``): the kubelet checks it against usage."""
        res = RESOURCES["pods"]
        if content_type != "application/strategic-merge-patch+json":
            raise ApiError(415, "UnsupportedMediaType", f'unsupported patch "{content_type}"')
        with self._lock:
            old = self._get_stored(res, namespace, name)
            patched = strategic_merge_patch(old, patch)
            if not isinstance(patched, dict):
                raise ApiError(400, "BadRequest", "the patched object is not an object")
            _decode_quantities(patched)
            causes = _resize_causes(old, patched)
            if causes:
                raise invalid(res.kind, name, causes)
            if patched == old:
                return copy.deepcopy(old)
            return copy.deepcopy(
                self._commit(res.name, (namespace, name), patched, "MODIFIED", old)
            )

    def _delete(self, res: Resource, namespace: str, name: str, options: Json) -> Json:
        """Delete one object, or mark it for deletion with its grace period (:meth:`_grace`):
        the kubelet stops it, then removes it. Returns the object as the real server does."""
        with self._lock:
            old = self._get_stored(res, namespace, name)
            meta = old["metadata"]
            self._check_preconditions(res, old, options.get("preconditions") or {})
            propagation = options.get("propagationPolicy") or "Background"
            if propagation != "Background":
                raise invalid(
                    "DeleteOptions",
                    "",
                    [Cause.unsupported("propagationPolicy", propagation, ("Background",))],
                )
            grace = self._grace(res, old, options.get("gracePeriodSeconds"))
            if grace == 0:
                return copy.deepcopy(
                    self._commit(res.name, (namespace, name), None, "DELETED", old)
                )
            if meta.get("deletionTimestamp") and grace >= int(
                meta.get("deletionGracePeriodSeconds") or 0
            ):
                return copy.deepcopy(old)  # already marked, with no longer a grace
            updated = copy.deepcopy(old)
            updated["metadata"]["deletionTimestamp"] = rfc3339(time.time() + grace)
            updated["metadata"]["deletionGracePeriodSeconds"] = grace
            return copy.deepcopy(
                self._commit(res.name, (namespace, name), updated, "MODIFIED", old)
            )

    def _grace(self, res: Resource, obj: Json, asked: int | None) -> int:
        """The seconds a delete leaves the object for: a pod's grace period (the one asked,
        else its spec's) while its node's kubelet is there to stop it, and not ended; else 0."""
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        graceful = (
            res.name == "pods"
            and spec.get("nodeName") in self.kubelet_nodes
            and status.get("phase") not in _TERMINAL_PHASES
        )
        if not graceful:
            return 0
        return int(spec.get("terminationGracePeriodSeconds", 30) if asked is None else asked)

    def _check_preconditions(self, res: Resource, obj: Json, pre: Json) -> None:
        meta, name = obj["metadata"], obj["metadata"]["name"]
        for field_name, key in (("UID", "uid"), ("ResourceVersion", "resourceVersion")):
            if pre.get(key) and pre[key] != meta.get(key):
                raise ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {res.qualified} "{name}": Precondition'
                    f" failed: {field_name} in precondition: {pre[key]}, {field_name} in object"
                    f" meta: {meta.get(key)}",
                    res.details(name),
                )

    # -- lists and watches -------------------------------------------------------------------

    def _select(
        self,
        res: Resource,
        namespace: str,
        labels: list[Requirement],
        fields: list[FieldRequirement] | None = None,
    ) -> list[Json]:
        return [
            obj
            for key, obj in sorted(self._store[res.name].items())
            if (not namespace or key[0] == namespace)
            and labels_match(labels, obj["metadata"].get("labels"))
            and all(f.matches(obj) for f in fields or ())
        ]

    def _list(
        self, res: Resource, namespace: str, query: Mapping[str, str]
    ) -> tuple[Json, list[Json]]:
        labels = parse_label_selector(query.get("labelSelector", ""))
        fields: list[FieldRequirement] = []
        if query.get("fieldSelector") and res.name == "events":
            fields = parse_event_field_selector(query["fieldSelector"])
        elif query.get("fieldSelector"):
            raise SelectorError(f"field selectors on {res.name} are not served by the fake")
        with self._lock:
            selected = self._select(res, namespace, labels, fields)
            limit = int(query.get("limit") or 0)
            if 0 < limit < len(selected):
                raise ApiError(
                    400,
                    "BadRequest",
                    f"a list of {len(selected)} with limit {limit}: the fake API server does not"
                    " paginate",
                )
            return {"resourceVersion": str(self._rv)}, copy.deepcopy(selected)

    def _bookmark(self, res: Resource) -> Json:
        return {
            "kind": res.kind,
            "apiVersion": res.api_version,
            "metadata": {"resourceVersion": str(self._rv)},
        }

    def _open_watch(self, res: Resource, namespace: str, query: Mapping[str, str]) -> _Watcher:
        """A watch from ``resourceVersion`` (the events since, or ERROR 410 once they are
        compacted away), or without one from the current objects, each as ADDED."""
        labels = _selectors(query)
        bookmarks = query.get("allowWatchBookmarks") in ("1", "true", "True")
        watcher = _Watcher(res.name, namespace, labels, bookmarks)
        rv_text = query.get("resourceVersion", "")
        with self._lock:
            if self._closed:
                watcher.close()
                return watcher
            if rv_text in ("", "0"):
                for obj in self._select(res, namespace, labels):
                    watcher.send("ADDED", obj)
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
        with self._lock:
            denied = (info.verb, info.target) in self._forbidden
        if not info.is_resource or not denied:
            return
        subject = f'{info.resource} "{info.name}"' if info.name else info.resource
        details: Json = {"kind": info.resource}
        if info.name:
            details["name"] = info.name
        if info.group:
            details["group"] = info.group
        raise ApiError(
            403,
            "Forbidden",
            f'{subject} is forbidden: User "{USER}" cannot {info.verb} resource'
            f' "{info.target}" in API group "{info.group}" in the namespace "{info.namespace}"',
            details,
        )

    def _take_fault(self, info: _RequestInfo) -> _Fault | None:
        """The fault to apply to a request, if any; consumes a counted one."""
        now = time.monotonic()
        with self._lock:
            self._faults = [
                f
                for f in self._faults
                if f.until > now and (f.remaining is None or f.remaining > 0)
            ]
            fault = next((f for f in self._faults if f.applies(info)), None)
            if fault is not None and fault.remaining is not None:
                fault.remaining -= 1
        return fault


def _query_bool(query: Mapping[str, str], key: str) -> bool:
    """A boolean query parameter as the server converts it: absent, ``0`` or ``false`` (any
    case) is False, anything else (``1``, ``True``, even empty) True."""
    if key not in query:
        return False
    return not (query[key] == "0" or query[key].lower() == "false")


def _query_int(query: Mapping[str, str], key: str) -> int | None:
    if key not in query:
        return None
    try:
        return int(query[key])
    except ValueError:
        raise ApiError(
            400, "BadRequest", f'strconv.ParseInt: parsing "{query[key]}": invalid syntax'
        ) from None


def pod_log_options(name: str, query: Mapping[str, str]) -> PodLogOptions:
    """A log request's query decoded (400 for what does not decode) and validated (422
    PodLogOptions, as ValidatePodLogOptions)."""
    since_time = None
    if query.get("sinceTime"):
        try:
            since_time = datetime.fromisoformat(query["sinceTime"].replace("Z", "+00:00"))
        except ValueError:
            raise ApiError(
                400, "BadRequest", f'parsing time "{query["sinceTime"]}" as RFC 3339: invalid'
            ) from None
        if since_time.tzinfo is None:
            raise ApiError(
                400, "BadRequest", f'parsing time "{query["sinceTime"]}": missing time zone'
            )
    options = PodLogOptions(
        container=query.get("container", ""),
        follow=_query_bool(query, "follow"),
        previous=_query_bool(query, "previous"),
        since_seconds=_query_int(query, "sinceSeconds"),
        since_time=since_time.timestamp() if since_time is not None else None,
        timestamps=_query_bool(query, "timestamps"),
        tail_lines=_query_int(query, "tailLines"),
        limit_bytes=_query_int(query, "limitBytes"),
    )
    causes = []
    if options.tail_lines is not None and options.tail_lines < 0:
        causes.append(
            Cause.invalid("tailLines", options.tail_lines, "must be greater than or equal to 0")
        )
    if options.limit_bytes is not None and options.limit_bytes < 1:
        causes.append(Cause.invalid("limitBytes", options.limit_bytes, "must be greater than 0"))
    if options.since_seconds is not None and options.since_time is not None:
        causes.append(
            Cause.forbidden("", "at most one of `sinceTime` or `sinceSeconds` may be specified")
        )
    elif options.since_seconds is not None and options.since_seconds < 1:
        causes.append(
            Cause.invalid("sinceSeconds", options.since_seconds, "must be greater than 0")
        )
    if causes:
        raise invalid("PodLogOptions", name, causes)
    return options


def log_container(pod: Json, asked: str) -> str:
    """The container a log request reads: the one named, which the pod must have, else the
    pod's only one (400 otherwise, as the real server's validateContainer)."""
    name = pod["metadata"]["name"]
    names = [str(c.get("name", "")) for c in pod["spec"].get("containers") or []]
    if asked and asked not in names:
        raise ApiError(400, "BadRequest", f"container {asked} is not valid for pod {name}")
    if asked:
        return asked
    if len(names) == 1:
        return names[0]
    if not names:
        raise ApiError(400, "BadRequest", f"a container name must be specified for pod {name}")
    raise ApiError(
        400,
        "BadRequest",
        f"a container name must be specified for pod {name}, choose one of: [{' '.join(names)}]",
    )


def _selectors(query: Mapping[str, str]) -> list[Requirement]:
    if query.get("fieldSelector"):
        raise SelectorError("field selectors are not served by the fake API server")
    return parse_label_selector(query.get("labelSelector", ""))


# --------------------------------------------------------------------------------------------
# HTTP


def route(method: str, path: str, query: dict[str, str]) -> _RequestInfo:
    """Where a request goes, with its RBAC verb (the real server's RequestInfo)."""
    info = _RequestInfo(method, path, query, verb=method.lower())
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 3:
        info.version, rest = parts[1], parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 4:
        info.group, info.version, rest = parts[1], parts[2], parts[3:]
    else:
        return info  # discovery, /version
    info.is_resource = True
    if len(rest) >= 3 and rest[0] == "namespaces":
        info.namespace, rest = rest[1], rest[2:]
    info.resource = rest[0]
    info.name = rest[1] if len(rest) > 1 else ""
    info.subresource = "/".join(rest[2:])
    info.watch = query.get("watch", "") in ("1", "true", "True")
    if method == "GET":
        info.verb = "watch" if info.watch else ("get" if info.name else "list")
    elif method == "DELETE":
        info.verb = "delete" if info.name else "deletecollection"
    else:
        info.verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, info.verb)
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
        self._record(code)  # before the client can see the response
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache, private")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _serve(self, method: str) -> None:
        split = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        info = route(method, split.path, query)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length > 0 else b""
        from_kubelet = self.headers.get(KUBELET_HEADER) is not None
        self._info, self._from_kubelet, self._recorded = info, from_kubelet, False
        try:
            if not from_kubelet:
                fault = self.api._take_fault(info)
                if fault is not None:
                    raise fault.error()
                self.api._authorize(info)
            if self.api.closed:
                raise status_error(503, "the server is shutting down")
            if not info.is_resource:
                self._discovery(info.path.rstrip("/"))
            elif info.group == METRICS_GROUP:
                self._metrics(info)
            elif info.watch and method == "GET":
                self._serve_watch(info)
            elif info.subresource == "log":
                self._serve_log(info)
            else:
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
                resource=info.resource,
                subresource=info.subresource,
                namespace=info.namespace,
                name=info.name,
                code=code,
                from_kubelet=self._from_kubelet,
                method=info.method,
                path=self.path,
            )
        )

    # -- routes ------------------------------------------------------------------------------

    def _resource(self, info: _RequestInfo) -> Resource:
        """The served resource a request names, its verb served on it; else 404 or 405."""
        res = resource_for(info.group, info.version, info.resource)
        if res is None or (info.subresource and info.subresource not in res.subresources):
            raise ApiError(404, "NotFound", NOT_FOUND, {})
        if info.subresource == "resize" and not self.api.serve_resize:
            raise ApiError(404, "NotFound", NOT_FOUND, {})
        if not info.namespace and (info.name or info.verb not in ("list", "watch")):
            raise ApiError(404, "NotFound", NOT_FOUND)
        if info.verb not in res.verbs_of(info.subresource):
            raise not_served(f"{info.verb} on {res.qualified}")
        return res

    def _dispatch(self, info: _RequestInfo, body: bytes) -> None:
        res = self._resource(info)
        api, namespace, name = self.api, info.namespace, info.name
        if info.verb == "get":
            with api._lock:
                obj = copy.deepcopy(api._get_stored(res, namespace, name))
            if self._accepts_table() and res.name == "pods":
                table = pod_table([obj], info.query.get("includeObject", "Metadata"), {})
                self._send_json(200, table)
            else:
                self._send_json(200, obj)
        elif info.verb == "list":
            meta, items = api._list(res, namespace, info.query)
            if self._accepts_table() and res.name == "pods":
                table = pod_table(items, info.query.get("includeObject", "Metadata"), meta)
                self._send_json(200, table)
                return
            for item in items:
                item.pop("kind", None)
                item.pop("apiVersion", None)
            listing = {"kind": f"{res.kind}List", "apiVersion": res.api_version}
            self._send_json(200, {**listing, "metadata": meta, "items": items})
        elif info.verb == "create" and info.subresource == "binding":
            self._bind(namespace, name, self._json_body(body))
        elif info.verb == "create":
            self._send_json(201, api._create(res, self._json_body(body), namespace))
        elif info.verb == "update":
            obj = api._update(res, namespace, name, self._json_body(body), info.subresource)
            self._send_json(200, obj)
        elif info.verb == "patch" and info.subresource == "resize":
            content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            self._send_json(200, api._resize(namespace, name, content_type, self._json_body(body)))
        elif info.verb == "patch":
            content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            patch = self._json_body(body)
            self._send_json(
                200, api._patch(res, namespace, name, content_type, patch, info.subresource)
            )
        else:  # delete
            options = self._json_body(body)
            if "gracePeriodSeconds" in info.query and options.get("gracePeriodSeconds") is None:
                options["gracePeriodSeconds"] = int(info.query["gracePeriodSeconds"])
            if "propagationPolicy" in info.query and not options.get("propagationPolicy"):
                options["propagationPolicy"] = info.query["propagationPolicy"]
            self._send_json(200, api._delete(res, namespace, name, options))

    def _accepts_table(self) -> bool:
        return "as=Table" in self.headers.get("Accept", "")

    def _json_body(self, body: bytes) -> Any:
        if not body:
            return {}
        try:
            return json.loads(body)
        except ValueError as e:
            raise ApiError(400, "BadRequest", f"the request body is not valid JSON: {e}") from e

    def _discovery(self, path: str) -> None:
        """What kubectl reads before it acts: the version and the resources served."""
        api = self.api
        groups = [_api_group(COORDINATION_GROUP, "v1")]
        if api.serve_metrics:
            groups.append(_api_group(METRICS_GROUP, METRICS_VERSION))
        bodies = {
            "/version": SERVER_VERSION,
            "/api": {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": f"127.0.0.1:{api.port}"}
                ],
            },
            "/api/v1": _api_resource_list(),
            "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups},
            f"/apis/{COORDINATION_GROUP}/v1": _api_resource_list(COORDINATION_GROUP),
        }
        if api.serve_metrics:
            bodies[f"/apis/{METRICS_GROUP}/{METRICS_VERSION}"] = _metrics_resource_list()
        if path not in bodies:
            raise ApiError(404, "NotFound", NOT_FOUND, {})
        self._send_json(200, bodies[path])

    def _metrics(self, info: _RequestInfo) -> None:
        """``metrics.k8s.io`` PodMetrics, listed by label selector: what the backend reads."""
        api = self.api
        if not api.serve_metrics or info.version != METRICS_VERSION or info.resource != "pods":
            raise ApiError(404, "NotFound", NOT_FOUND, {})
        if info.verb != "list" or not info.namespace:
            raise not_served(f"{info.verb} on pods.{METRICS_GROUP}")
        labels = _selectors(info.query)
        with api._lock:
            found = [api._pod_metrics(ns, name) for ns, name in sorted(api._metrics)]
        items = [
            m
            for m in found
            if m is not None
            and m["metadata"]["namespace"] == info.namespace
            and labels_match(labels, m["metadata"]["labels"])
        ]
        self._send_json(
            200,
            {
                "kind": "PodMetricsList",
                "apiVersion": f"{METRICS_GROUP}/{METRICS_VERSION}",
                "metadata": {},
                "items": items,
            },
        )

    def _bind(self, namespace: str, name: str, binding: Json) -> None:
        """Assign a pod to a node, as the scheduler does: ``spec.nodeName`` and the
        ``PodScheduled`` condition."""
        api = self.api
        target = (binding.get("target") or {}).get("name")
        if not target:
            raise invalid("Binding", name, [Cause.required("target.name")])
        with api._lock:
            pod = api._get_stored(RESOURCES["pods"], namespace, name)
            if pod["metadata"].get("deletionTimestamp"):
                raise ApiError(
                    409, "Conflict", f"pod {name} is being deleted, cannot be assigned to a host"
                )
            if current := pod["spec"].get("nodeName"):
                raise ApiError(
                    409,
                    "Conflict",
                    f'pod {name} is already assigned to node "{current}"',
                    {"name": name, "kind": "pods"},
                )
            updated = copy.deepcopy(pod)
            updated["spec"]["nodeName"] = target
            status = updated.setdefault("status", {})
            scheduled = {
                "type": "PodScheduled",
                "status": "True",
                "lastProbeTime": None,
                "lastTransitionTime": rfc3339(),
            }
            others = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
            status["conditions"] = [scheduled, *others]
            api._commit("pods", (namespace, name), updated, "MODIFIED", pod)
        success = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
        self._send_json(201, {**success, "code": 201})

    def _serve_watch(self, info: _RequestInfo) -> None:
        """Chunked newline-delimited events until ``timeoutSeconds``, :meth:`expire_watches`
        or the server's close; a BOOKMARK every ``bookmark_interval_s`` when allowed."""
        api = self.api
        res = self._resource(info)
        watcher = api._open_watch(res, info.namespace, info.query)
        timeout = float(info.query.get("timeoutSeconds") or 0)
        deadline = time.monotonic() + timeout if timeout > 0 else math.inf
        self._record(200)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        next_mark = time.monotonic() + api.bookmark_interval_s
        try:
            while (wait := min(deadline - time.monotonic(), 0.25)) > 0:
                try:
                    line = watcher.queue.get(timeout=wait)
                except queue.Empty:
                    if api.closed:
                        break
                    if watcher.bookmarks and time.monotonic() >= next_mark:
                        with api._lock:
                            watcher.send("BOOKMARK", api._bookmark(res))
                        next_mark = time.monotonic() + api.bookmark_interval_s
                    continue
                chunk, closing = self._drain(watcher, line)
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

    def _serve_log(self, info: _RequestInfo) -> None:
        """``pods/NAME/log``: the options validated and the container chosen here, the rest
        proxied to the kubelet of the pod's node (an unscheduled pod's log is empty); its
        answer streamed back as plain text (chunked), its refusal as a Status."""
        api = self.api
        res = self._resource(info)
        options = pod_log_options(info.name, info.query)
        with api._lock:
            pod = copy.deepcopy(api._get_stored(res, info.namespace, info.name))
        container = log_container(pod, options.container)
        node = pod["spec"].get("nodeName")
        chunks: Iterator[bytes] = iter(())
        if node:
            source = api.log_sources.get(node)
            if source is None:  # no kubelet answers for that node
                raise ApiError(
                    500,
                    "InternalError",
                    f'Get "https://{node}:10250/containerLogs/{info.namespace}/{info.name}/'
                    f'{container}": dial tcp: lookup {node}: no such host',
                )
            chunks = source.container_log(info.namespace, info.name, container, options)
        self._record(200)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        try:
            for chunk in chunks:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.close_connection = True

    @staticmethod
    def _drain(watcher: _Watcher, first: bytes) -> tuple[list[bytes], bool]:
        """``first`` and what is already queued behind it (one write for a burst), and
        whether the watch is to end after them."""
        chunk: list[bytes] = []
        line = first
        while line != _Watcher._CLOSE:
            chunk.append(line)
            if len(chunk) >= 256:
                return chunk, False
            try:
                line = watcher.queue.get_nowait()
            except queue.Empty:
                return chunk, False
        return chunk, True
