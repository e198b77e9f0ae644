"""The version ranges of pyproject.toml and the constraints files that test their ends agree.

`.ci/bounds` installs each file of constraints/ and runs the provider and component tests there
(docs/install.md); that takes about half an hour, so it is run by hand. What it proves holds only
while each file pins what its name says: the lower file the ranges' lower bounds, the upper
files versions inside the ranges, constraints.txt (what .ci/run tests) inside them too. A range
moved without its end, or a pin moved out of its range, fails here at once.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
#: The packages whose versions are ranges tested at both ends.
RANGED = ("apache-airflow", "kfp", "kfp-kubernetes", "kubernetes")
ENDS = sorted((REPO / "constraints").glob("*.txt"))


def _extras() -> dict[str, list[Requirement]]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    return {name: [Requirement(r) for r in reqs] for name, reqs in extras.items()}


def _ranges() -> dict[str, SpecifierSet]:
    """Each ranged package's range; one range however many extras name it."""
    ranges: dict[str, SpecifierSet] = {}
    for reqs in _extras().values():
        for req in reqs:
            name = canonicalize_name(req.name)
            if name in RANGED:
                assert ranges.setdefault(name, req.specifier) == req.specifier, name
    return ranges


def _pins(path: Path) -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for text in path.read_text(encoding="utf-8").splitlines():
        pin = text.split("#", 1)[0].strip()
        if pin:
            name, _, version = pin.partition("==")
            pins[canonicalize_name(name)] = Version(version)
    return pins


def test_every_ranged_package_has_a_range_with_both_ends() -> None:
    ranges = _ranges()
    assert sorted(ranges) == sorted(RANGED)
    for name, spec in ranges.items():
        operators = sorted(s.operator for s in spec)
        assert operators == ["<", ">="], f"{name}{spec}: want >=LOWER,<UPPER"


@pytest.mark.parametrize("path", [REPO / "constraints.txt", *ENDS], ids=lambda p: p.name)
def test_each_constraints_file_pins_versions_inside_the_ranges(path: Path) -> None:
    pins = _pins(path)
    for name, spec in _ranges().items():
        if name in pins:
            assert pins[name] in spec, f"{path.name}: {name}=={pins[name]} is outside {spec}"


def test_the_lower_end_pins_each_range_at_its_lower_bound() -> None:
    pins = _pins(REPO / "constraints" / "lower.txt")
    for name, spec in _ranges().items():
        (lower,) = (Version(s.version) for s in spec if s.operator == ">=")
        assert pins[name].release[: len(lower.release)] == lower.release, (
            f"lower.txt: {name}=={pins[name]}, the range starts at {lower}"
        )


def test_torch_is_the_train_extra_only_pinned_as_the_constraints_pin_it() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert all(Requirement(r).name != "torch" for r in project["dependencies"])
    (torch,) = (r for r in _extras()["train"] if r.name == "torch")
    assert str(torch.specifier) == f"=={_pins(REPO / 'constraints.txt')['torch']}"
    for path in ENDS:
        assert _pins(path).get("torch") in (None, _pins(REPO / "constraints.txt")["torch"])
