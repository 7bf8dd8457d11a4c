"""The Ray cluster-launcher files in cluster/, checked offline the way ``ray up`` checks them.

``ray up`` first fills a config's defaults (``prepare_config``) and validates it against
Ray's ``ray-schema.json`` plus its cross-field rules (``validate_config``); only then does it
call a cloud API or SSH anywhere. These tests run exactly those two steps, so a config that
passes here fails later only for reasons that need a real provider (credentials, quotas,
reachable machines). They also check what the schema cannot: that token authentication stays
on, that every ``ray start`` flag exists, that the smallest cluster holds the Pop-GRPO preset,
and what the job runtime env would upload.
"""

from __future__ import annotations

import copy
import math
import re
import shlex
import zipfile
from pathlib import Path

import jsonschema
import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

REPO = Path(__file__).resolve().parents[2]
LAUNCHER_FILES = ["cluster/aws.yaml", "cluster/onprem.yaml"]
RUNTIME_ENV = "cluster/runtime_env.yaml"
SECRETS_MOUNT = "~/popgrpo-secrets"  # where both launcher files put the auth token on every node


# ---- helpers (also used by test_deploy_manifests.py) ---------------------------------------
def load_yaml(rel: str) -> dict:
    return yaml.safe_load((REPO / rel).read_text())


def makefile_torch_pin() -> str:
    """The torch requirement the Makefile installs first, e.g. ``torch==2.13.0``."""
    match = re.search(r"^TORCH_CPU\s*\?=\s*(\S+)", (REPO / "Makefile").read_text(), re.M)
    assert match, "Makefile no longer defines TORCH_CPU"
    return match.group(1)


def actor_cpus_needed(config) -> float:
    """CPUs a population reserves on Ray: one actor per ``members_per_actor`` members
    (as ``RayExecutor`` packs them), each reserving ``population.resources.num_cpus``."""
    pop = config.population
    return math.ceil(pop.size / pop.members_per_actor) * pop.resources.num_cpus


def pop_grpo_preset():
    from popgrpo.config import load_config

    return load_config(REPO / "jobs" / "configs" / "pop_grpo.yaml")


def ray_start_option_names() -> set[str]:
    """Every option ``ray start`` accepts, from Ray's own click command."""
    from ray.scripts.scripts import start

    return {opt for param in start.params for opt in param.opts if opt.startswith("--")}


def ray_up_validate(config: dict) -> dict:
    """What ``ray up`` does to a config before contacting a provider; returns the filled config."""
    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    return prepared


def ray_start_invocations(commands: list[str]) -> list[tuple[str, list[str]]]:
    """``(shell text before it, ray start arguments)`` for every ``ray start`` in ``commands``."""
    found = []
    for command in commands:
        segments = command.split(";")
        for i, segment in enumerate(segments):
            tokens = shlex.split(segment)
            if tokens[:2] == ["ray", "start"]:
                found.append((";".join(segments[:i]), tokens[2:]))
    return found


def flag_values(args: list[str]) -> dict[str, str | None]:
    out = {}
    for arg in args:
        name, sep, value = arg.partition("=")
        out[name] = value if sep else None
    return out


# ---- the launcher files pass Ray's validator ------------------------------------------------
@pytest.mark.parametrize("rel", LAUNCHER_FILES)
def test_launcher_config_passes_rays_validator(rel):
    prepared = ray_up_validate(load_yaml(rel))
    head = prepared["head_node_type"]
    assert head in prepared["available_node_types"]
    # The defaults were filled (validate_config requires it), and ours won over them.
    assert "cluster_synced_files" in prepared
    assert any("~/popgrpo" in cmd for cmd in prepared["head_setup_commands"])


def _typo_top_level_key(c):
    c["setup_command"] = c.pop("setup_commands")  # a missing "s": Ray's schema forbids unknown keys


def _commands_as_string(c):
    c["worker_start_ray_commands"] = "ray start --address=$RAY_HEAD_IP:6379"


def _fractional_cpu(c):
    c["available_node_types"]["cpu-worker"]["resources"]["CPU"] = 7.5  # the schema wants integers


def _min_above_global_max(c):
    c["available_node_types"]["cpu-worker"]["min_workers"] = c["max_workers"] + 1


def _worker_ips_as_string(c):
    c["provider"]["worker_ips"] = "192.0.2.11,192.0.2.12"


BROKEN = [
    ("cluster/aws.yaml", _typo_top_level_key, jsonschema.ValidationError),
    ("cluster/aws.yaml", _commands_as_string, jsonschema.ValidationError),
    ("cluster/aws.yaml", _fractional_cpu, jsonschema.ValidationError),
    ("cluster/aws.yaml", _min_above_global_max, ValueError),
    ("cluster/onprem.yaml", _typo_top_level_key, jsonschema.ValidationError),
    ("cluster/onprem.yaml", _worker_ips_as_string, jsonschema.ValidationError),
]


