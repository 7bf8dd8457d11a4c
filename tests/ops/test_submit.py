"""`popgrpo submit` / `popgrpo jobs` against a real Ray head (`ray start --head`, token auth on)."""

import json
import subprocess
import sys
import time

import pandas as pd
import pytest

from popgrpo import __version__ as popgrpo_version
from popgrpo.config import load_config, preset_path
from popgrpo.ops.ray_jobs import build_job, config_request
from tests.services import RayHead

pytestmark = [pytest.mark.ray, pytest.mark.heavy]

SHORT = [
    "population.size=3",
    "population.members_per_actor=3",
    "run.epochs=6",
    "scheduler.interval_epochs=2",
    "grpo.steps_per_epoch=3",
]


@pytest.fixture(scope="module")
def head():
    head = RayHead(num_cpus=2)
    yield head
    head.stop()


def popgrpo(head, *args, timeout=300, token=None):
    env = dict(head.env)
    if token is not None:
        env["RAY_AUTH_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "popgrpo", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def job_ids(head) -> list[str]:
    out = popgrpo(head, "jobs", "list", "--address", head.address)
    assert out.returncode == 0, out.stderr
    return [line.split("\t")[0] for line in out.stdout.splitlines()]


def test_build_job_ships_the_resolved_config_and_the_package(tmp_path):
    cfg = load_config(preset_path("pop_grpo"), ["run.seed=7"])
    spec = build_job(cfg, tmp_path / "stage", runtime_env={"env_vars": {"A": "1"}, "py_modules": ["/x"]})
    assert load_config(tmp_path / "stage" / "config.yaml") == cfg  # --set overrides travel resolved
    assert spec.runtime_env["working_dir"] == str(tmp_path / "stage")
    assert spec.runtime_env["env_vars"] == {"A": "1"}
    assert spec.runtime_env["py_modules"][0] == "/x" and spec.runtime_env["py_modules"][1].endswith("popgrpo")
    assert spec.out == f"~/popgrpo-runs/{spec.submission_id}" and spec.submission_id.startswith("popgrpo-pop_grpo-")
    assert spec.entrypoint.startswith("python -m popgrpo.cli.job --config config.yaml --out '~/popgrpo-runs/")
    with pytest.raises(ValueError, match="working_dir"):
        build_job(cfg, tmp_path / "s2", runtime_env={"working_dir": "."})


def test_build_job_names_the_run_for_the_jobs_page(tmp_path):
    """The Name column (metadata ``job_name``), the metadata on the job's page, and an
    entrypoint that is a short command a person can read."""
    cfg = load_config(preset_path("pop_grpo"), ["population.size=3", "run.seed=3"])
    request = config_request("pop_grpo", ["population.size=3"], 3)
    assert request == "pop_grpo --set population.size=3 --seed 3"
    spec = build_job(cfg, tmp_path / "stage", request=request, submission_id="popgrpo-x", out="/runs/x")
    assert spec.metadata == {
        "job_name": "popgrpo pop_grpo, seed 3",
        "popgrpo_run_name": "pop_grpo",
        "popgrpo_config": "pop_grpo --set population.size=3 --seed 3",
        "popgrpo_seed": "3",
        "popgrpo_run_dir": "/runs/x",
        "popgrpo_version": popgrpo_version,
    }
    assert spec.entrypoint == "python -m popgrpo.cli.job --config config.yaml --out /runs/x"


def test_the_jobs_page_shows_the_runs_name_and_metadata(head, tmp_path):
    """What the dashboard's Jobs page reads (the job server's job info): the metadata that
    ``submit`` sent, whatever became of the job (this one cannot fit the head and fails fast)."""
    out_dir = tmp_path / "meta-run"
    out = popgrpo(
        head, "submit", "grpo", "--address", head.address, "--set", "population.resources.num_cpus=64",
        "--seed", "5", "--out", str(out_dir), "--quiet",
    )  # fmt: skip
    submission = next(line.split(": ", 1)[1] for line in out.stdout.splitlines() if line.startswith("submitted: "))
    code = (
        "import json\n"
        "from ray.job_submission import JobSubmissionClient\n"
        f"info = JobSubmissionClient({head.address!r}).get_job_info({submission!r})\n"
        "print(json.dumps({'metadata': info.metadata, 'entrypoint': info.entrypoint}))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], env=head.env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    info = json.loads(res.stdout.strip().splitlines()[-1])
    assert info["metadata"]["job_name"] == "popgrpo grpo, seed 5"
    assert info["metadata"]["popgrpo_config"] == "grpo --set population.resources.num_cpus=64 --seed 5"
    assert info["metadata"]["popgrpo_run_dir"] == str(out_dir)
    assert info["entrypoint"] == f"python -m popgrpo.cli.job --config config.yaml --out {out_dir} --quiet"


def test_submit_runs_pop_grpo_to_success_and_writes_the_run_directory(head, tmp_path):
    run_dir = tmp_path / "job-run"
    sets = [a for s in SHORT for a in ("--set", s)]
    out = popgrpo(head, "submit", "pop_grpo", "--address", head.address, *sets, "--seed", "3", "--out", str(run_dir))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    submission = next(line.split(": ", 1)[1] for line in out.stdout.splitlines() if line.startswith("submitted: "))
    assert f"job {submission}: SUCCEEDED" in out.stdout
    assert "attaching to the job's Ray cluster" in out.stdout  # the job used the cluster, not its own Ray
    metrics = pd.read_parquet(run_dir / "metrics.parquet")
    assert sorted(set(zip(metrics.member, metrics.epoch, strict=True))) == [(m, e) for m in range(3) for e in range(6)]
    lineage = [json.loads(line) for line in (run_dir / "lineage.jsonl").read_text().splitlines()]
    assert [r["round"] for r in lineage] == [0, 1]  # rounds 0..2; the last one ends the run, no merge
    assert load_config(run_dir / "config.yaml").run.seed == 3
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["epochs"] == 6 and summary["members"] == 3 and summary["max_reward"] > 0
    assert json.loads((run_dir / "checkpoints" / "latest.json").read_text())["round"] == 2
    status = popgrpo(head, "jobs", "status", submission, "--address", head.address)
    assert status.returncode == 0 and "SUCCEEDED" in status.stdout
    logs = popgrpo(head, "jobs", "logs", submission, "--address", head.address)
    assert "run directory: " + str(run_dir) in logs.stdout
    # Attached, the run names the cluster's own dashboard, and where its token is, not the token.
    assert f"popgrpo: Ray dashboard: {head.address} (token auth is on" in logs.stdout
    assert head.env["RAY_AUTH_TOKEN"] not in logs.stdout


def test_a_config_the_cluster_cannot_run_ends_failed_with_the_error_in_the_logs(head, tmp_path):
    out = popgrpo(
        head, "submit", "grpo", "--address", head.address, "--set", "population.resources.num_cpus=64",
        "--out", str(tmp_path / "too-big"), "--quiet",
    )  # fmt: skip
    assert out.returncode == 1
    submission = next(line.split(": ", 1)[1] for line in out.stdout.splitlines() if line.startswith("submitted: "))
    assert f"job {submission}: FAILED" in out.stdout
    logs = popgrpo(head, "jobs", "logs", submission, "--address", head.address).stdout
    assert "the population needs 64 CPUs" in logs and "population.resources.num_cpus" in logs


def test_an_invalid_config_is_refused_before_anything_is_submitted(head):
    before = job_ids(head)
    out = popgrpo(head, "submit", "pop_grpo", "--address", head.address, "--set", "scheduler.top_m=0")
    assert out.returncode == 2 and "scheduler.top_m" in out.stderr
    assert job_ids(head) == before


def test_no_wait_then_status_logs_and_stop(head, tmp_path):
    out = popgrpo(
        head, "submit", "pop_grpo", "--address", head.address, "--no-wait", "--quiet",
        # A job that fits the 2-CPU head (one actor of 3 members) and runs until stopped; the
        # preset's 5 one-CPU actors would end FAILED at the fit check, which a busy machine
        # reaches before the stop.
        "--set", "population.size=3", "--set", "population.members_per_actor=3",
        "--set", "run.epochs=100000", "--out", str(tmp_path / "long"),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    submission = next(line.split(": ", 1)[1] for line in out.stdout.splitlines() if line.startswith("submitted: "))
    assert submission in job_ids(head)
    # Generous deadlines: on a busy machine (a CPU hog beside the suite) the job's driver and each
    # `popgrpo jobs` process start slowly; a healthy run leaves each loop in seconds.
    deadline = time.time() + 300
    while time.time() < deadline:
        status = popgrpo(head, "jobs", "status", submission, "--address", head.address).stdout
        if "RUNNING" in status:
            break
        time.sleep(1)
    assert "RUNNING" in status
    stop = popgrpo(head, "jobs", "stop", submission, "--address", head.address)
    if "stop requested" not in stop.stdout:  # it ended by itself: its own logs say why
        logs = popgrpo(head, "jobs", "logs", submission, "--address", head.address)
        pytest.fail(f"{stop.stdout.strip()}; the job's logs:\n{logs.stdout[-4000:]}{logs.stderr[-2000:]}")
    assert stop.returncode == 0
    deadline = time.time() + 180
    while time.time() < deadline and "STOPPED" not in status:
        status = popgrpo(head, "jobs", "status", submission, "--address", head.address).stdout
        time.sleep(1)
    assert "STOPPED" in status
    follow = popgrpo(head, "jobs", "logs", "--follow", submission, "--address", head.address)
    assert follow.returncode == 1  # a stopped job did not succeed


def test_a_wrong_token_or_unknown_job_is_one_line_and_never_echoes_the_token(head):
    wrong = "f" * 32
    out = popgrpo(head, "jobs", "list", "--address", head.address, token=wrong)
    assert out.returncode == 1 and out.stderr.count("\n") <= 3, out.stderr
    assert wrong not in out.stdout + out.stderr and head.env["RAY_AUTH_TOKEN"] not in out.stdout + out.stderr
    out = popgrpo(head, "jobs", "status", "popgrpo-no-such-job", "--address", head.address)
    assert out.returncode == 1 and "Traceback" not in out.stderr


def test_the_plain_ray_job_submit_form_with_an_invalid_config_fails_with_the_field_in_its_logs(head, tmp_path):
    """What `ray job submit -- python -m popgrpo.cli.job --config FILE` does when FILE is invalid:
    the config is only checked on the cluster, and the job's logs say which field is wrong."""
    import os

    import popgrpo

    stage = tmp_path / "stage"
    stage.mkdir()
    (stage / "bad.yaml").write_text("scheduler:\n  enabled: true\n  top_m: 0\n")
    code = (
        "import os, sys, time\n"
        "from ray.job_submission import JobSubmissionClient\n"
        f"c = JobSubmissionClient({head.address!r})\n"
        "sid = c.submit_job(entrypoint='python -m popgrpo.cli.job --config bad.yaml --quiet', runtime_env="
        f"{{'working_dir': {str(stage)!r}, 'py_modules': [{os.path.dirname(popgrpo.__file__)!r}]}})\n"
        "while not c.get_job_status(sid).is_terminal(): time.sleep(0.5)\n"
        "print(c.get_job_status(sid).value); print(c.get_job_logs(sid))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=head.env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    status, logs = out.stdout.split("\n", 1)
    assert status == "FAILED"
    assert "popgrpo: invalid config (bad.yaml): scheduler.top_m" in logs and "Traceback" not in logs
