"""popgrpo against a peer: RLlib PPO on the same environment, budget and cores.

    python -m benchmarks.peer_rllib [--quick] [--budget IDEAS]

The question: how many ideas per second does popgrpo's GRPO evaluate and learn
from, compared with a general RL library training on the same environment, and is it at
least 20× faster? Both sides get:

* **the same environment**: RLlib trains on :class:`popgrpo.envs.gym.IdeaGymEnv`, one idea
  per episode, the reward from the same :class:`~popgrpo.envs.idea.IdeaEnv`;
* **the same sample budget**: by default a whole GRPO preset run's ideas
  (P prompts × G ideas × steps per epoch × epochs = 8 × 16 × 8 × 120 = 122,880 for ``grpo``);
* **the same learning schedule**: PPO's train batch is one GRPO epoch of ideas (P·G·S = 1024)
  cut into minibatches of one GRPO step (P·G = 128), one pass each, so both take one gradient
  step per 128 ideas; the same lr, clip, seed, and a [hidden, hidden] ReLU MLP like the
  policy's trunk. PPO also trains its value head (GRPO has none): that is the algorithm;
* **the same machine, at the same time**: an embedded loopback Ray with 2 CPUs. RLlib runs in
  the layout that was fastest here: its env runner in the driver with 128 vectorised env
  copies (3,000 steps/s alone, against 1,750 with one remote env runner and 2,400-2,500 with
  two; see ``--num-env-runners``), torch on one thread like popgrpo (two were no faster when
  the machine was idle, 3,109 against 3,022 steps/s, and two OpenMP threads stall on two
  shared cores when other processes compete). popgrpo's in-process executor uses one core
  (``run.torch_threads`` = 1). The two train in alternation, one batch each (an RLlib
  iteration, a GRPO epoch: 1024 ideas), so load from other processes on a shared machine
  falls on both alike; run back to back, RLlib's longer run caught more of it and the ratio
  went from 22× to 58× in four runs.

Throughput is env steps (ideas) sampled / the sum of that side's batch times: Ray start-up,
RLlib's ``build_algo`` and the executors' construction are excluded and reported apart.
Neither side gets a warm-up. Beside it, the median over batches of each batch's steps/s.
popgrpo's Ray executor is run after, alone, in one call (as a round runs on Ray). The max
reward is the best single idea's reward seen in training (RLlib: a callback over every
sampled reward; popgrpo: the archive, which is offered every idea); the best batch mean is
the best mean reward of one 1024-idea batch. The 20× target is reported as measured.
"""

from __future__ import annotations

import argparse
import functools
import logging
import math
import shutil
import tempfile
import time

import numpy as np
import torch

from popgrpo.config import Config, load_config, preset_path
from popgrpo.markdown import md_table
from popgrpo.runtime.executor import LocalExecutor

__all__ = ["TARGET_RATIO", "GRPORunner", "PPORunner", "markdown", "run"]

TARGET_RATIO = 20.0  # the target: popgrpo's ideas/s at least 20× RLlib's env steps/s
CORES = 2
QUICK_EPOCHS = 4  # quick mode's default budget, in GRPO epochs (4 × 1024 ideas)


def grpo_config(preset: str, seed: int, epochs: int | None = None) -> Config:
    """The preset's run config, with ``epochs`` training epochs when given."""
    overrides = [f"run.seed={seed}"] + ([f"run.epochs={epochs}"] if epochs is not None else [])
    return load_config(preset_path(preset), overrides)


def ideas_per_epoch(config: Config) -> int:
    """P · G · S: the ideas one GRPO epoch samples (and one PPO train batch here)."""
    return config.policy.n_prompts * config.grpo.group_size * config.grpo.steps_per_epoch