@pytest.mark.parametrize(("rel", "break_it", "error"), BROKEN, ids=[f"{r}-{f.__name__}" for r, f, _ in BROKEN])
def test_broken_copy_fails_rays_validator(rel, break_it, error):
    config = load_yaml(rel)
    ray_up_validate(config)  # the original passes ...
    broken = copy.deepcopy(config)
    break_it(broken)
    with pytest.raises(error):  # ... and the broken copy does not
        ray_up_validate(broken)


# ---- what the schema cannot see -------------------------------------------------------------
@pytest.mark.parametrize("rel", LAUNCHER_FILES)
def test_token_auth_stays_on_for_every_node(rel):
    config = load_yaml(rel)
    assert "RAY_AUTH_MODE=disabled" not in (REPO / rel).read_text()
    assert SECRETS_MOUNT in config["file_mounts"], "the auth token must reach every node"
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        invocations = ray_start_invocations(config[key])
        assert len(invocations) == 1, key
        before, _ = invocations[0]
        # Set in the same shell, before `ray start`, so the raylet and all it starts inherit it.
        assert "RAY_AUTH_MODE=token" in before, key
        assert f"RAY_AUTH_TOKEN_PATH={SECRETS_MOUNT.replace('~', '$HOME')}/auth_token" in before, key


@pytest.mark.parametrize("rel", LAUNCHER_FILES)
def test_ray_start_flags_exist_and_agree(rel):
    config = load_yaml(rel)
    known = ray_start_option_names()
    (_, head_args), (_, worker_args) = (
        ray_start_invocations(config["head_start_ray_commands"])[0],
        ray_start_invocations(config["worker_start_ray_commands"])[0],
    )
    for args in (head_args, worker_args):
        unknown = sorted(set(flag_values(args)) - known)
        assert not unknown, f"not `ray start` options: {unknown}"
    head, worker = flag_values(head_args), flag_values(worker_args)
    assert "--head" in head
    # The dashboard (Jobs API included) only on loopback: reached through `ray dashboard`'s tunnel.
    assert head["--dashboard-host"] == "127.0.0.1"
    # Workers join the port the head's GCS listens on, and export metrics where the head does.
    assert worker["--address"] == f"$RAY_HEAD_IP:{head['--port']}"
    assert head["--metrics-export-port"] == worker["--metrics-export-port"] is not None


@pytest.mark.parametrize("rel", LAUNCHER_FILES)
def test_setup_installs_the_cpu_torch_pin_before_the_package(rel):
    config = load_yaml(rel)
    pin = makefile_torch_pin()
    commands = config["setup_commands"]
    torch_at = next(i for i, c in enumerate(commands) if "torch" in c)
    package_at = next(i for i, c in enumerate(commands) if re.search(r"pip install .*~/popgrpo\b", c))
    assert torch_at < package_at, "torch first, or pip resolves the CUDA build as a dependency"
    assert f'"{pin}"' in commands[torch_at] and "download.pytorch.org/whl/cpu" in commands[torch_at]
    # One Ray version everywhere: the container's Ray is the one this project is tested with.
    import ray

    assert config["docker"]["image"] == f"rayproject/ray:{ray.__version__}-py311-cpu"


def test_aws_gpu_type_overrides_setup_with_the_same_torch_version():
    gpu = load_yaml("cluster/aws.yaml")["available_node_types"]["gpu-worker"]
    version = makefile_torch_pin().split("==")[1]
    commands = gpu["worker_setup_commands"]
    assert f'"torch=={version}"' in commands[0] and "whl/cpu" not in commands[0]  # the CUDA wheel
    assert any("pip install" in c and "~/popgrpo" in c for c in commands[1:])
    assert gpu["resources"].get("GPU", 0) >= 1 and gpu["min_workers"] == 0


def test_smallest_aws_cluster_holds_the_pop_grpo_preset():
    """popgrpo checks ray.cluster_resources() when a run starts: the nodes up at min_workers
    must hold the preset, or the first submitted run exits 2 before the autoscaler reacts."""
    prepared = ray_up_validate(load_yaml("cluster/aws.yaml"))
    types = prepared["available_node_types"]
    head = prepared["head_node_type"]
    assert types[head]["resources"]["CPU"] == 0
    assert "--num-cpus" in flag_values(ray_start_invocations(prepared["head_start_ray_commands"])[0][1])
    worker_cpus = sum(t["min_workers"] * t["resources"].get("CPU", 0) for name, t in types.items() if name != head)
    assert worker_cpus >= actor_cpus_needed(pop_grpo_preset()) > 0


