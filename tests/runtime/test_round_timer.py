"""popgrpo.runtime.round_timer.RoundTimer on a stand-in executor: calls, rounds, marks, close."""

from popgrpo.runtime.round_timer import RoundTimer


class Recorder:
    """An executor's public surface, recording what was asked of it."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.closed = False

    def train(self, n_epochs: int) -> list:
        self.asked.append("train")
        return [n_epochs]

    def adopt(self) -> str:
        self.asked.append("adopt")
        return "adopted"

    def snapshot(self) -> str:
        return "state"

    def worker_pids(self) -> list[int]:
        self.asked.append("pids")
        return [11, 12]

    def epoch_cpu_seconds(self) -> list[list[float]]:
        assert not self.closed  # read before the executor closes
        return [[0.5, 0.25], [0.5, 0.5]]

    def close(self) -> None:
        self.closed = True


def test_rounds_start_at_train_and_only_timed_calls_are_recorded():
    inner = Recorder()
    marks: list[int | None] = []
    timer = RoundTimer(inner, timed=("adopt",), mark=marks.append)
    assert timer.snapshot() == "state"  # untimed: passed through, not recorded
    assert timer.train(3) == [3] and timer.adopt() == "adopted" and timer.train(3) == [3]
    timer.close()
    assert [(c.name, c.round) for c in timer.calls] == [("train", 0), ("adopt", 0), ("train", 1)]
    assert marks == [0, 1, None] and timer.rounds == 2 and len(timer.starts) == 3 and inner.closed
    assert [set(r) for r in timer.round_calls()] == [{"train", "adopt"}, {"train"}]
    assert timer.per_round(("adopt",))[1] == 0.0 and all(s > 0 for s in timer.round_seconds())
    everything = sum(c.seconds for c in timer.calls)
    assert timer.total("train") + timer.total("adopt") == everything
    assert timer.total("train", hi=timer.calls[0].start) == 0.0  # clipped to the window
    assert timer.epoch_cpu == [[0.5, 0.25], [0.5, 0.5]]


def test_worker_pids_are_asked_once():
    inner = Recorder()
    timer = RoundTimer(inner)
    assert timer.worker_pids() == [11, 12] == timer.worker_pids()
    assert inner.asked.count("pids") == 1