class PPORunner:
    """RLlib PPO (new API stack) on the idea environment, one training iteration at a time.

    Ray must be running. ``start_s`` is what ``build_algo`` cost.
    """

    def __init__(
        self,
        config: Config,
        num_env_runners: int = 0,
        num_envs_per_env_runner: int = 128,
        torch_threads: int = 1,
    ) -> None:
        from ray.rllib.algorithms.ppo import PPOConfig
        from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

        from popgrpo.envs.gym import IdeaGymEnv

        self.torch_threads = torch_threads
        self.cores = CORES
        self.layout = {
            "num_env_runners": num_env_runners,
            "num_envs_per_env_runner": num_envs_per_env_runner,
            "torch_threads": torch_threads,
            "train_batch": ideas_per_epoch(config),
        }
        ppo = (
            PPOConfig()
            # The adapter's box is in idea units (±32): RLlib's default normalize_actions would
            # read the policy's N(0, 1) output as a fraction of the box and propose ideas of
            # norm ≈ 128, where the reward is 0. Off, the policy proposes ideas in the units
            # popgrpo's policy starts from (σ = 1); the adapter clips to the box itself.
            .environment(
                IdeaGymEnv,
                env_config={"n_prompts": config.policy.n_prompts, **config.env.model_dump()},
                normalize_actions=False,
                clip_actions=False,
            )
            .env_runners(num_env_runners=num_env_runners, num_envs_per_env_runner=num_envs_per_env_runner)
            .learners(num_learners=0)  # the learner in the driver: no GPU here
            .training(
                train_batch_size_per_learner=ideas_per_epoch(config),
                minibatch_size=config.policy.n_prompts * config.grpo.group_size,
                num_epochs=config.grpo.updates_per_batch,
                lr=config.grpo.lr,
                clip_param=config.grpo.clip,
            )
            .rl_module(
                model_config=DefaultModelConfig(fcnet_hiddens=[config.policy.hidden] * 2, fcnet_activation="relu")
            )
            .callbacks(_reward_stats_callback())
            .debugging(seed=config.run.seed)  # env copy i of runner w resets with its own seed
        )
        torch.set_num_threads(torch_threads)
        start = time.perf_counter()
        self.algo = ppo.build_algo()
        self.start_s = time.perf_counter() - start
        self.sampled = 0
        self.best_reward = -math.inf

    def train_batch(self) -> dict:
        """One ``algo.train()``: ``{"steps", "seconds", "reward_mean"}``."""
        torch.set_num_threads(self.torch_threads)
        start = time.perf_counter()
        stats = self.algo.train()["env_runners"]
        seconds = time.perf_counter() - start
        sampled = int(stats["num_env_steps_sampled_lifetime"])
        steps, self.sampled = sampled - self.sampled, sampled
        # The callback's max, sum and count are reduced (reset) every iteration.
        self.best_reward = max(self.best_reward, float(stats["idea_reward_max"]))
        return {
            "steps": steps,
            "seconds": seconds,
            "reward_mean": stats["idea_reward_sum"] / stats["idea_reward_count"],
        }

    def max_reward(self) -> float:
        return self.best_reward

    def close(self) -> None:
        self.algo.stop()


class GRPORunner:
    """One popgrpo GRPO member on the ``local`` or ``ray`` executor, an epoch at a time.

    ``start_s`` is what building the executor cost (on Ray: its actors' start-up).
    """

    def __init__(self, config: Config, executor: str = "local") -> None:
        start = time.perf_counter()
        if executor == "local":
            self.executor = LocalExecutor(config)
            self.cores = config.run.torch_threads
        else:
            from popgrpo.runtime.ray_executor import RayExecutor

            self.executor = RayExecutor(config)
            self.cores = CORES
        self.start_s = time.perf_counter() - start
        self.torch_threads = config.run.torch_threads

    def train_batch(self, epochs: int = 1) -> list[dict]:
        """``epochs`` epochs in one call, one ``{"steps", "seconds", "reward_mean"}`` per epoch
        (``seconds``: the call's time, shared out evenly)."""
        torch.set_num_threads(self.torch_threads)
        start = time.perf_counter()
        (rows,) = self.executor.train(epochs)
        seconds = (time.perf_counter() - start) / epochs
        return [{"steps": row["ideas"], "seconds": seconds, "reward_mean": row["reward_mean"]} for row in rows]

    def max_reward(self) -> float:
        return float(self.executor.archives()[0].stats()["best_reward"])

    def close(self) -> None:
        self.executor.close()


