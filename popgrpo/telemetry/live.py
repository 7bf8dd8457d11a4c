"""Live metrics through ``ray.util.metrics``: the Ray dashboard, Prometheus and Grafana see them.

:data:`METRICS` is the one list of what is exported (the table in docs/reference/metrics.md is
generated from it and a test scrapes a real run for every entry). Names start with ``popgrpo_``; Ray's
Prometheus exporter adds its ``ray_`` prefix, so Prometheus and Grafana see
``ray_popgrpo_reward_mean`` and so on. Every series carries the tag ``run`` (the run
directory's name); per-member series also carry ``member``.

Member metrics are set inside the member actors after every epoch (live within a round);
the round gauge and the restarts counter are set by the driver-side executor.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

__all__ = ["METRICS", "LiveMetrics", "metrics_markdown"]


@dataclass(frozen=True)
class MetricSpec:
    kind: str  # "gauge" or "counter"
    description: str
    tags: tuple[str, ...]
    row_key: str | None = None  # the metrics.parquet column it mirrors, if any


_MEMBER = ("run", "member")
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
    "popgrpo_round": MetricSpec("gauge", "Scheduler round in progress (0-based).", ("run",)),
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
            if spec.kind == "gauge":
                self._gauges[name] = Gauge(name, description=spec.description, tag_keys=spec.tags)
            else:
                self._counters[name] = Counter(name, description=spec.description, tag_keys=spec.tags)
        self._last: dict[tuple[str, tuple], float] = {}  # (gauge, sorted tags) -> last value
        self._lock = threading.Lock()
        self._refresh_s = refresh_s
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
            value = float(row[spec.row_key])
            if value != value:  # NaN (e.g. no finite reward this epoch): leave the last value
                continue
            if spec.kind == "gauge":
                self._set(name, value, tags)
            elif value > 0:
                self._counters[name].inc(value, tags=tags)

    def record_round(self, round_index: int) -> None:
        self._set("popgrpo_round", round_index, {"run": self.run})

    def record_restart(self, cause: str = "lost") -> None:
        """One actor rebuilt or restarted; ``cause``: ``lost`` or ``hung``."""
        self._counters["popgrpo_restarts_total"].inc(1, tags={"run": self.run, "cause": cause})


def metrics_markdown() -> str:
    lines = ["| metric (Prometheus: `ray_` + name) | type | tags | meaning |", "| --- | --- | --- | --- |"]
    for name, spec in METRICS.items():
        lines.append(f"| `{name}` | {spec.kind} | {', '.join(spec.tags)} | {spec.description} |")
    return "\n".join(lines) + "\n"
