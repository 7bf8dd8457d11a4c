"""benchmarks/shared_base.py: end to end on the tiny model (both sides, fixed-length completions,
the section written between its markers; no timing is asserted), its per-phase rates, the
launch-bound diagnosis and the targets on given numbers, graph decoding's static cache and
compiled step on the CPU, and benchmarks/gpu_check.sh's shared-base part as a CPU dry run."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.shared_base import (
    BEGIN,
    END,
    NEEDS_CUDA,
    NOT_APPLICABLE,
    PHASE_MARK,
    PHASES,
    _decode_with_graphs,
    busy_seconds,
    check_targets,
    diagnosis_of,
    profile_intervals,
    render,
    render_targets,
)
from tests.services import require_module

require_module("peft")
ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.heavy
@pytest.mark.integration
def test_shared_base_benchmark_times_both_sides_and_writes_its_section(tiny_lm, tmp_path):
    page = tmp_path / "BENCHMARKS.md"
    page.write_text(f"# Benchmarks\n\n{BEGIN}\nold\n{END}\n\nafter\n")
    out = tmp_path / "result.json"
    command = [sys.executable, "-m", "benchmarks.shared_base", "--model", str(tiny_lm), "--members", "1,2"]
    command += ["--repeats", "1", "--steps", "1", "--prompts", "1", "--group", "2", "--tokens", "4", "--threads", "1"]
    done = subprocess.run(
        [*command, "--json", str(out), "--write", str(page)], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    runs = {(r["mode"], r["m"]): r for r in result["runs"]}
    assert set(runs) == {(mode, m) for mode in ("separate", "shared") for m in (1, 2)}
    for (_, m), run in runs.items():
        assert run["tokens"] == m * 1 * 2 * 4  # exactly max_new_tokens per completion, one timed step
        assert run["tokens_per_s"] > 0 and set(run["phases_s"]) == {"generation", "reference", "update"}
        for phase, seconds in run["phases_s"].items():  # one timed step: the step's tokens over the phase's time
            assert run["phase_tokens_per_s"][phase] == pytest.approx(run["tokens"] / seconds)
        assert run["peak_rss_bytes"] >= run["rss_after_load_bytes"] > 0
        assert run["decode"] == "plain" and "diagnosis" not in run  # the opt-in parts only where asked
    assert "decode_graphs" not in result["settings"] and "diagnose" not in result["settings"]
    text = page.read_text()
    assert "old" not in text and text.endswith("after\n") and "| M | separate tokens/s |" in text
    assert "| M | side | generation | reference | update | generation tokens/s |" in text
    again = subprocess.run(
        [sys.executable, "-m", "benchmarks.shared_base", "--render", str(out)], cwd=ROOT, capture_output=True, text=True
    )
    assert again.returncode == 0 and again.stdout.strip() in text


def test_gpu_busy_time_is_the_union_of_kernels_inside_each_phase_window():
    windows = [("generation", 0.0, 1.0), ("update", 2.0, 3.0), ("generation", 4.0, 5.0)]
    kernels = [(0.1, 0.3), (0.2, 0.4), (0.9, 1.2), (2.5, 2.6), (4.0, 4.5), (1.5, 1.8)]  # overlaps count once
    busy = busy_seconds(windows, kernels)
    assert busy == pytest.approx({"generation": 0.3 + 0.1 + 0.5, "update": 0.1})
    assert busy_seconds([("reference", 0.0, 1.0)], []) == {"reference": 0.0}


def test_a_phase_busy_under_half_its_wall_time_is_flagged_launch_bound():
    diagnosis = diagnosis_of(
        {"generation": 0.6, "reference": 0.09, "update": 0.3}, {"generation": 2.0, "reference": 0.1, "update": 0.5}
    )
    phases = diagnosis["phases"]
    assert diagnosis["applicable"] and diagnosis["below"] == 0.5
    assert phases["generation"]["busy_share"] == pytest.approx(0.3) and phases["generation"]["launch_bound"]
    assert not phases["reference"]["launch_bound"] and not phases["update"]["launch_bound"]


def test_the_profilers_phase_windows_are_read_and_a_cpu_has_no_gpu_intervals():
    from torch.profiler import ProfilerActivity, profile, record_function

    x = torch.randn(64, 64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for phase in ("generation", "update"):
            with record_function(PHASE_MARK + phase):
                x = x @ x
    windows, intervals = profile_intervals(prof)
    assert [name for name, _, _ in windows] == ["generation", "update"] and intervals == []
    assert all(end >= start for _, start, end in windows) and windows[0][2] <= windows[1][1]


def _run(mode, m, tokens_per_s, memory, decode="plain", repeat=0, **extra):
    phases = {"generation": 0.5, "reference": 0.1, "update": 0.4}
    return {
        "mode": mode,
        "decode": decode,
        "m": m,
        "repeat": repeat,
        "tokens": int(tokens_per_s),
        "seconds": 1.0,
        "tokens_per_s": tokens_per_s,
        "phases_s": phases,
        "peak_rss_bytes": memory,
        "peak_gpu_bytes": memory,
        **extra,
    }


def _result(runs, device="cuda", members=(1, 8, 16)):
    settings = {"device": device, "members": list(members), "steps": 1, "repeats": 1, "prompts": 4, "group": 8}
    settings |= {"tokens": 32, "rank": 8, "threads": 4, "dtype": "bfloat16", "label": "q", "device_name": "GPU"}
    settings |= {"command": "python -m benchmarks.shared_base", "when": "now"}
    return {"settings": settings, "runs": runs}


def test_the_targets_are_met_or_not_on_given_numbers():
    gib = 2**30
    result = _result(
        [
            _run("separate", 1, 600.0, 10 * gib),
            _run("separate", 8, 500.0, 80 * gib),
            _run("shared", 8, 1600.0, 14 * gib),  # 3.2×, 1.4× one member's
            _run("shared", 16, 2100.0, 18 * gib),  # the best end to end
            _run("shared", 8, 1400.0, 16 * gib, decode="graphs"),  # 2.8×, 1.6×
        ]
    )
    checks = {c["target"]: c for c in check_targets(result)}
    speed, memory = (
        checks["tokens/s at M = 8, shared / separate"],
        checks["peak memory at M = 8, shared / one separate member"],
    )
    assert speed["value"] == pytest.approx(3.2) and speed["met"]
    assert memory["value"] == pytest.approx(1.4) and memory["met"]
    assert checks["end-to-end tokens/s, shared (best: M = 16)"]["met"]
    graphs = {k: c for k, c in checks.items() if "graph decoding" in k}
    assert [c["met"] for c in graphs.values()] == [False, False, False]
    assert graphs["tokens/s at M = 8, shared, graph decoding / separate"]["value"] == pytest.approx(2.8)
    lines = render_targets(check_targets(result)).splitlines()
    assert lines[0] == "- tokens/s at M = 8, shared / separate: 3.20× (target ≥ 3×): met"
    assert lines[2] == "- end-to-end tokens/s, shared (best: M = 16): 2,100.0 (target ≥ 2,000): met"
    assert lines[3] == "- tokens/s at M = 8, shared, graph decoding / separate: 2.80× (target ≥ 3×): not met"
    # Without the runs a target needs, it is not measured; a variant that was skipped is listed so.
    missing = _result(
        [_run("shared", 1, 300.0, gib), {"mode": "shared", "decode": "graphs", "m": 8, "skipped": NEEDS_CUDA}]
    )
    text = render_targets(check_targets(missing))
    assert "tokens/s at M = 8, shared / separate: not measured (target ≥ 3×)" in text
    assert "peak memory at M = 8, shared, graph decoding / one separate member: not measured" in text
    assert "end-to-end tokens/s, shared (best: M = 1): 300.0 (target ≥ 2,000): not met" in text


def test_the_section_shows_tokens_s_by_phase_the_diagnosis_and_the_runs_not_made():
    gib = 2**30
    cpu = _result(
        [
            _run("separate", 1, 100.0, gib, diagnosis={"applicable": False, "reason": NOT_APPLICABLE}),
            _run("shared", 1, 100.0, gib, diagnosis={"applicable": False, "reason": NOT_APPLICABLE}),
            {"mode": "shared", "decode": "graphs", "m": 1, "skipped": NEEDS_CUDA},
        ],
        device="cpu",
        members=(1,),
    )
    text = render(cpu)
    assert "| 1 | separate | 0.500 | 0.100 | 0.400 | 200.0 | 1000.0 | 250.0 |" in text  # 100 tokens a step
    assert f"Launch-bound diagnosis: {NOT_APPLICABLE}." in text
    assert f"- M = 1, shared, graph decoding: {NEEDS_CUDA}" in text

    def busy(share):  # every phase busy that share of its wall time
        return diagnosis_of(dict.fromkeys(PHASES, share), dict.fromkeys(PHASES, 1.0))

    gpu = _result(
        [
            _run("separate", 8, 500.0, 8 * gib, diagnosis=busy(0.1)),
            _run("shared", 8, 900.0, gib, "graphs", diagnosis=busy(0.9)),
        ],
        members=(8,),
    )
    text = render(gpu)
    assert "| 8 | separate | 10% launch-bound | 10% launch-bound | 10% launch-bound |" in text
    assert "| 8 | shared, graph decoding | 90% | 90% | 90% |" in text
    assert "shared, graph decoding tokens/s" in text and "peak GPU memory allocated (GiB)" in text


def test_graph_decoding_on_the_cpu_samples_what_plain_decoding_does(tmp_path):
    """The variant's static cache and compiled decoding step (torch.compile's eager backend here: no
    CUDA graphs on a CPU) through the shared base's segmented LoRA layers, on the qwen2 architecture:
    the same tokens as the plain ``generate``, the step compiled once."""
    from torch._dynamo.utils import counters

    from popgrpo.config import CausalLMConfig
    from popgrpo.policies.causal_lm import build_shaped_causal_lm
    from popgrpo.policies.shared_base import SharedBase

    sizes = {"num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2}
    model = build_shaped_causal_lm("qwen2.5-0.5b", tmp_path / "q", num_key_value_heads=1, vocab_size=256, **sizes)
    cfg = CausalLMConfig.model_validate(
        {"model": str(model), "max_new_tokens": 5, "min_new_tokens": 5, "lora": {"r": 4}}
    )
    base = SharedBase(cfg, range(2), "cpu")
    policies = [base.member_policy(k, torch.Generator().manual_seed(k)) for k in range(2)]
    g = torch.Generator().manual_seed(0)
    for policy in policies:  # adapters that move every row's logits
        policy.load_state_dict({k: torch.randn(v.shape, generator=g) * 0.3 for k, v in policy.state_dict().items()})
    prompts = [["say a", "go on"], ["write", "x = 1"]]
    plain = base.mixed_rollouts(policies, prompts, 3, [1, 2])
    _decode_with_graphs(policies, "eager")
    counters.clear()
    for _ in range(2):  # the second call reuses the compiled step and the cache
        graphs = base.mixed_rollouts(policies, prompts, 3, [1, 2])
        assert [torch.equal(a.sequences, b.sequences) for a, b in zip(plain, graphs, strict=True)] == [True, True]
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.heavy
@pytest.mark.integration
def test_gpu_check_shared_base_dry_runs_on_the_cpu(tmp_path):
    """``DEVICE=cpu CHECKS=shared_base bash benchmarks/gpu_check.sh``: the equivalence tests, the
    shrunk shape, the benchmark with its CUDA-only parts recorded as such, and the targets (~40 s)."""
    env = {**os.environ, "OUT": str(tmp_path), "DEVICE": "cpu", "CHECKS": "shared_base", "PY": sys.executable}
    done = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:]
    result = json.loads((tmp_path / "shared_base_cpu.json").read_text())
    made = {(r["mode"], r["decode"], r["m"]): r for r in result["runs"]}
    plain = {(mode, "plain", m) for mode in ("separate", "shared") for m in (1, 8)}
    assert set(made) == {*plain, ("shared", "graphs", 8)}
    assert made["shared", "graphs", 8]["skipped"] == NEEDS_CUDA
    assert made["shared", "plain", 8]["diagnosis"] == {"applicable": False, "reason": NOT_APPLICABLE}
    assert len(re.findall(r"\b\d+ passed", done.stdout)) == 2 and " failed" not in done.stdout  # both dtypes
    targets = (tmp_path / "shared_base_targets.txt").read_text()
    assert "tokens/s at M = 8, shared / separate: " in targets and "graph decoding" in targets
    data = sorted(p.name for p in (tmp_path / "data").iterdir())  # the copies, not in benchmarks/data/gpu
    assert [Path(n).suffix for n in data] == [".json", ".log", ".txt"]
    assert "done (status 0)" in (tmp_path / "data" / data[1]).read_text()


def test_a_spent_budget_starts_no_run_and_says_so(tmp_path):
    """``--budget-s``: no side is started with less than 20 s left; the JSON and the section list
    each run not made, and the targets are not measured."""
    from benchmarks.shared_base import main

    out = tmp_path / "r.json"
    args = ["--model", "unused", "--members", "1,8", "--repeats", "1", "--budget-s", "5", "--decode-graphs", "8"]
    assert main([*args, "--separate-last", "--json", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    sides = [(r["m"], r["mode"], r["decode"]) for r in runs]
    shared_first = [(1, "shared", "plain"), (1, "separate", "plain"), (8, "shared", "plain")]
    assert sides == [*shared_first, (8, "shared", "graphs"), (8, "separate", "plain")]
    assert all(r["skipped"] == "not run: the 5 s budget was spent" for r in runs)
    result = json.loads(out.read_text())
    assert "- M = 8, separate: not run: the 5 s budget was spent" in render(result)
    assert all(c["met"] is None for c in check_targets(result))
