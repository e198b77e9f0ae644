"""The deployment files under ``deploy/``, checked offline.

* Every Kubernetes document in ``deploy/*.yaml`` validates against the real Kubernetes 1.30
  schemas in strict mode (``kubernetes-validate``: an unknown or misspelt field fails).
* The job master's Role grants exactly the calls its Kubernetes backend is planned to make, and
  no wildcard.
* The master's Job runs the image this version builds, as a non-root user on a read-only root,
  with the job spec and the run's claim mounted where its command expects them.
* The Dockerfile builds from ``python:3.11-slim`` with the committed pins, the CPU torch pinned as
  constraints.txt pins it, and runs as a numeric non-root user.
* ``deploy/build.sh --dry-run`` tags the image with the version in pyproject.toml.

No Docker daemon and no cluster are needed: the image build itself is not run here.
"""

from __future__ import annotations

import copy
import fnmatch
import os
import re
import shlex
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import kubernetes_validate.utils
import pytest
import yaml

from dlrover_kfp.core.documents import load_text, parse
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.runtime.metrics import DEFAULT_METRICS_PORT

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
BUILD_SH = DEPLOY / "build.sh"
MANIFESTS = sorted(DEPLOY.glob("*.yaml"))

#: The Kubernetes version the manifests must be valid for.
KUBERNETES_VERSION = "1.30"

#: What the job master's Kubernetes backend is planned to call: (API group, resource) -> verbs.
#: Kept here as the test's own copy, independent of deploy/rbac.yaml.
EXPECTED_RULES: dict[tuple[str, str], frozenset[str]] = {
    ("", "pods"): frozenset({"create", "get", "list", "watch", "delete"}),
    ("", "pods/resize"): frozenset({"patch"}),
    ("", "secrets"): frozenset({"create", "update", "delete"}),
    ("", "events"): frozenset({"create"}),
    ("metrics.k8s.io", "pods"): frozenset({"list"}),
    ("coordination.k8s.io", "leases"): frozenset({"get", "create", "update", "delete"}),
}

MASTER_NAME = "dlrover-kfp-master"
WORK_DIR = "/var/lib/dlrover-kfp"
UID = 10001


# --- helpers -------------------------------------------------------------------------------------


def pyproject_version() -> str:
    with (ROOT / "pyproject.toml").open("rb") as handle:
        version = tomllib.load(handle)["project"]["version"]
    assert isinstance(version, str)
    return version


def constraint_pin(name: str) -> str:
    """The exact ``name==X`` line of constraints.txt."""
    pattern = re.compile(rf"{re.escape(name)}==(\S+)", re.IGNORECASE)
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        match = pattern.fullmatch(line.strip())
        if match:
            return match.group(1)
    raise AssertionError(f"constraints.txt pins no {name}")


def documents(path: Path) -> list[dict[str, Any]]:
    docs = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    assert docs, f"{path.name}: no YAML documents"
    for doc in docs:
        assert isinstance(doc, dict), f"{path.name}: a document is not a mapping: {doc!r}"
    return docs


def all_documents() -> list[dict[str, Any]]:
    return [doc for path in MANIFESTS for doc in documents(path)]