@pytest.mark.parametrize("rel", LAUNCHER_FILES)
def test_repository_mount_syncs_the_repo_without_local_state(rel):
    config = load_yaml(rel)
    # `ray up` is run from the repository root, so the local side "." is the repository.
    local = config["file_mounts"]["~/popgrpo"]
    assert (REPO / local / "pyproject.toml").is_file()
    assert {".venv", "runs", ".git"} <= set(config["rsync_exclude"])


def test_onprem_placeholders_are_distinct_addresses():
    provider = load_yaml("cluster/onprem.yaml")["provider"]
    addresses = [provider["head_ip"], *provider["worker_ips"]]
    assert len(set(addresses)) == len(addresses), "the head is not also a worker, and no worker twice"


# ---- the job runtime env --------------------------------------------------------------------
def runtime_env() -> dict:
    return load_yaml(RUNTIME_ENV)


def test_runtime_env_is_accepted_by_ray_and_names_existing_paths():
    from ray.runtime_env import RuntimeEnv

    env = runtime_env()
    parsed = RuntimeEnv(**env)  # Ray's own field validation (types, known plugins)
    assert parsed["env_vars"] == env["env_vars"]
    # Relative paths are resolved from where `ray job submit` runs: the repository root.
    for rel in [env["working_dir"], *env.get("py_modules", [])]:
        assert (REPO / rel).exists(), rel
    assert (REPO / env["working_dir"]).resolve() == REPO


def _package(tmp_path: Path, include_gitignore: bool) -> list[str]:
    """The file names Ray would upload for working_dir (its own zip routine)."""
    from ray._private.runtime_env.packaging import PACKAGE_SIZE_WARNING, _zip_files

    env = runtime_env()
    out = tmp_path / f"pkg-{include_gitignore}.zip"
    _zip_files(str(REPO / env["working_dir"]), env["excludes"], str(out), include_gitignore=include_gitignore)
    assert out.stat().st_size < PACKAGE_SIZE_WARNING, "Ray would warn that the package nears its size limit"
    with zipfile.ZipFile(out) as z:
        return z.namelist()


@pytest.mark.parametrize("include_gitignore", [True, False], ids=["with-gitignore", "excludes-alone"])
def test_runtime_env_uploads_code_and_presets_but_no_local_state(tmp_path, include_gitignore):
    names = set(_package(tmp_path, include_gitignore))
    needed = {"popgrpo/__init__.py", "popgrpo/config/__init__.py", "popgrpo/__main__.py", "popgrpo/cli/job.py"}
    needed |= {f"jobs/configs/{p.name}" for p in (REPO / "jobs" / "configs").glob("*.yaml")}
    assert needed <= names, sorted(needed - names)
    tops = {n.split("/")[0] for n in names}
    assert not tops & {".venv", ".git", "runs", "tests"}, tops
    assert not [n for n in names if "__pycache__" in n or ".egg-info" in n]


def test_runtime_env_excludes_skip_heavy_directories_whole():
    """Ray tests a directory against the excludes before entering it; a pattern that matches
    only the directory's contents ("/.venv/") makes it walk every file of the venv."""
    from ray._private.runtime_env.packaging import _get_excludes

    excluded = _get_excludes(REPO, runtime_env()["excludes"])
    for name in (".venv", ".git", "runs", "tests"):
        assert excluded(REPO / name), name


def test_runtime_env_forwards_the_redis_password_without_holding_it(monkeypatch):
    from ray._private.utils import update_envs

    from popgrpo.runtime.archive_store import PASSWORD_ENV, resolve_redis_password

    env_vars = runtime_env()["env_vars"]
    assert env_vars[PASSWORD_ENV] == "${" + PASSWORD_ENV + "}", "a literal password must never be in git"
    for key in env_vars:
        monkeypatch.delenv(key, raising=False)  # restored after the test
    # Ray expands ${VAR} from the node's environment when it starts the job's processes.
    monkeypatch.setenv(PASSWORD_ENV, "from-the-node")
    update_envs(env_vars)
    assert resolve_redis_password("redis://popgrpo-redis:6379/1") == "from-the-node"
    # Unset on the node: Ray leaves "", which popgrpo reads as no password (not as the password "").
    monkeypatch.delenv(PASSWORD_ENV)
    update_envs(env_vars)
    assert resolve_redis_password("redis://popgrpo-redis:6379/1") is None


def test_cluster_readme_config_paths_exist():
    text = (REPO / "cluster" / "README.md").read_text()
    paths = re.findall(r"--config\s+(\S+\.ya?ml)", text)
    assert paths, "the README shows no --config path"
    for path in paths:
        assert (REPO / path).is_file(), path
    assert "ray job submit --runtime-env cluster/runtime_env.yaml" in text
