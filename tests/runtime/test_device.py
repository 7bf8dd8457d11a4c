"""Where members compute: GPUs reserved through Ray reach the member actors; without CUDA the
members fall back to the CPU and say so (an event), never silently."""

import pytest
import torch

from popgrpo.algorithms.archive_service import LocalArchive
from popgrpo.algorithms.member import Member, resolve_device
from popgrpo.config import load_config, preset_path
from popgrpo.runtime.executor import LocalExecutor

CUDA = torch.cuda.is_available()


def test_resolve_device_rules():
    assert resolve_device("cpu", has_gpu=True) == (torch.device("cpu"), None)
    assert resolve_device("auto", has_gpu=False) == (torch.device("cpu"), None)
    device, warning = resolve_device("auto", has_gpu=True)
    if CUDA:
        assert device.type == "cuda" and warning is None
    else:
        assert device.type == "cpu" and "CUDA is not available" in warning
        with pytest.raises(RuntimeError, match=r"policy\.device=cuda"):
            resolve_device("cuda", has_gpu=True)


def test_member_on_an_explicit_device_keeps_weights_and_checkpoints_on_cpu():
    cfg = load_config(preset_path("grpo"), ["grpo.steps_per_epoch=2"])
    device = "cuda" if CUDA else "cpu"
    member = Member(0, cfg, LocalArchive(cfg.archive.cells_per_dim, 16, 4), device=device)
    member.train_epochs(1)
    assert next(member.policy.parameters()).device.type == device
    assert all(t.device.type == "cpu" for t in member.get_weights().values())
    state = member.state_dict()
    moments = [t for s in state["optimizer"]["state"].values() for t in s.values() if isinstance(t, torch.Tensor)]
    assert moments and all(t.device.type == "cpu" for t in moments)


def test_local_executor_reports_a_reserved_gpu_it_cannot_use():
    cfg = load_config(preset_path("grpo"), ["population.resources.num_gpus=1"])
    executor = LocalExecutor(cfg)
    fallbacks = [e for e in executor.events if e["event"] == "device_fallback"]
    assert (not CUDA and len(fallbacks) == 1) or (CUDA and not fallbacks)


@pytest.mark.ray
def test_ray_gives_each_actor_its_share_of_the_gpu(ray_local):
    from popgrpo.runtime.ray_executor import RayExecutor  # here: the tests above run without Ray

    cfg = load_config(
        preset_path("pop_grpo"),
        ["population.size=4", "population.members_per_actor=2", "population.resources.num_cpus=0.5",
         "population.resources.num_gpus=0.5", "run.epochs=2", "grpo.steps_per_epoch=2"],
    )  # fmt: skip
    executor = RayExecutor(cfg)
    try:
        places = [p for p in pytest.importorskip("ray").get([a.placement.remote() for a in executor._actors])]
        rows = executor.train(2)
    finally:
        executor.close()
    assert [p["gpu_ids"] for p in places] == [["0"], ["0"]]  # two actors share the one (logical) GPU
    assert [len(r) for r in rows] == [2, 2, 2, 2]
    fallbacks = [e for e in executor.events if e["event"] == "device_fallback"]
    if CUDA:
        assert {p["device"] for p in places} == {"cuda"} and not fallbacks
    else:
        assert {p["device"] for p in places} == {"cpu"}
        assert sorted(m for e in fallbacks for m in e["members"]) == [0, 1, 2, 3]