@functools.cache
def _reward_stats_callback() -> type:
    """The callback class; built on first use so importing this module does not import RLlib."""
    from ray.rllib.callbacks.callbacks import RLlibCallback

    class IdeaRewardStats(RLlibCallback):
        """Every sampled idea's reward, reduced per iteration: max, sum and count.

        RLlib's own ``episode_return_max`` covers only a smoothing window of the latest
        episodes (100 by default), fewer than an iteration's 1024 one-idea episodes, so it
        can miss the best idea. One call per ``sample()``, not per episode: cheap.
        """

        def on_sample_end(self, *, metrics_logger=None, samples=None, **kwargs) -> None:
            rewards = np.array([r for episode in samples for r in episode.get_rewards()], dtype=np.float64)
            if rewards.size:
                metrics_logger.log_value("idea_reward_max", float(rewards.max()), reduce="max")
                metrics_logger.log_value("idea_reward_sum", float(rewards.sum()), reduce="sum")
                metrics_logger.log_value("idea_reward_count", float(rewards.size), reduce="sum")

    return IdeaRewardStats


def summarise(runner: PPORunner | GRPORunner, batches: list[dict]) -> dict:
    """One side's numbers from its batches (see the module docstring for the definitions)."""
    steps = sum(b["steps"] for b in batches)
    seconds = sum(b["seconds"] for b in batches)
    return {
        "env_steps": steps,
        "batches": len(batches),
        "wall_s": seconds,
        "steps_per_s": steps / seconds,
        "median_batch_steps_per_s": float(np.median([b["steps"] / b["seconds"] for b in batches])),
        "max_reward": runner.max_reward(),
        "best_batch_mean": float(max(b["reward_mean"] for b in batches)),
        "batch_s": [b["seconds"] for b in batches],
        "start_s": runner.start_s,
        "cores": runner.cores,
    }


def run(
    budget: int | None = None,
    quick: bool = False,
    *,
    preset: str = "grpo",
    seed: int = 42,
    ray_executor: bool | None = None,
    num_env_runners: int = 0,
    num_envs_per_env_runner: int = 128,
) -> dict:
    """Both sides on ``budget`` ideas, in alternation; the numbers behind :func:`markdown`.

    ``budget`` (ideas) is rounded up to whole GRPO epochs; ``None`` is the preset's whole run
    (``quick``: 4 epochs). ``ray_executor`` adds popgrpo's Ray executor (default: unless
    ``quick``, as its actors' start-up would be most of a quick run). Starts an embedded
    loopback Ray with 2 CPUs unless one is already connected, and shuts down only what it
    started.
    """
    import ray

    from popgrpo.runtime.cluster import force_loopback

    config = grpo_config(preset, seed)
    per_epoch = ideas_per_epoch(config)
    if budget is None:
        budget = QUICK_EPOCHS * per_epoch if quick else config.run.epochs * per_epoch
    if budget < 1:
        raise ValueError(f"budget must be >= 1 idea, got {budget}")
    epochs = math.ceil(budget / per_epoch)
    config = grpo_config(preset, seed, epochs)
    budget = epochs * per_epoch
    if ray_executor is None:
        ray_executor = not quick
    result = {"preset": preset, "seed": seed, "budget": budget, "quick": quick, "cores": CORES}

    temp_dir = None
    started = not ray.is_initialized()
    if started:
        force_loopback()
        temp_dir = tempfile.mkdtemp(prefix="pgpeer-", dir="/tmp")  # short: Ray's socket paths are length-limited
        start = time.perf_counter()
        ray.init(
            num_cpus=CORES,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            _temp_dir=temp_dir,
            configure_logging=False,
            log_to_driver=False,
        )
        result["ray_start_s"] = time.perf_counter() - start
    rllib_logger = logging.getLogger("ray.rllib")
    level = rllib_logger.level
    rllib_logger.setLevel(logging.ERROR)  # new-API-stack notices and deprecations, per build
    threads = torch.get_num_threads()
    try:
        # popgrpo first: building its policy draws from torch's global RNG (nn.Linear's default
        # init), which RLlib seeds at build and samples actions from; in this order RLlib's
        # numbers are the same as when it runs alone.
        grpo = GRPORunner(config)
        ppo = PPORunner(config, num_env_runners, num_envs_per_env_runner)
        try:
            ppo_batches, grpo_batches = [], []
            while ppo.sampled < budget or len(grpo_batches) < epochs:
                if len(grpo_batches) < epochs:
                    grpo_batches += grpo.train_batch()
                if ppo.sampled < budget:
                    ppo_batches.append(ppo.train_batch())
            result["rllib"] = {**summarise(ppo, ppo_batches), "layout": ppo.layout}
            result["popgrpo"] = summarise(grpo, grpo_batches)
        finally:
            ppo.close()
            grpo.close()
        if ray_executor:
            on_ray = GRPORunner(config, "ray")
            try:
                result["popgrpo_ray"] = summarise(on_ray, on_ray.train_batch(epochs))
                result["popgrpo_ray"]["median_batch_steps_per_s"] = None  # one call: no per-epoch times
            finally:
                on_ray.close()
    finally:
        torch.set_num_threads(threads)
        rllib_logger.setLevel(level)
        if started:
            ray.shutdown()
            shutil.rmtree(temp_dir, ignore_errors=True)

    result["ratio"] = result["popgrpo"]["steps_per_s"] / result["rllib"]["steps_per_s"]
    result["median_ratio"] = result["popgrpo"]["median_batch_steps_per_s"] / result["rllib"]["median_batch_steps_per_s"]
    result["target_ratio"] = TARGET_RATIO
    result["target_met"] = result["ratio"] >= TARGET_RATIO
    return result