def the(kind: str, name: str | None = None) -> dict[str, Any]:
    """The one document of ``kind`` (and ``name``) across deploy/*.yaml."""
    found = [
        doc
        for doc in all_documents()
        if doc.get("kind") == kind and (name is None or doc["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''} in deploy/*.yaml, got {len(found)}"
    return found[0]


def validate_strict(doc: dict[str, Any], where: str) -> str:
    """Validate ``doc`` against the Kubernetes schemas in strict mode; fail naming the field."""
    try:
        version: str = kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        return version
    except kubernetes_validate.ValidationError as error:
        field = ".".join(str(part) for part in error.path) or "(document)"
        problem = (
            f"{where}: {doc.get('kind')} {doc.get('metadata', {}).get('name')}: {field}: "
            f"{error.message}"
        )
    # Outside the except block: the message alone, not jsonschema's whole schema dump.
    pytest.fail(problem, pytrace=False)


def master_job() -> dict[str, Any]:
    return the("Job", MASTER_NAME)


def master_container() -> dict[str, Any]:
    containers = master_job()["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    container: dict[str, Any] = containers[0]
    return container


def option(argv: list[str], flag: str) -> str:
    assert argv.count(flag) == 1, f"{flag} appears {argv.count(flag)} times in {argv}"
    return argv[argv.index(flag) + 1]


def dockerfile_instructions() -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` of deploy/Dockerfile: comments dropped, continuations joined."""
    instructions: list[tuple[str, str]] = []
    current = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        keyword, _, rest = (current + line).partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        current = ""
    assert not current, "deploy/Dockerfile ends inside a line continuation"
    return instructions


def dockerfile(keyword: str) -> list[str]:
    return [args for kw, args in dockerfile_instructions() if kw == keyword]


def pip_installs() -> list[list[str]]:
    """The arguments after ``pip install`` of every such command in the Dockerfile's RUN lines."""
    installs = []
    for run in dockerfile("RUN"):
        lexer = shlex.shlex(run, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words = list(lexer)
        # one shell command at a time: split at &&, ||, ;, |
        commands: list[list[str]] = [[]]
        for word in words:
            if word in ("&&", "||", ";", "|"):
                commands.append([])
            else:
                commands[-1].append(word)
        for argv in commands:
            for i in range(len(argv) - 1):
                if argv[i : i + 2] == ["pip", "install"]:
                    installs.append(argv[i + 2 :])
                    break
    return installs


def constraint_files(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg in ("-c", "--constraint")]


def dry_run(tmp_path: Path, **env: str) -> list[str]:
    """``deploy/build.sh --dry-run`` from another directory, with a ``docker`` that must not run."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir(exist_ok=True)
    marker = tmp_path / "docker-ran"
    fake_docker = fake_bin / "docker"
    fake_docker.write_text(f"#!/bin/sh\ntouch {shlex.quote(str(marker))}\nexit 1\n")
    fake_docker.chmod(0o755)
    environment = {k: v for k, v in os.environ.items() if k != "IMAGE"}
    environment["PATH"] = f"{fake_bin}{os.pathsep}{environment.get('PATH', '')}"
    environment.update(env)
    result = subprocess.run(
        ["bash", str(BUILD_SH), "--dry-run"],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert not marker.exists(), "--dry-run ran docker"
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, f"expected one command line, got {result.stdout!r}"
    return shlex.split(lines[0])


# --- every manifest: valid Kubernetes 1.30, strict -----------------------------------------------


def test_the_deploy_manifests_are_there() -> None:
    assert {p.name for p in MANIFESTS} >= {"rbac.yaml", "master-pod.yaml"}


def test_the_bundled_schemas_include_the_target_version() -> None:
    versions = kubernetes_validate.utils.all_versions()
    assert any(v.startswith(f"{KUBERNETES_VERSION}.") for v in versions), versions


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_document_validates_strictly(path: Path) -> None:
    for doc in documents(path):
        # the schemas of exactly the target version were used, not an older fallback
        assert validate_strict(doc, path.name) == KUBERNETES_VERSION


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_no_document_names_a_namespace(path: Path) -> None:
    # `kubectl apply -n NAMESPACE` places them; a namespace written here would override it.
    for doc in documents(path):
        assert "namespace" not in doc["metadata"], f"{path.name}: {doc['kind']} names one"


def test_strict_validation_rejects_an_unknown_field() -> None:
    # The check above is only worth something if a misspelt field fails it.
    job = copy.deepcopy(master_job())
    job["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, KUBERNETES_VERSION, strict=True)
    role = copy.deepcopy(the("Role", MASTER_NAME))
    role["rules"][0]["verb"] = ["get"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(role, KUBERNETES_VERSION, strict=True)


# --- RBAC: the master's rights, no more ----------------------------------------------------------


def granted(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    rights = set()
    for rule in role["rules"]:
        assert "nonResourceURLs" not in rule, f"a namespaced Role with nonResourceURLs: {rule}"
        for group in rule.get("apiGroups", []):
            for resource in rule.get("resources", []):
                for verb in rule.get("verbs", []):
                    rights.add((group, resource, verb))
    return rights


def test_the_rbac_file_holds_only_namespaced_objects() -> None:
    kinds = sorted(doc["kind"] for doc in documents(DEPLOY / "rbac.yaml"))
    assert kinds == ["Role", "RoleBinding", "ServiceAccount"]


def test_the_role_grants_no_wildcard() -> None:
    for rule in the("Role", MASTER_NAME)["rules"]:
        for key in ("apiGroups", "resources", "verbs"):
            assert not any("*" in value for value in rule.get(key, [])), f"{key} of {rule}"


def test_the_role_grants_exactly_the_backends_calls() -> None:
    expected = {(g, r, v) for (g, r), verbs in EXPECTED_RULES.items() for v in verbs}
    rights = granted(the("Role", MASTER_NAME))
    assert not rights - expected, f"granted beyond what the backend calls: {rights - expected}"
    assert not expected - rights, f"calls the backend makes but may not: {expected - rights}"


def test_the_binding_gives_the_role_to_the_masters_account() -> None:
    binding = the("RoleBinding", MASTER_NAME)
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": MASTER_NAME,
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": MASTER_NAME}]
    the("ServiceAccount", MASTER_NAME)
    assert master_job()["spec"]["template"]["spec"]["serviceAccountName"] == MASTER_NAME


# --- the master's Job ----------------------------------------------------------------------------


def test_the_master_runs_once() -> None:
    job = master_job()
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_the_master_runs_this_versions_image_and_gives_it_to_its_pods() -> None:
    container = master_container()
    image = f"registry.invalid/dlrover-kfp:{pyproject_version()}"  # steps/image.py
    assert container["image"] == image
    argv = container["command"]
    assert argv[:2] == ["dlrover-kfp", "run"]
    assert option(argv, "--image") == image
    assert option(argv, "--backend") == "kubernetes"
    assert option(argv, "--namespace") == "$(POD_NAMESPACE)"


def test_the_master_declares_the_metrics_port_it_serves_on() -> None:
    """The named ``metrics`` containerPort (a PodMonitor's target), the pod's Prometheus
    annotations and ``--metrics-port`` are one port: the master's default in the cluster."""
    container = master_container()
    [port] = [p for p in container["ports"] if p["name"] == "metrics"]
    assert port == {"name": "metrics", "containerPort": DEFAULT_METRICS_PORT, "protocol": "TCP"}
    assert option(container["command"], "--metrics-port") == str(DEFAULT_METRICS_PORT)
    annotations = master_job()["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(DEFAULT_METRICS_PORT)
    assert annotations["prometheus.io/scrape"] == "true"


def test_the_master_knows_itself_from_the_downward_api() -> None:
    env = {item["name"]: item for item in master_container()["env"]}
    expected = {
        "POD_NAME": "metadata.name",
        "POD_NAMESPACE": "metadata.namespace",
        "POD_UID": "metadata.uid",
        "POD_IP": "status.podIP",
    }
    for name, field_path in expected.items():
        assert env[name]["valueFrom"]["fieldRef"]["fieldPath"] == field_path, name


def test_the_master_requests_what_it_is_limited_to() -> None:
    resources = master_container()["resources"]
    assert resources["requests"] == resources["limits"] == {"cpu": "1", "memory": "1Gi"}


def test_the_master_runs_unprivileged_on_a_read_only_root() -> None:
    pod = master_job()["spec"]["template"]["spec"]
    container = master_container()
    # The container's own settings win over the pod's.
    effective = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
    assert effective["runAsNonRoot"] is True
    assert effective["runAsUser"] == UID
    assert effective["allowPrivilegeEscalation"] is False
    assert effective["readOnlyRootFilesystem"] is True
    assert effective["capabilities"]["drop"] == ["ALL"]
    assert "add" not in effective["capabilities"]
    assert effective["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not effective.get("privileged", False)


def mounts() -> dict[str, dict[str, Any]]:
    """mount path -> the volume mounted there."""
    volumes = {v["name"]: v for v in master_job()["spec"]["template"]["spec"]["volumes"]}
    return {m["mountPath"]: volumes[m["name"]] for m in master_container()["volumeMounts"]}


def test_the_master_can_write_where_it_writes() -> None:
    by_path = mounts()
    assert "emptyDir" in by_path["/tmp"], "a read-only root needs a writable /tmp"
    claim = by_path[WORK_DIR]["persistentVolumeClaim"]["claimName"]
    assert claim == "dlrover-kfp-runs"
    pvc = the("PersistentVolumeClaim", claim)
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["spec"]["resources"]["requests"]["storage"] == "10Gi"
    output_dir = option(master_container()["command"], "--output-dir")
    assert Path(output_dir).is_relative_to(WORK_DIR)


def test_the_master_reads_a_valid_job_spec_from_its_config_map() -> None:
    job_path = Path(option(master_container()["command"], "--job"))
    volume = mounts()[str(job_path.parent)]
    config_map = the("ConfigMap", volume["configMap"]["name"])
    assert config_map["metadata"]["name"] == "dlrover-kfp-job"
    text = config_map["data"][job_path.name]
    spec = parse(JobSpec, load_text(text, "dlrover-kfp-job/job.yaml"), "dlrover-kfp-job/job.yaml")
    assert spec.name


# --- the image ----------------------------------------------------------------------------------


def test_the_image_builds_from_python_3_11_slim() -> None:
    assert dockerfile("FROM") == ["python:3.11-slim"]


def test_the_image_runs_as_a_numeric_non_root_user() -> None:
    users = dockerfile("USER")
    assert users, "no USER: the image would run as root"
    match = re.fullmatch(r"(\d+)(?::(\d+))?", users[-1])
    assert match, f"USER {users[-1]} is not numeric (runAsNonRoot cannot verify a name)"
    assert int(match.group(1)) == UID
    assert match.group(2) is None or int(match.group(2)) != 0


def test_the_image_installs_the_package_with_the_committed_constraints() -> None:
    installs = pip_installs()
    package = [argv for argv in installs if any(a == "." or a.startswith(".[") for a in argv)]
    assert len(package) == 1, f"expected one pip install of the package, got {installs}"
    argv = package[0]
    assert constraint_files(argv) == ["constraints.txt"]
    # train: the trainer (torch). kfp: KFP runs the components' bodies in this image and
    # installs nothing at run time
    assert ".[train,postgres,kubernetes,kfp]" in argv
    assert constraint_pin("kubernetes") == "30.1.0"
    # Anything installed outside the constraints must be an exact pin with no dependencies.
    for other in installs:
        if other is argv:
            continue
        requirements = [a for a in other if not a.startswith("-") and "://" not in a]
        assert "--no-deps" in other, other
        assert requirements, other
        assert all("==" in r for r in requirements), other


def test_the_image_holds_the_kfp_components_its_tasks_import() -> None:
    copied = {args.split()[0] for args in dockerfile("COPY")}
    assert {"dlrover_kfp", "components"} <= copied


def test_the_image_pins_torch_exactly_as_the_constraints_do() -> None:
    torch = [(argv, a) for argv in pip_installs() for a in argv if re.match(r"torch\b", a)]
    assert len(torch) == 1, f"expected one torch requirement in the Dockerfile, got {torch}"
    argv, requirement = torch[0]
    assert requirement == f"torch=={constraint_pin('torch')}"
    # The CPU build only: PyTorch's CPU index alone, never beside PyPI (CUDA wheels).
    assert option(argv, "--index-url") == "https://download.pytorch.org/whl/cpu"
    assert "--extra-index-url" not in argv


def test_the_image_is_labelled_configured_and_entered_as_the_cli() -> None:
    assert dockerfile("ENTRYPOINT") == ['["dlrover-kfp"]']
    env = " ".join(dockerfile("ENV"))
    assert "PYTHONDONTWRITEBYTECODE=1" in env
    assert "PYTHONUNBUFFERED=1" in env
    labels = " ".join(dockerfile("LABEL"))
    for key in ("title", "version", "description"):
        assert f"org.opencontainers.image.{key}=" in labels, key
    assert f"VERSION={pyproject_version()}" in dockerfile("ARG"), "ARG VERSION default"


def dockerignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def ignored(path: str, patterns: list[str]) -> bool:
    for pattern in patterns:
        bare = pattern.removeprefix("**/").rstrip("/")
        if fnmatch.fnmatch(path, bare) or fnmatch.fnmatch(Path(path).name, bare):
            return True
    return False


def test_the_build_context_keeps_local_state_out_and_the_sources_in() -> None:
    patterns = dockerignore_patterns()
    for local in (".venv", ".git", ".pytest_cache", ".mypy_cache", ".ruff_cache", "build"):
        assert ignored(local, patterns), f".dockerignore lets {local} into the build context"
    for copy_args in dockerfile("COPY"):
        *sources, _destination = shlex.split(copy_args)
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: no such file"
            assert not ignored(source, patterns), f"COPY {source}: excluded by .dockerignore"


def test_build_dry_run_tags_the_pyproject_version(tmp_path: Path) -> None:
    version = pyproject_version()
    argv = dry_run(tmp_path)
    assert argv[:2] == ["docker", "build"]
    assert option(argv, "--tag") == f"registry.invalid/dlrover-kfp:{version}"
    assert option(argv, "--build-arg") == f"VERSION={version}"
    assert Path(option(argv, "--file")) == DOCKERFILE
    assert Path(argv[-1]) == ROOT, "the build context is the repository root"


def test_build_dry_run_takes_the_repository_name_from_image(tmp_path: Path) -> None:
    argv = dry_run(tmp_path, IMAGE="registry.example/ml/dlrover-kfp")
    assert option(argv, "--tag") == f"registry.example/ml/dlrover-kfp:{pyproject_version()}"


@pytest.mark.parametrize(
    ("image", "says"),
    [
        ("dlrover-kfp", "names no registry"),
        ("ml/dlrover-kfp", "names no registry"),
        ("registry.example/ml/dlrover-kfp:1", "without a tag"),
    ],
)
def test_build_refuses_an_image_name_without_a_registry_or_with_a_tag(
    tmp_path: Path, image: str, says: str
) -> None:
    environment = {**os.environ, "IMAGE": image}
    result = subprocess.run(
        ["bash", str(BUILD_SH), "--dry-run"],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert f"IMAGE={image}" in result.stderr and says in result.stderr, result.stderr
    assert not result.stdout
