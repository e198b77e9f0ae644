"""Static checks over the project's own source (``ast``, no import): what the security tests
forbid, as functions that return findings, so that each rule can be shown to catch a bad
snippet as well as to pass the real tree.

A finding is ``"path:line: what"``; a test asserts the list is empty (less the allow-list).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Modules whose loading runs code chosen by whoever wrote the bytes.
UNSAFE_MODULES = frozenset(
    {"pickle", "_pickle", "cPickle", "marshal", "shelve", "dill", "cloudpickle", "joblib"}
)
#: Submodules that unpickle what arrives on a socket or a pipe.
UNSAFE_SUBMODULES = frozenset({"multiprocessing.connection", "multiprocessing.managers"})
#: Calls that unpickle whatever file or buffer they are given.
UNSAFE_ATTRIBUTE_CALLS = frozenset({"read_pickle", "unsafe_load", "full_load", "full_load_all"})
SAFE_YAML_LOADERS = frozenset({"SafeLoader", "CSafeLoader", "BaseLoader", "CBaseLoader"})

#: Calls that hand SQL text to the database.
SQL_SINKS = frozenset(
    {"text", "literal_column", "execute", "executemany", "executescript", "exec_driver_sql"}
)


def python_files(*dirs: str) -> Iterator[Path]:
    for name in dirs:
        yield from sorted((ROOT / name).rglob("*.py"))


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _where(path: Path | str, node: ast.AST) -> str:
    shown = path.relative_to(ROOT) if isinstance(path, Path) and path.is_absolute() else path
    return f"{shown}:{getattr(node, 'lineno', 0)}"


def _dotted(node: ast.AST) -> str:
    """``torch.load`` for ``torch.load``; ``""`` for anything that is not a dotted name."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else ""
    return ""


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _is_true(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def deserialisation_findings(tree: ast.Module, path: Path | str) -> list[str]:
    """Imports and calls that can run code from the bytes they read (see the module doc)."""
    found: list[str] = []
    aliases: dict[str, str] = {}  # local name -> the module or function it is
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                aliases[alias.asname or alias.name.split(".")[0]] = alias.name
                if alias.name.split(".")[0] in UNSAFE_MODULES or alias.name in UNSAFE_SUBMODULES:
                    found.append(f"{_where(path, node)}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                aliases[alias.asname or alias.name] = full
                if (
                    node.module.split(".")[0] in UNSAFE_MODULES
                    or node.module in UNSAFE_SUBMODULES
                    or full in UNSAFE_SUBMODULES
                ):
                    found.append(f"{_where(path, node)}: from {node.module} import {alias.name}")
    safe_loaders = set(SAFE_YAML_LOADERS)
    classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    grew = True
    while grew:  # a loader class of the module's own is safe when it extends a safe one
        fresh = {
            c.name
            for c in classes
            if c.name not in safe_loaders
            and any(_dotted(b).split(".")[-1] in safe_loaders for b in c.bases)
        }
        safe_loaders |= fresh
        grew = bool(fresh)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        head, _, rest = name.partition(".")
        resolved = f"{aliases.get(head, head)}.{rest}" if rest else aliases.get(head, head)
        where = _where(path, node)
        if resolved in ("eval", "exec", "compile", "builtins.eval", "builtins.exec"):
            found.append(f"{where}: {name}() runs code from data")
        elif resolved == "torch.load" and not _is_true(_keyword(node, "weights_only")):
            found.append(f"{where}: torch.load without weights_only=True")
        elif resolved in ("yaml.load", "yaml.load_all"):
            loader = _keyword(node, "Loader")
            if loader is None and len(node.args) > 1:
                loader = node.args[1]
            if loader is None or _dotted(loader).split(".")[-1] not in safe_loaders:
                found.append(f"{where}: {name} without a safe Loader")
        elif resolved in ("numpy.load", "np.load") and _is_true(_keyword(node, "allow_pickle")):
            found.append(f"{where}: {name}(allow_pickle=True)")
        elif isinstance(node.func, ast.Attribute) and node.func.attr in UNSAFE_ATTRIBUTE_CALLS:
            found.append(f"{where}: {name}()")
    return found


def _builds_text(node: ast.AST, assigned: dict[str, list[ast.expr]], seen: set[str]) -> bool:
    """Whether ``node`` is a string built at run time (f-string, ``+``, ``%``, ``.format``,
    ``.join``, ``.replace``), directly or through a name assigned such a value in the module."""
    if isinstance(node, ast.JoinedStr):
        return any(isinstance(v, ast.FormattedValue) for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mod):
        return True
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("format", "join", "replace", "format_map")
    ):
        return True
    if isinstance(node, ast.IfExp):
        return _builds_text(node.body, assigned, seen) or _builds_text(node.orelse, assigned, seen)
    if isinstance(node, ast.Name) and node.id not in seen:
        seen.add(node.id)
        return any(_builds_text(v, assigned, seen) for v in assigned.get(node.id, []))
    return False


def sql_findings(tree: ast.Module, path: Path | str) -> list[str]:
    """SQL sinks whose statement is text built at run time; ``text()`` and ``literal_column``
    must moreover take a literal, since their argument is SQL whatever it is."""
    assigned: dict[str, list[ast.expr]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    assigned.setdefault(target.id, []).append(node.value)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if node.value is not None:
                assigned.setdefault(node.target.id, []).append(node.value)
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            # "sql += ..." extends a string: record it as the "+" it is
            grown = ast.BinOp(left=ast.Name(node.target.id), op=node.op, right=node.value)
            assigned.setdefault(node.target.id, []).append(grown)
    found: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name not in SQL_SINKS or not node.args:
            continue
        statement = node.args[0]
        where = _where(path, node)
        if _builds_text(statement, assigned, set()):
            found.append(f"{where}: {name}() gets SQL text built at run time")
        elif name in ("text", "literal_column") and not _literal(statement):
            found.append(f"{where}: {name}() of a non-literal")
    return found


def _literal(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.IfExp):
        return _literal(node.body) and _literal(node.orelse)
    return False


def scan(files: Iterable[Path], rule: str) -> list[str]:
    check = deserialisation_findings if rule == "deserialisation" else sql_findings
    return [finding for path in files for finding in check(parse(path), path)]