def markdown(result: dict) -> str:
    """The comparison table, then one line saying whether the 20× target is met (on wall time)."""
    rllib = result["rllib"]
    rows = [("RLlib PPO", rllib), ("popgrpo GRPO", result["popgrpo"])]
    if "popgrpo_ray" in result:
        rows.append(("popgrpo GRPO (Ray executor, run alone)", result["popgrpo_ray"]))
    table = []
    for name, r in rows:
        is_peer = r is rllib
        ratio = "—" if is_peer else f"{r['steps_per_s'] / rllib['steps_per_s']:.1f}×"
        median = r["median_batch_steps_per_s"]
        if median is None:
            median_cell = "—"
        else:
            median_ratio = "" if is_peer else f" ({median / rllib['median_batch_steps_per_s']:.1f}×)"
            median_cell = f"{median:,.0f}{median_ratio}"
        rates = [f"{r['steps_per_s']:,.0f}", ratio, median_cell]
        table.append(
            [name, *rates, f"{r['max_reward']:.3f}", f"{r['best_batch_mean']:.3f}", f"{r['wall_s']:.2f}", r["cores"]]
        )
    header = ["run", "env steps/s", "ratio popgrpo/RLlib", "median batch steps/s (ratio)", "max reward"]
    lines = [md_table([*header, "best batch mean", "wall s", "cores"], table)]
    verdict = "met" if result["target_met"] else "not met"
    lines.append("")
    lines.append(
        f"Budget {result['budget']:,} ideas per run ({result['preset']} preset, seed {result['seed']}). "
        f"Target popgrpo ≥ {result['target_ratio']:.0f}× RLlib: {verdict} ({result['ratio']:.1f}× on wall time; "
        f"{result['median_ratio']:.1f}× on median per-batch rates)."
    )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 GRPO epochs of ideas, no Ray executor run")
    parser.add_argument("--budget", type=int, default=None, help="ideas per run (default: the preset's whole run)")
    parser.add_argument("--preset", default="grpo")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--num-env-runners", type=int, default=0, help="RLlib remote env runners (0: in the driver)")
    parser.add_argument("--num-envs-per-env-runner", type=int, default=128)
    args = parser.parse_args()
    result = run(
        args.budget,
        args.quick,
        preset=args.preset,
        seed=args.seed,
        num_env_runners=args.num_env_runners,
        num_envs_per_env_runner=args.num_envs_per_env_runner,
    )
    print(markdown(result), end="")
    start_up = {"Ray start": result.get("ray_start_s"), "RLlib build_algo": result["rllib"]["start_s"]}
    start_up["popgrpo LocalExecutor"] = result["popgrpo"]["start_s"]
    if "popgrpo_ray" in result:
        start_up["popgrpo RayExecutor"] = result["popgrpo_ray"]["start_s"]
    print("Start-up, excluded above: " + ", ".join(f"{k} {v:.1f} s" for k, v in start_up.items() if v is not None))
    for side in ("rllib", "popgrpo"):
        head, tail = result[side]["batch_s"][:10], result[side]["batch_s"][-10:]
        print(f"{side} s/batch: first {len(head)} {np.mean(head):.3f}, last {len(tail)} {np.mean(tail):.3f}")


if __name__ == "__main__":
    main()
