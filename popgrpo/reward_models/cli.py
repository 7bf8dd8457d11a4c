"""``popgrpo rm train`` and ``popgrpo rm bon``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from popgrpo.config import ConfigError

if TYPE_CHECKING:
    from popgrpo.config import Config
    from popgrpo.reward_models.config import RMTrainConfig

__all__ = ["add_parsers", "best_of_n_curve", "load_base"]


def load_base(rm_cfg: RMTrainConfig) -> Config:
    """The run config whose environment and initial policy are the reference policy: a Gaussian
    policy in the idea environment, or a causal LM in the text environment."""
    from popgrpo.config import load_config, resolve_config_path

    base = load_config(resolve_config_path(rm_cfg.base), [f"run.seed={rm_cfg.seed}"])
    if (base.env.kind, base.policy.kind) not in (("idea", "gaussian"), ("text", "causal_lm")):
        raise ConfigError(
            f"base: {rm_cfg.base} is a {base.env.kind}/{base.policy.kind} config; `rm train` builds preference "
            "data in the idea environment (env.kind=idea, policy.kind=gaussian) or the text environment "
            "(env.kind=text, policy.kind=causal_lm)"
        )
    return base


def _cmd_train(args: argparse.Namespace) -> int:
    from popgrpo.reward_models.config import load_rm_config, rm_config_markdown

    if args.markdown:
        sys.stdout.write(rm_config_markdown())
        return 0
    if not args.out:
        raise ConfigError("rm train: --out DIR is required (the RM directory to write)")
    rm_cfg = load_rm_config(args.config, args.set or [])
    base = load_base(rm_cfg)
    out = Path(args.out)
    if (out / "rms.json").exists() and not args.force:
        raise ConfigError(f"RM directory {out} already holds RMs (rms.json); --force overwrites it")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"RM directory {out}: cannot create it: {exc.strerror or exc}") from None
    from popgrpo.reward_models.tune import train_rms

    manifest = train_rms(rm_cfg, base, out, address=args.address, num_cpus=args.num_cpus, progress=not args.quiet)
    table = {
        **{f"rm_{e['rm_index']}": e["accuracy"] for e in manifest["models"]},
        "ens": manifest["ens"]["accuracy"],
        "warm": manifest["warm"]["accuracy"],
    }
    print(json.dumps(table, indent=2))
    print(f"RM directory: {out}")
    return 0


def best_of_n_curve(
    rm_dir: str | Path, combine: str, n_models: int | None, ns: list[int], groups: int, seed: int, index: int = 0
) -> list[dict]:
    """Best-of-N by a proxy over the reference policy's ideas: per N, the control reward
    (noise-free expected reward) of the chosen idea, mean over ``groups`` draws, and KL ≈ log N − (N−1)/N."""

    from popgrpo.core.reward_model import best_of_n, best_of_n_kl
    from popgrpo.core.seeding import torch_generator
    from popgrpo.envs.idea import IdeaEnv
    from popgrpo.reward_models.config import RMTrainConfig
    from popgrpo.reward_models.data import STREAM_RM, policy_ideas
    from popgrpo.reward_models.proxy import ProxyReward, load_proxy_models
    from popgrpo.reward_models.store import RMDirError, load_manifest

    manifest = load_manifest(rm_dir)
    if manifest.get("features", "idea") != "idea":
        raise RMDirError(
            f"RM directory {rm_dir}: its RMs score {manifest['features']}; best-of-N reads the idea "
            "environment's noise-free expected reward, so it needs RMs over ideas"
        )
    base = load_base(RMTrainConfig.model_validate(manifest["config"]))
    proxy = ProxyReward(load_proxy_models(rm_dir, combine, n_models, index), execution=None)
    env = IdeaEnv(base.env)
    n_max = max(ns)
    ideas = policy_ideas(base, None, groups * n_max, torch_generator(seed, STREAM_RM, 20))
    scores = proxy.scores(ideas).reshape(groups, n_max)
    expected = env.expected_reward(ideas).reshape(groups, n_max)
    out = []
    for n in ns:
        chosen = best_of_n(scores[:, :n], expected[:, :n])
        out.append(
            {
                "n": n,
                "kl": best_of_n_kl(n),
                "control": float(chosen.mean()),
                "control_se": float(chosen.std() / groups**0.5),
            }
        )
    return out


def _cmd_bon(args: argparse.Namespace) -> int:
    from popgrpo.reward_models.store import RMDirError

    ns = sorted(set(args.n))
    if any(n < 1 for n in ns):
        raise ConfigError("rm bon: every N must be >= 1")
    try:
        curve = best_of_n_curve(args.dir, args.combine, args.n_models, ns, args.groups, args.seed, args.index)
    except RMDirError as exc:
        raise ConfigError(str(exc)) from None
    print(json.dumps(curve, indent=2))
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    rm = sub.add_parser("rm", help="reward models: train M RMs and their WARM on Ray Tune, best-of-N by a proxy")
    rm_sub = rm.add_subparsers(dest="rm_command", required=True)
    train = rm_sub.add_parser(
        "train",
        help="fine-tune M RMs as Ray Tune trials; write every RM, their weight average (WARM), ENS and accuracies",
    )
    train.add_argument("--config", help="YAML of the RM recipe (`popgrpo rm train --markdown` lists its fields)")
    train.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="override a field, e.g. --set finetune.n_models=4"
    )
    train.add_argument("--out", help="the RM directory to write")
    train.add_argument("--force", action="store_true", help="overwrite an RM directory that already holds RMs")
    train.add_argument("--address", help="Ray cluster address (default: embedded loopback-only Ray)")
    train.add_argument("--num-cpus", type=int, help="CPUs of the embedded Ray (default: all)")
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    train.add_argument("--markdown", action="store_true", help="print the RM config reference and exit")
    train.set_defaults(func=_cmd_train)

    bon = rm_sub.add_parser("bon", help="best-of-N re-ranking of the reference policy's ideas by a proxy")
    bon.add_argument("dir", help="RM directory of `popgrpo rm train`")
    bon.add_argument("--combine", choices=("single", "ens", "warm"), default="warm")
    bon.add_argument("--n-models", type=int, help="RMs combined by ens / warm (default: all)")
    bon.add_argument("--index", type=int, default=0, help="the RM of --combine single")
    bon.add_argument("--n", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128], help="values of N")
    bon.add_argument("--groups", type=int, default=2000, help="draws of N ideas averaged per N")
    bon.add_argument("--seed", type=int, default=0, help="seed of the candidate ideas")
    bon.set_defaults(func=_cmd_bon)
