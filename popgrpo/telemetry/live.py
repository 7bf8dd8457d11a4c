"""Live metrics through ``ray.util.metrics``: the Ray dashboard, Prometheus and Grafana see them.

:data:`METRICS` is the one list of what is exported (the table in docs/reference/metrics.md is
generated from it and a test scrapes a real run for every entry). Names start with ``popgrpo_``; Ray's
Prometheus exporter adds its ``ray_`` prefix, so Prometheus and Grafana see
``ray_popgrpo_reward_mean`` and so on. Every series carries the tag ``run`` (the run
directory's name); per-member series also carry ``member``.

Member metrics are set inside the member actors after every epoch (live within a round);
the round gauge, the restarts counter and the population's code metrics (pooled over every
member's rows of an epoch, :mod:`popgrpo.telemetry.code_population`) are set by the
driver-side executor as the members' rows come back. The ``code`` metrics are exported by runs
on code problems (``env.kind: code``) only: other runs have no pass@k to report.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from popgrpo.markdown import md_table

__all__ = ["METRICS", "LiveMetrics", "metrics_markdown"]


@dataclass(frozen=True)
class MetricSpec:
    type: Literal["gauge", "counter"]  # the Prometheus metric type
    description: str
    tags: tuple[str, ...]
    row_key: str | None = None  # the metrics.parquet column it mirrors, if any
    population_key: str | None = None  # the key of population_code_scalars it mirrors, if any
    code: bool = False  # exported by runs on code problems only


_MEMBER = ("run", "member")
_RUN = ("run",)
METRICS: dict[str, MetricSpec] = {
    "popgrpo_reward_mean": MetricSpec(
        "gauge", "Mean execution reward of the member's latest epoch.", _MEMBER, "reward_mean"
    ),
    "popgrpo_reward_max": MetricSpec(
        "gauge", "Best reward per step, averaged over the member's latest epoch.", _MEMBER, "reward_max"
    ),
    "popgrpo_diversity": MetricSpec(
        "gauge", "Mean pairwise cosine distance of the member's ideas (latest epoch).", _MEMBER, "diversity"
    ),
    "popgrpo_complexity": MetricSpec(
        "gauge", "Mean idea complexity (L2 norm) of the member's latest epoch.", _MEMBER, "complexity"
    ),
    "popgrpo_entropy": MetricSpec(
        "gauge", "Policy entropy, nats per idea dimension (latest epoch).", _MEMBER, "entropy"
    ),
    "popgrpo_alpha": MetricSpec(
        "gauge", "Adaptive entropy coefficient alpha (MaxEnt-GRPO; 0 when off).", _MEMBER, "alpha"
    ),
    "popgrpo_archive_coverage": MetricSpec(
        "gauge",
        "Fraction of archive cells filled (the member's archive, or the shared one).",
        _MEMBER,
        "archive_coverage",
    ),
    "popgrpo_archive_qd_score": MetricSpec("gauge", "Sum of the archive's elite rewards.", _MEMBER, "archive_qd_score"),
    "popgrpo_ideas_total": MetricSpec(
        "counter", "Ideas evaluated (sampled and rewarded) by the member.", _MEMBER, "ideas"
    ),
    "popgrpo_control_reward_mean": MetricSpec(
        "gauge",
        "Mean execution reward of the member's latest epoch, whatever it trained on: the control reward of a run against a learned proxy (reward.source=proxy); equal to popgrpo_reward_mean otherwise.",
        _MEMBER,
        "control_reward_mean",
    ),
    "popgrpo_control_expected_reward": MetricSpec(
        "gauge",
        "Noise-free expected execution reward E[R] = Q*p_exec of the member's latest ideas (idea environment).",
        _MEMBER,
        "control_expected_reward",
    ),
    "popgrpo_code_pass_at_1": MetricSpec(
        "gauge",
        "Code problems: the member's unbiased pass@1 over the problems it answered in its latest epoch (a sample passes when it passes every test).",
        _MEMBER,
        "code_pass_at_1",
        code=True,
    ),
    "popgrpo_code_pass_at_group": MetricSpec(
        "gauge",
        "Code problems: the member's unbiased pass@k, k = the group size, over the problems it answered in its latest epoch.",
        _MEMBER,
        "code_pass_at_group",
        code=True,
    ),
    "popgrpo_code_solved": MetricSpec(
        "gauge",
        "Code problems: problems the member solved (at least one sample passed every test) in its latest epoch.",
        _MEMBER,
        "code_solved",
        code=True,
    ),
    "popgrpo_code_distinct_correct": MetricSpec(
        "gauge",
        "Code problems: distinct correct programs (AST-normalised: renaming does not count) per problem the member solved in its latest epoch.",
        _MEMBER,
        "code_distinct_correct",
        code=True,
    ),
    "popgrpo_population_code_pass_at_1": MetricSpec(
        "gauge",
        "Code problems: the population's pass@1 over every member's samples of the latest epoch all members finished, pooled per problem.",
        _RUN,
        population_key="population_code_pass_at_1",
        code=True,
    ),
    "popgrpo_population_code_pass_at_group": MetricSpec(
        "gauge",
        "Code problems: the population's pass@k (k = the group size) over the pooled samples of the latest epoch all members finished.",
        _RUN,
        population_key="population_code_pass_at_group",
        code=True,
    ),
    "popgrpo_best_member_code_pass_at_group": MetricSpec(
        "gauge",
        "Code problems: the best single member's pass@k (k = the group size) in the same epoch, for comparison with the population's.",
        _RUN,
        population_key="best_member_code_pass_at_group",
        code=True,
    ),
    "popgrpo_population_code_solved": MetricSpec(
        "gauge",
        "Code problems: problems solved by any member in the latest epoch all members finished.",
        _RUN,
        population_key="population_code_solved",
        code=True,
    ),
    "popgrpo_best_member_code_solved": MetricSpec(
        "gauge",
        "Code problems: problems solved by the best single member in the same epoch.",
        _RUN,
        population_key="best_member_code_solved",
        code=True,
    ),
    "popgrpo_population_code_distinct_correct": MetricSpec(
        "gauge",
        "Code problems: distinct correct programs of all members together per problem solved, in the latest epoch all members finished.",
        _RUN,
        population_key="population_code_distinct_correct",
        code=True,
    ),
    "popgrpo_round": MetricSpec("gauge", "Scheduler round in progress (0-based).", _RUN),
    "popgrpo_restarts_total": MetricSpec(
        "counter",
        "Actors rebuilt or restarted after a failure (member actors, archive actor); cause `lost` (its process or node died) or `hung` (no answer within its deadline: its process was ended and it was replaced).",
        ("run", "cause"),
    ),
}


class LiveMetrics:
    """Records :data:`METRICS` for one run. Create it in the process that reports.

    Ray's exporter drops a gauge series about 20 s after its last ``set`` (counters stay), so a
    round or an epoch longer than that would leave gaps in Prometheus and Grafana. A daemon
    thread re-sets every gauge's last value each ``refresh_s`` seconds.
    """

    def __init__(self, run: str, refresh_s: float = 5.0) -> None:
        from ray.util.metrics import Counter, Gauge

        self.run = run
        self._gauges: dict[str, Gauge] = {}
        self._counters: dict[str, Counter] = {}
        for name, spec in METRICS.items():
            if spec.type == "gauge":
                self._gauges[name] = Gauge(name, description=spec.description, tag_keys=spec.tags)
            else:
                self._counters[name] = Counter(name, description=spec.description, tag_keys=spec.tags)
        self._last: dict[tuple[str, tuple], float] = {}  # (gauge, sorted tags) -> last value
        self._lock = threading.Lock()
        self._refresh_s = refresh_s
        # Rows of epochs not every member has finished yet (code runs only): {epoch: {member: row}}.
        self._pending: dict[int, dict[int, Mapping[str, Any]]] = {}
        self._published_epoch = -1
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._keep_alive, name="popgrpo-metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop refreshing: the run is over, so its gauges may expire from Ray's export.
        Returns once the refresher has stopped: no gauge is set after this."""
        self._closed.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=30)

    def _set(self, name: str, value: float, tags: dict[str, str]) -> None:
        # Under the lock, so a refresh never re-sets an older value after this one.
        with self._lock:
            self._gauges[name].set(value, tags=tags)
            self._last[(name, tuple(sorted(tags.items())))] = value

    def _keep_alive(self) -> None:
        while not self._closed.wait(self._refresh_s):
            with self._lock:
                for (name, tags), value in self._last.items():
                    self._gauges[name].set(value, tags=dict(tags))

    def record_epoch(self, row: dict) -> None:
        tags = {"run": self.run, "member": str(row["member"])}
        for name, spec in METRICS.items():
            if spec.row_key is None:
                continue
            value = float(row.get(spec.row_key, float("nan")))
            if value != value:  # NaN (e.g. no finite reward this epoch): leave the last value
                continue
            if spec.type == "gauge":
                self._set(name, value, tags)
            elif value > 0:
                self._counters[name].inc(value, tags=tags)

    def record_rows(self, rows: Iterable[Mapping[str, Any]], members: int) -> None:
        """Members' rows as they come back to the driver (a round's, or one actor's in an
        asynchronous run): once every one of the ``members`` has finished an epoch, the
        population's code gauges show that epoch's pooled figures. Rows without a code record
        (runs not on code problems) are not kept."""
        from popgrpo.telemetry.code_population import population_code_scalars

        for row in rows:
            epoch = int(row["epoch"])
            if isinstance(row.get("code_problems"), str) and epoch > self._published_epoch:
                self._pending.setdefault(epoch, {})[int(row["member"])] = row
        complete = [epoch for epoch, by_member in self._pending.items() if len(by_member) >= members]
        if not complete:
            return
        latest = max(complete)
        values = population_code_scalars(list(self._pending[latest].values()))
        self._pending = {epoch: rows for epoch, rows in self._pending.items() if epoch > latest}
        self._published_epoch = latest
        for name, spec in METRICS.items():
            if spec.population_key is not None and spec.population_key in values:
                self._set(name, values[spec.population_key], {"run": self.run})

    def record_round(self, round_index: int) -> None:
        self._set("popgrpo_round", round_index, {"run": self.run})

    def record_restart(self, cause: str = "lost") -> None:
        """One actor rebuilt or restarted; ``cause``: ``lost`` or ``hung``."""
        self._counters["popgrpo_restarts_total"].inc(1, tags={"run": self.run, "cause": cause})


def metrics_markdown() -> str:
    rows = [
        [
            f"`{name}`",
            spec.type,
            ", ".join(spec.tags),
            spec.description + (" Exported by code runs only." if spec.code else ""),
        ]
        for name, spec in METRICS.items()
    ]
    return md_table(["metric (Prometheus: `ray_` + name)", "type", "tags", "meaning"], rows) + "\n"
