"""The Kubernetes manifests and image in deploy/, checked offline.

RayCluster and RayJob documents are validated against the OpenAPI v3 schemas of KubeRay's
CRDs (``spec.versions[name == "v1"].schema.openAPIV3Schema``), the schema the API server
applies. jsonschema covers types, enums, required fields and patterns; it ignores the
``x-kubernetes-*`` extensions, ``format`` (int32, int-or-string) and CEL rules. What it
cannot see is pruning: Kubernetes silently drops a field the schema does not declare, so a
misspelt ``redisPasword`` would give a cluster without GCS fault tolerance and no error.
:func:`unknown_fields` catches those.

The CRDs come from ``$POPGRPO_KUBERAY_CRDS`` or ``../shared/kuberay-crds`` next to the
repository; the schema tests skip when neither exists. The other checks tie the manifests to
the repository: image tag, Dockerfile sources, the job's module and config, Redis and Secrets.
"""

from __future__ import annotations

import copy
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.ops.test_cluster_configs import (
    REPO,
    actor_cpus_needed,
    makefile_torch_pin,
    pop_grpo_preset,
    ray_start_option_names,
)

CRD_ENV = "POPGRPO_KUBERAY_CRDS"
CRD_FILES = {"RayCluster": "ray.io_rayclusters.yaml", "RayJob": "ray.io_rayjobs.yaml"}
DEPLOY = REPO / "deploy"
MANIFESTS = ["raycluster.yaml", "rayjob.yaml", "redis.yaml"]
# Fields of ObjectMeta a manifest may set. The CRD schemas leave top-level metadata as a bare
# object because the API server validates it itself.
OBJECT_META = {"name", "namespace", "generateName", "labels", "annotations", "finalizers", "ownerReferences"}
# The flags of `popgrpo train` that popgrpo.cli.job takes as well.
JOB_FLAGS = {"--config", "--set", "--seed", "--out", "--quiet"}


# ---- helpers ---------------------------------------------------------------------------------
def crd_dir() -> Path:
    configured = os.environ.get(CRD_ENV)
    return Path(configured) if configured else (Path(__file__).parents[2] / ".." / "shared" / "kuberay-crds").resolve()


