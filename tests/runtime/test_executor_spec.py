"""train() takes its executor as a value: ExecutorSpec, built by runtime.executor_spec.build_executor."""

from pathlib import Path

import pytest

from popgrpo.config import ConfigError
from popgrpo.runtime.executor import LocalExecutor
from popgrpo.runtime.executor_spec import LOCAL, ExecutorSpec, build_executor, check_executor
from popgrpo.train import train
from tests.configs import grpo


def _cfg(*extra: str):
    return grpo("population.size=2", "run.epochs=2", "grpo.steps_per_epoch=2", "run.loggers=[]", *extra)


def test_only_the_ray_executor_serves_a_redis_archive():
    cfg = _cfg("archive.redis_url=redis://127.0.0.1:1/0")
    with pytest.raises(ConfigError, match=r"archive.redis_url: Redis write-through is done by the Ray executor"):
        check_executor(cfg, LOCAL)
    check_executor(cfg, ExecutorSpec("ray"))  # no error: the Ray executor's archive actor writes through
    check_executor(_cfg(), LOCAL)


def test_the_local_spec_builds_a_local_executor_and_says_so(tmp_path: Path):
    said: list[str] = []
    executor = build_executor(LOCAL, _cfg(), tmp_path, say=said.append)
    try:
        assert isinstance(executor, LocalExecutor)
    finally:
        executor.close()
    assert said == ["building 2 member(s) in this process (--executor local: no Ray)"]


def test_a_spec_and_a_factory_give_the_same_run(tmp_path: Path):
    """The value and the test seam (executor_factory) build the same executor: the same metrics."""
    by_value = train(_cfg(), tmp_path / "value", LOCAL, progress=False)
    by_factory = train(_cfg(), tmp_path / "factory", executor_factory=LocalExecutor, progress=False)
    assert by_value == by_factory


def test_a_factory_in_the_executor_value_place_is_a_type_error_that_says_where_it_goes(tmp_path: Path):
    with pytest.raises(TypeError, match="executor_factory="):
        train(_cfg(), tmp_path / "run", LocalExecutor, progress=False)  # pyright: ignore[reportArgumentType]
