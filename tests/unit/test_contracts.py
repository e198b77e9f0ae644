"""The public documents: quantities, job spec validation, schemas, round trips."""

from __future__ import annotations

import dataclasses
import json
import random

import jsonschema
import pytest

from dlrover_kfp.core.documents import json_schema, load_text, parse, to_dict
from dlrover_kfp.core.plan import NodeGroup, ResourcePlan, Stage
from dlrover_kfp.core.profile import JobProfile
from dlrover_kfp.core.quantity import format_cpu, format_memory, parse_cpu, parse_memory_mb
from dlrover_kfp.core.spec import JobSpec, NodeRequest, Quota
from dlrover_kfp.errors import SpecError
from tests.factories import make_profile

GOOD = {
    "name": "ctr-daily",
    "scenario": "ads-ctr",
    "model": {"table_sizes": [1000, 2000], "embedding_dim": 16},
    "data": {"format": "synthetic", "rows": 1000},
    "training": {"batch_size": 512},
    "resources": {
        "limits": {"cpu": 64, "memory": "256Gi"},
        "workers": {"count": 4, "cpu": "500m", "memory": "8Gi"},
        "ps": {"count": 2, "cpu": 4, "memory": "16G"},
    },
}


@pytest.mark.parametrize(
    ("text", "mib"),
    [
        ("8Gi", 8192),
        ("512Mi", 512),
        ("16G", 15259),
        ("1Ti", 1024 * 1024),
        (2**20, 1),
        ("1.5Gi", 1536),
    ],
)
def test_memory_quantities(text: object, mib: int) -> None:
    assert parse_memory_mb(text) == mib


@pytest.mark.parametrize(
    ("text", "mib"),
    [
        # decimal suffixes are powers of ten (Kubernetes): k = 1e3, M = 1e6, G = 1e9 bytes,
        # rounded up to whole MiB (2**20 bytes)
        ("1k", 1),
        ("1048576k", 1000),  # 1,048,576,000 bytes = 1000 MiB exactly
        ("500M", 477),  # 476.84 MiB
        ("1M", 1),  # 0.95 MiB
        ("1G", 954),  # 953.67 MiB
        ("2T", 1_907_349),  # 1,907,348.6 MiB
        ("1.5e3M", 1431),  # 1.5e9 bytes
    ],
)
def test_decimal_memory_quantities(text: str, mib: int) -> None:
    assert parse_memory_mb(text) == mib