@pytest.fixture(scope="module")
def schemas() -> dict[str, dict]:
    folder = crd_dir()
    if not folder.is_dir():
        pytest.skip(f"KubeRay CRDs not found at {folder} (set ${CRD_ENV} to the folder holding {CRD_FILES['RayJob']})")
    out = {}
    for kind, name in CRD_FILES.items():
        crd = yaml.load((folder / name).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        assert crd["spec"]["names"]["kind"] == kind
        (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
        out[kind] = v1["schema"]["openAPIV3Schema"]
    return out


def docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def doc(name: str, kind: str) -> dict:
    (found,) = [d for d in docs(name) if d["kind"] == kind]
    return found


def custom_resources() -> list[tuple[str, dict]]:
    return [(name, d) for name in MANIFESTS for d in docs(name) if d["kind"] in CRD_FILES]


def cluster_spec(resource: dict) -> dict:
    """The RayCluster spec of a RayCluster, or the one a RayJob creates."""
    return resource["spec"] if resource["kind"] == "RayCluster" else resource["spec"]["rayClusterSpec"]


def groups(spec: dict) -> list[tuple[str, dict]]:
    """``("head" | group name, group spec)`` for the head group and every worker group."""
    return [("head", spec["headGroupSpec"])] + [(g["groupName"], g) for g in spec.get("workerGroupSpecs", [])]


def containers(spec: dict) -> list[dict]:
    return [c for _, g in groups(spec) for c in g["template"]["spec"]["containers"]]


def cpu_count(quantity: str | int) -> float:
    text = str(quantity)
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


def schema_errors(resource: dict, schema: dict) -> list[str]:
    validator = jsonschema.Draft7Validator(schema)
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(resource)]


def unknown_fields(value, schema: dict, path: str = "") -> list[str]:
    """Paths in ``value`` that ``schema`` does not declare: what Kubernetes would prune."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    found = []
    if isinstance(value, dict):
        props, extra = schema.get("properties"), schema.get("additionalProperties")
        for key, item in value.items():
            where = f"{path}.{key}" if path else key
            if path == "" and key == "metadata":
                found += [f"metadata.{k}" for k in item if k not in OBJECT_META]
            elif props is not None and key in props:
                found += unknown_fields(item, props[key], where)
            elif isinstance(extra, dict):
                found += unknown_fields(item, extra, where)
            elif extra is not True:
                found.append(where)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            found += unknown_fields(item, schema["items"], f"{path}[{i}]")
    return found


def dockerfile() -> str:
    return (DEPLOY / "Dockerfile").read_text()


def dockerfile_image_tag() -> str:
    match = re.search(r"^#\s*image:\s*(\S+)", dockerfile(), re.M)
    assert match, "deploy/Dockerfile must document its tag as '# image: NAME:TAG'"
    return match.group(1)


def dockerfile_arg(name: str) -> str:
    match = re.search(rf"^ARG\s+{name}=(\S+)", dockerfile(), re.M)
    assert match, f"ARG {name} not in deploy/Dockerfile"
    return match.group(1)


def entrypoint_args(rayjob: dict) -> tuple[list[str], dict[str, list[str]]]:
    """The command before the flags, and every flag's values (``--quiet`` has none)."""
    tokens = shlex.split(rayjob["spec"]["entrypoint"])
    first_flag = next(i for i, t in enumerate(tokens) if t.startswith("--"))
    flags: dict[str, list[str]] = {}
    i = first_flag
    while i < len(tokens):
        name = tokens[i]
        assert name.startswith("--"), f"stray argument {name!r} in the entrypoint"
        takes_value = name != "--quiet"
        flags.setdefault(name, []).extend([tokens[i + 1]] if takes_value else [])
        i += 2 if takes_value else 1
    return tokens[:first_flag], flags


def entrypoint_config(rayjob: dict):
    """The popgrpo config the RayJob's entrypoint would run, loaded by popgrpo itself."""
    from popgrpo.config import load_config

    _, flags = entrypoint_args(rayjob)
    (config_path,) = flags["--config"]
    overrides = list(flags.get("--set", [])) + [f"run.seed={s}" for s in flags.get("--seed", [])]
    return load_config(REPO / Path(config_path).relative_to("/app"), overrides)


# ---- CRD schema ------------------------------------------------------------------------------
def test_crd_dir_honours_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(CRD_ENV, str(tmp_path))
    assert crd_dir() == tmp_path
    monkeypatch.delenv(CRD_ENV)
    assert crd_dir() == (REPO.parent / "shared" / "kuberay-crds").resolve()


@pytest.mark.parametrize(("name", "resource"), custom_resources(), ids=lambda x: x if isinstance(x, str) else x["kind"])
def test_custom_resource_matches_its_crd(schemas, name, resource):
    assert resource["apiVersion"] == "ray.io/v1"
    schema = schemas[resource["kind"]]
    assert schema_errors(resource, schema) == []
    assert unknown_fields(resource, schema) == [], "Kubernetes would silently drop these fields"


def _replicas_as_word(c):
    c["spec"]["workerGroupSpecs"][0]["replicas"] = "two"


def _unknown_auth_mode(c):
    c["spec"]["authOptions"]["mode"] = "none"


def _misspelt_redis_password(c):
    ft = c["spec"]["gcsFaultToleranceOptions"]
    ft["redisPasword"] = ft.pop("redisPassword")


def _misspelt_container_field(c):
    c["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["imagePulPolicy"] = "Always"


def _shutdown_as_word(j):
    j["spec"]["shutdownAfterJobFinishes"] = "yes"


def _unknown_job_field(j):
    j["spec"]["ttlSecondsAfterFinish"] = j["spec"].pop("ttlSecondsAfterFinished")


BROKEN = [
    # (file, kind, change, caught by the schema, the pruned field)
    ("raycluster.yaml", "RayCluster", _replicas_as_word, True, None),
    ("raycluster.yaml", "RayCluster", _unknown_auth_mode, True, None),
    ("raycluster.yaml", "RayCluster", _misspelt_redis_password, False, "spec.gcsFaultToleranceOptions.redisPasword"),
    (
        "raycluster.yaml",
        "RayCluster",
        _misspelt_container_field,
        False,
        "spec.headGroupSpec.template.spec.containers[0].imagePulPolicy",
    ),
    ("rayjob.yaml", "RayJob", _shutdown_as_word, True, None),
    ("rayjob.yaml", "RayJob", _unknown_job_field, False, "spec.ttlSecondsAfterFinish"),
]


@pytest.mark.parametrize(
    ("name", "kind", "break_it", "schema_catches", "pruned"), BROKEN, ids=[b[2].__name__ for b in BROKEN]
)
def test_broken_manifest_is_caught(schemas, name, kind, break_it, schema_catches, pruned):
    broken = copy.deepcopy(doc(name, kind))
    break_it(broken)
    errors, dropped = schema_errors(broken, schemas[kind]), unknown_fields(broken, schemas[kind])
    if schema_catches:
        assert errors
    else:
        # Valid for the schema: only the pruning check sees the mistake.
        assert errors == [] and dropped == [pruned]


# ---- the image -------------------------------------------------------------------------------
def test_every_ray_container_runs_the_documented_image():
    tag = dockerfile_image_tag()
    name, _, version = tag.rpartition(":")
    assert name == "popgrpo"
    pyproject = re.search(r'^version\s*=\s*"([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M).group(1)
    assert version == pyproject, "the image tag is the package version"
    images = {(n, c["name"]): c["image"] for n, r in custom_resources() for c in containers(cluster_spec(r))}
    assert images and set(images.values()) == {tag}, images
    assert f"-t {tag}" in (DEPLOY / "README.md").read_text(), "deploy/README.md builds another tag"


def test_ray_version_is_the_same_in_image_manifests_and_project():
    import ray

    base = dockerfile_arg("BASE_IMAGE")
    assert base == f"rayproject/ray:{ray.__version__}-py311-cpu"
    for _, resource in custom_resources():
        assert cluster_spec(resource)["rayVersion"] == ray.__version__


def test_dockerfile_copies_existing_sources_and_pins_torch_like_the_makefile():
    copies = []
    for line in dockerfile().splitlines():
        if not line.startswith("COPY "):
            continue
        args = [a for a in shlex.split(line)[1:] if not a.startswith("--")]
        assert "--from" not in line, "no multi-stage copies expected"
        copies.append((args[:-1], args[-1]))
        for source in args[:-1]:
            assert (REPO / source).exists(), f"COPY source {source} is not in the repository"
    assert (["jobs"], "/app/jobs") in copies
    assert re.search(r"^WORKDIR /app$", dockerfile(), re.M)
    assert dockerfile_arg("TORCH_SPEC") == makefile_torch_pin()
    assert dockerfile_arg("TORCH_INDEX_URL").endswith("/whl/cpu")
    # The package needs its readme to build (pyproject: readme = "README.md").
    assert any("README.md" in sources for sources, _ in copies)


# ---- the RayJob ------------------------------------------------------------------------------
def test_rayjob_entrypoint_runs_the_job_module_with_a_config_from_the_image():
    rayjob = doc("rayjob.yaml", "RayJob")
    command, flags = entrypoint_args(rayjob)
    assert command == ["python", "-m", "popgrpo.cli.job"]
    assert set(flags) <= JOB_FLAGS, set(flags) - JOB_FLAGS
    (config_path,) = flags["--config"]
    # Dockerfile: COPY jobs /app/jobs. Preset names do not resolve in the image; paths do.
    assert config_path.startswith("/app/jobs/"), config_path
    assert (REPO / Path(config_path).relative_to("/app")).is_file(), config_path
    entrypoint_config(rayjob)  # popgrpo accepts the config with the entrypoint's --set/--seed
    # The run directory is on the head's volume (the driver runs on the head).
    (out,) = flags["--out"]
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    mounts = [m["mountPath"] for c in head["containers"] for m in c.get("volumeMounts", [])]
    assert any(out.startswith(m.rstrip("/") + "/") for m in mounts), (out, mounts)
    assert rayjob["spec"]["shutdownAfterJobFinishes"] is True and rayjob["spec"]["ttlSecondsAfterFinished"] > 0

    help_text = subprocess.run(
        [sys.executable, "-m", "popgrpo.cli.job", "--help"], cwd=REPO, capture_output=True, text=True, timeout=120
    ).stdout
    for flag in flags:
        assert flag in help_text, f"popgrpo.cli.job does not take {flag}"


def test_workers_hold_the_population_when_it_starts():
    """popgrpo checks ray.cluster_resources() at start: the workers present from the start
    (the RayJob's fixed group, the RayCluster's minReplicas) must hold the population."""
    for resource, config in (
        (doc("rayjob.yaml", "RayJob"), entrypoint_config(doc("rayjob.yaml", "RayJob"))),
        (doc("raycluster.yaml", "RayCluster"), pop_grpo_preset()),
    ):
        spec = cluster_spec(resource)
        assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
        cpus = 0.0
        for _group_name, group in groups(spec)[1:]:
            (container,) = group["template"]["spec"]["containers"]
            present = group["minReplicas"] if spec.get("enableInTreeAutoscaling") else group["replicas"]
            cpus += present * cpu_count(container["resources"]["limits"]["cpu"])
        assert cpus >= actor_cpus_needed(config) > 0, (resource["kind"], cpus)


# ---- Ray settings shared by both clusters ----------------------------------------------------
@pytest.mark.parametrize(("name", "resource"), custom_resources(), ids=lambda x: x if isinstance(x, str) else x["kind"])
def test_token_auth_metrics_and_start_params(name, resource):
    spec = cluster_spec(resource)
    assert spec["authOptions"]["mode"] == "token"
    for container in containers(spec):
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        assert env.get("RAY_AUTH_MODE", "token") == "token"
    known = ray_start_option_names()
    for group_name, group in groups(spec):
        params = group["rayStartParams"]
        assert {f"--{k}" for k in params} <= known, f"{group_name}: not ray start options"
        port = int(params["metrics-export-port"])
        (container,) = group["template"]["spec"]["containers"]
        assert {"name": "metrics", "containerPort": port} in container["ports"], group_name


@pytest.mark.parametrize("name", ["raycluster.yaml", "rayjob.yaml"])
def test_every_claimed_volume_is_defined_next_to_it(name):
    claims = {d["metadata"]["name"] for d in docs(name) if d["kind"] == "PersistentVolumeClaim"}
    for _, resource in [(n, r) for n, r in custom_resources() if n == name]:
        for group_name, group in groups(cluster_spec(resource)):
            pod = group["template"]["spec"]
            volumes = {v["name"]: v for v in pod.get("volumes", [])}
            for container in pod["containers"]:
                for mount in container.get("volumeMounts", []):
                    assert mount["name"] in volumes, f"{group_name}: mount of undefined volume {mount['name']}"
            for volume in volumes.values():
                if "persistentVolumeClaim" in volume:
                    assert volume["persistentVolumeClaim"]["claimName"] in claims


# ---- Redis and Secrets -----------------------------------------------------------------------
def test_redis_manifests_back_the_gcs_fault_tolerance_settings():
    assert sorted(d["kind"] for d in docs("redis.yaml")) == ["Deployment", "PersistentVolumeClaim", "Secret", "Service"]
    secret = doc("redis.yaml", "Secret")
    service = doc("redis.yaml", "Service")
    deployment = doc("redis.yaml", "Deployment")
    keys = set(secret.get("stringData", {})) | set(secret.get("data", {}))
    assert "REPLACE" in secret["stringData"]["password"], "the committed password must be an obvious placeholder"

    ft = doc("raycluster.yaml", "RayCluster")["spec"]["gcsFaultToleranceOptions"]
    ref = ft["redisPassword"]["valueFrom"]["secretKeyRef"]
    assert ref["name"] == secret["metadata"]["name"] and ref["key"] in keys
    host, _, port = ft["redisAddress"].partition(":")
    assert host == service["metadata"]["name"]
    assert int(port) in [p["port"] for p in service["spec"]["ports"]]

    template = deployment["spec"]["template"]
    labels = template["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items(), "the Service selects no Redis pod"
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (redis,) = template["spec"]["containers"]
    env_refs = [e["valueFrom"]["secretKeyRef"] for e in redis["env"] if "valueFrom" in e]
    assert {"name": ref["name"], "key": ref["key"]} in env_refs, "Redis must require the password Ray sends"
    assert "--requirepass" in " ".join(redis["command"] + redis["args"])


def test_every_secret_reference_is_created_by_a_manifest_or_the_readme():
    created = {d["metadata"]["name"]: d for d in docs("redis.yaml") if d["kind"] == "Secret"}
    readme = (DEPLOY / "README.md").read_text()
    for name, resource in custom_resources():
        spec = cluster_spec(resource)
        auth_secret = spec["authOptions"].get("secretName")
        if auth_secret:  # created by hand: the README must say how, with the key KubeRay reads
            assert re.search(rf"kubectl create secret generic {auth_secret}\b.*--from-literal=auth_token=", readme)
        for container in containers(spec):
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["name"] in created, f"{name}: Secret {ref['name']} is created nowhere"
                    assert ref["key"] in created[ref["name"]]["stringData"], f"{name}: no key {ref['key']}"