def test_decimal_and_binary_suffixes_agree_with_integer_arithmetic_over_many_values() -> None:
    """Against an exact integer ceiling, over 2,000 random whole numbers and every suffix."""
    rng = random.Random(11)
    powers = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
              "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}  # fmt: skip
    for _ in range(2000):
        suffix = rng.choice(sorted(powers))
        n = rng.randint(1, 10**6)
        exact = max(1, -(-n * powers[suffix] // 2**20))
        assert parse_memory_mb(f"{n}{suffix}") == exact, (n, suffix)


@pytest.mark.parametrize("bad", ["1K", "1m", "1Mb", "1kB"])
def test_suffixes_kubernetes_does_not_know_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="memory"):
        parse_memory_mb(bad)


@pytest.mark.parametrize("bad", ["8 gigs", "8GB", "-1Gi", "0", "", "Gi", True, None, [1]])
def test_bad_memory_quantities(bad: object) -> None:
    with pytest.raises(ValueError, match="memory"):
        parse_memory_mb(bad)


@pytest.mark.parametrize(("text", "cores"), [("500m", 0.5), ("0.5", 0.5), (4, 4.0), ("2", 2.0)])
def test_cpu_quantities(text: object, cores: float) -> None:
    assert parse_cpu(text) == cores


@pytest.mark.parametrize("bad", ["half", "-1", 0, "1.5k", False, "0.0001"])
def test_bad_cpu_quantities(bad: object) -> None:
    with pytest.raises(ValueError, match="CPU"):
        parse_cpu(bad)


def test_quantities_format_back() -> None:
    assert (format_memory(8192), format_memory(1536)) == ("8Gi", "1536Mi")
    assert (format_cpu(4.0), format_cpu(0.5)) == ("4", "500m")


def test_replacing_a_field_keeps_memory_in_mib() -> None:
    # A bare number in a spec is bytes; a stored MiB value must not be read as bytes again
    # when dataclasses.replace re-validates the other fields.
    request = NodeRequest(count=1, cpu=1.0, memory="8Gi")  # type: ignore[arg-type]
    assert dataclasses.replace(request, count=4).memory == 8192
    quota = Quota(cpu=8.0, memory="16Gi")  # type: ignore[arg-type]
    assert dataclasses.replace(quota, cpu=16.0).memory == 16384
    assert NodeRequest(count=1, cpu=1.0, memory=8 * 2**30).memory == 8192  # bytes, as before
    assert to_dict(dataclasses.replace(request, count=4))["memory"] == "8Gi"


def test_good_spec_parses_and_round_trips() -> None:
    spec = parse(JobSpec, GOOD, "job.yaml")
    assert spec.resources.workers is not None and spec.resources.workers.cpu == 0.5
    assert spec.resources.ps is not None and spec.resources.ps.memory == 15259
    again = parse(JobSpec, to_dict(spec), "again")
    assert again == spec


def _with(path: str, value: object) -> dict[str, object]:
    doc = json.loads(json.dumps(GOOD))
    *parents, last = path.split(".")
    node = doc
    for key in parents:
        node = node[key]
    node[last] = value
    return doc


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (_with("colour", "red"), "job.yaml: colour: unknown key"),
        (
            _with("training.batch_size", "512"),
            "training.batch_size: input should be a valid integer",
        ),
        (_with("training.batch_size", True), "training.batch_size"),
        (_with("resources.workers.count", -1), "resources.workers.count: input should be greater"),
        (_with("resources.ps.memory", "8 gigs"), "resources.ps.memory: '8 gigs' is not a memory"),
        (_with("name", "Bad_Name"), "name: string should match pattern"),
        (_with("data.format", "orc"), "data: input tag 'orc'"),
        (_with("model.bottom_mlp", [64, 8]), "model.bottom_mlp: last layer 8 must equal"),
        (
            _with("resources.limits", {"cpu": 0.5, "memory": "64Gi"}),
            "resources.limits: quota (cpu 0.5, memory 65536Mi) is too small for one worker",
        ),
        (
            _with("resources.limits", {"cpu": 64, "memory": "600Mi"}),
            "too small for one worker and one PS",
        ),
        (
            _with("resources.limits", {"cpu": 4, "memory": "256Gi"}),
            "more than resources.limits.cpu 4",
        ),
        (_with("elastic", {"min_workers": 5, "max_workers": 2}), "elastic.min_workers 5 exceeds"),
    ],
)
def test_bad_specs_name_the_key(doc: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse(JobSpec, doc, "job.yaml")
    text = str(caught.value)
    assert message in text
    assert "\n" not in text
    assert isinstance(caught.value, ValueError)


def test_malformed_yaml_names_file_and_line() -> None:
    with pytest.raises(SpecError, match=r"^job.yaml:\d+:\d+: malformed YAML"):
        load_text("name: x\nmodel: [1, 2\n", "job.yaml")


def test_exponent_floats_read_as_numbers_as_json_writes_them() -> None:
    """json.dumps writes 1e-05 (no dot), which YAML 1.1 reads as a string: a profile or a spec
    with such a learning rate must still validate, and every float json writes reads back."""
    spec = load_text("training: {batch_size: 8, learning_rate: 1e-6}\nx: -2E+3\ny: 'e5'", "s")
    assert spec == {"training": {"batch_size": 8, "learning_rate": 1e-6}, "x": -2000.0, "y": "e5"}
    rng = random.Random(3)
    for _ in range(500):
        value = rng.uniform(-1, 1) * 10 ** rng.randint(-300, 300)
        assert load_text(json.dumps({"v": value}), "s") == {"v": value}


def test_top_level_must_be_a_mapping() -> None:
    with pytest.raises(SpecError, match="expected a mapping"):
        parse(JobSpec, ["a"], "job.yaml")


def test_profile_json_validates_against_the_published_schema() -> None:
    profile = make_profile(samples=3, oom_events=1)
    document = to_dict(profile)
    jsonschema.validate(document, json_schema(JobProfile))
    assert parse(JobProfile, document, "p") == profile
    # the v1 fields the issue requires are all there
    for key in ("schema_version", "job", "plans", "samples", "events", "outcome", "metrics"):
        assert key in document
    sample = document["samples"][0]
    assert {
        "time",
        "global_step",
        "throughput",
        "workers",
        "ps",
        "worker_cpu",
        "ps_cpu",
        "nodes",
    } <= set(sample)
    assert {
        "name",
        "role",
        "cpu_used",
        "cpu_requested",
        "memory_used_mb",
        "memory_requested_mb",
    } <= set(sample["nodes"][0])


def test_plan_and_spec_schemas_accept_what_we_write() -> None:
    plan = ResourcePlan(
        workers=NodeGroup(count=2, cpu=1.5, memory_mb=2048),
        ps=NodeGroup(count=1, cpu=2.0, memory_mb=4096),
        stage=Stage.WARM_START,
        reason="r",
        similar_jobs=("a", "b"),
    )
    jsonschema.validate(to_dict(plan), json_schema(ResourcePlan))
    jsonschema.validate(to_dict(parse(JobSpec, GOOD, "j")), json_schema(JobSpec))
    jsonschema.validate(GOOD, json_schema(JobSpec))


def test_schema_rejects_unknown_keys_too() -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(_with("colour", "red"), json_schema(JobSpec))
