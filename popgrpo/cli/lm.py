"""``popgrpo lm tiny|init|pretrain|programs``: thin argument handling over
:mod:`popgrpo.policies.causal_lm`, :mod:`popgrpo.policies.pretrain` and :mod:`popgrpo.envs.programs`.

Bad input (an unusable ``--out``, a model directory that is not one, out-of-range numbers)
raises :class:`~popgrpo.config.ConfigError`, which ``popgrpo``'s ``main`` turns into one line on
stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from popgrpo.config import ConfigError
from popgrpo.markdown import md_table

__all__ = ["add_parsers"]


def _writable_dir(path: Path, force: bool) -> Path:
    if (path / "config.json").exists() and not force:
        raise ConfigError(f"{path} already holds a model (--force overwrites it)")
    from popgrpo.telemetry.run_dir import writable_directory

    return writable_directory(path, "--out")


# The CPU kernels (torch.backends.cpu.get_cpu_capability()) that made the committed program model.
REFERENCE_CPU_CAPABILITY = "AVX2"


def _cmd_pretrain(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from popgrpo.policies.pretrain import QUICK, PretrainConfig, pretrain

    base = QUICK if args.quick else PretrainConfig()
    overrides = {
        k: v
        for k, v in {
            "steps": args.steps,
            "corpus_size": args.corpus_size,
            "hidden_size": args.hidden,
            "layers": args.layers,
            "eval_every": args.eval_every,
            "checkpoint_every": args.checkpoint_every,
            "exec_samples": args.exec_samples,
            "seed": args.seed,
        }.items()
        if v is not None
    }
    try:
        cfg = replace(base, **overrides)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if args.threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {args.threads}")
    out = _writable_dir(Path(args.out), args.force)
    import torch

    torch.set_num_threads(args.threads)
    capability = torch.backends.cpu.get_cpu_capability()
    if capability != REFERENCE_CPU_CAPABILITY:
        sys.stderr.write(
            f"popgrpo: torch runs {capability} kernels on this CPU; the model docs/RESULTS_LM.md reports was made "
            f"with {REFERENCE_CPU_CAPABILITY} kernels, and the same seed makes a different model with others. To make "
            "that one, run again with ATEN_CPU_CAPABILITY=avx2 DNNL_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2\n"
        )
    summary = pretrain(cfg, out, progress=not args.quiet)
    last = summary["last"]
    print(json.dumps({k: summary[k] for k in ("out", "parameters", "vocab_size", "seconds", "checkpoints")}))
    print(
        f"popgrpo: val loss {summary['first']['val_loss']:.3f} -> {last['val_loss']:.3f}, "
        f"samples that execute: {last.get('exec_success', float('nan')):.2f} "
        f"(use --set policy.causal_lm.model={out})"
    )
    hint = _few_execute_hint(last.get("exec_success", float("nan")), args.quick)
    if hint:
        print(f"popgrpo: {hint}")
    return 0


# Below this share of executing samples, an execution reward is 0 for nearly every completion.
FEW_EXECUTE = 0.1


def _few_execute_hint(exec_success: float, quick: bool) -> str | None:
    """Why a model's execution rewards will be (nearly) all zero, when they will: a model whose
    samples rarely run gives GRPO groups of equal rewards, so nothing to learn from."""
    known = exec_success == exec_success  # not NaN: --exec-samples 0 measures nothing
    if known and exec_success >= FEW_EXECUTE:
        return None
    share = (
        f"only {exec_success:.2f} of its samples execute" if known else "its samples were not run (--exec-samples 0)"
    )
    if quick:
        return (
            f"{share}; a --quick model is for smoke tests and its execution rewards (lm_programs, execution_score) "
            "are 0 for nearly every completion, which leaves GRPO nothing to learn from: drop --quick for a model "
            "worth training (a few minutes on 2 cores)"
        )
    if not known:
        return None
    return (
        f"{share}, so its execution rewards (lm_programs, execution_score) are 0 for nearly every completion, "
        "which leaves GRPO nothing to learn from: train it longer (--steps)"
    )


def _cmd_programs(args: argparse.Namespace) -> int:
    from popgrpo.envs.programs import STYLES, header, length_table, program_reward

    model_dir = Path(args.model)
    if not (model_dir / "config.json").is_file():
        raise ConfigError(f"--model {model_dir}: not a save_pretrained model directory (no config.json)")
    if args.samples < 1:
        raise ConfigError(f"--samples must be >= 1, got {args.samples}")
    if args.threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {args.threads}")
    try:
        edges = [int(e) for e in args.edges.split(",")]
    except ValueError:
        raise ConfigError(f"--edges must be comma-separated integers, got {args.edges!r}") from None
    if edges != sorted(edges) or edges[0] < 1:
        raise ConfigError(f"--edges must be increasing positive integers, got {args.edges!r}")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from popgrpo.policies.pretrain import sample_completions

    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32)
    prompts = [header(STYLES[i % len(STYLES)]) for i in range(args.samples)]
    texts, lengths = [], []
    for start in range(0, len(prompts), args.batch):
        t, n = sample_completions(
            model, tokenizer, prompts[start : start + args.batch], args.max_new_tokens, seed=args.seed + start
        )
        texts += t
        lengths += n
    rewards, reasons = program_reward(prompts, texts)
    rows = length_table(lengths, rewards, reasons, edges)
    overall = length_table(lengths, rewards, reasons, [10**9])[0]
    overall["tokens"] = "all"
    distinct = len(set(texts)) / len(texts)
    result = {"model": str(model_dir), "samples": len(texts), "distinct": distinct, "rows": [*rows, overall]}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    keys = ["tokens", "n", "success", "reward", "reward_if_ok"]
    fails = sorted({k for r in result["rows"] for k in r if k.startswith("fail_")})
    table = [
        [c if isinstance(c, str) else f"{c:.3g}" for c in (row.get(k, 0.0) for k in keys + fails)]
        for row in result["rows"]
    ]
    sys.stdout.write(md_table(keys + fails, table) + "\n")
    sys.stdout.write(f"\n{len(texts)} samples, {distinct:.2f} of them distinct\n")
    return 0


def _cmd_tiny(args: argparse.Namespace) -> int:
    from popgrpo.policies.causal_lm import build_tiny_causal_lm

    out = Path(args.out)
    if (out / "config.json").exists() and not args.force:
        print(f"popgrpo: {out} already holds a model (--force overwrites it)", file=sys.stderr)
        return 2
    build_tiny_causal_lm(out, hidden_size=args.hidden, layers=args.layers, seed=args.seed)
    print(f"popgrpo: toy causal LM written to {out} (use --set policy.causal_lm.model={out})")
    return 0


def _cmd_init(args: argparse.Namespace) -> int:
    from popgrpo.policies.causal_lm import SHAPES, build_shaped_causal_lm

    if args.shape not in SHAPES:
        sys.stderr.write(f"popgrpo: unknown model shape {args.shape!r}; shapes: {', '.join(SHAPES)}\n")
        return 2
    out = Path(args.out)
    if out.exists() and any(out.iterdir()) and not args.force:
        sys.stderr.write(f"popgrpo: {out} is not empty (--force to write into it)\n")
        return 2
    build_shaped_causal_lm(args.shape, out, seed=args.seed, dtype=args.dtype)
    sys.stdout.write(f"wrote a randomly initialised {args.shape} model to {out}\n")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add ``lm`` and its sub-commands ``tiny``, ``init``, ``pretrain`` and ``programs`` to the ``popgrpo`` sub-commands."""
    lm = sub.add_parser("lm", help="language-model helpers").add_subparsers(dest="lm_command", required=True)
    tiny = lm.add_parser(
        "tiny", help="write a randomly initialised toy causal LM + character tokenizer (offline tests, examples)"
    )
    tiny.add_argument("--out", required=True, help="directory to write (save_pretrained layout)")
    tiny.add_argument("--hidden", type=int, default=32, help="hidden size (default 32)")
    tiny.add_argument("--layers", type=int, default=2, help="transformer layers (default 2)")
    tiny.add_argument("--seed", type=int, default=0, help="weight-initialisation seed")
    tiny.add_argument("--force", action="store_true", help="overwrite a model already in --out")
    tiny.set_defaults(func=_cmd_tiny)
    # The shapes' names without importing torch (popgrpo.policies.causal_lm.SHAPES lists the same files).
    shapes = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "policies" / "shapes").glob("*.json"))
    init = lm.add_parser(
        "init",
        help="write a randomly initialised model of a real architecture (sizes kept in the repo; nothing downloaded)",
    )
    init.add_argument("--shape", required=True, help=f"the architecture: {', '.join(shapes)}")
    init.add_argument("--out", required=True, help="directory to write (save_pretrained model + tokenizer)")
    init.add_argument("--seed", type=int, default=0, help="initialisation seed (default 0)")
    init.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="weights' dtype")
    init.add_argument("--force", action="store_true", help="write into a directory that is not empty")
    init.set_defaults(func=_cmd_init)
    pre = lm.add_parser(
        "pretrain",
        help="train a small causal LM from scratch on generated Python programs (5 min measured on 2 busy cores)",
    )
    pre.add_argument(
        "--out", required=True, help="directory to write (save_pretrained model + tokenizer, checkpoints/)"
    )
    pre.add_argument("--quick", action="store_true", help="a seconds-long run (tests, smoke runs; not a useful model)")
    pre.add_argument("--steps", type=int, help="optimiser steps (default 600; --quick 30)")
    pre.add_argument("--corpus-size", type=int, help="generated training programs (default 12000)")
    pre.add_argument("--hidden", type=int, help="hidden size (default 160)")
    pre.add_argument("--layers", type=int, help="transformer layers (default 4)")
    pre.add_argument("--eval-every", type=int, help="steps between validation loss + execution checks (default 200)")
    pre.add_argument("--checkpoint-every", type=int, help="steps between checkpoints (default 200)")
    pre.add_argument("--exec-samples", type=int, help="samples executed per check, 0 for none (default 24)")
    pre.add_argument("--seed", type=int, help="corpus, initialisation, batches and samples (default 0)")
    pre.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: on cores shared with other work, two threads measured 10x slower per step "
        "than one, as OpenMP's threads wait on each other)",
    )
    pre.add_argument("--force", action="store_true", help="overwrite a model already in --out")
    pre.add_argument("--quiet", action="store_true", help="no progress bar")
    pre.set_defaults(func=_cmd_pretrain)

    prog = lm.add_parser(
        "programs", help="sample programs from a model, run them, tabulate success and reward by length"
    )
    prog.add_argument("--model", required=True, help="a save_pretrained model directory (popgrpo lm pretrain --out)")
    prog.add_argument(
        "--samples", type=int, default=600, help="programs to sample, prompt styles in turn (default 600)"
    )
    prog.add_argument("--max-new-tokens", type=int, default=128, help="completion length limit (default 128)")
    prog.add_argument("--edges", default="20,30,40,50,60,80,128", help="length bins' upper bounds in tokens")
    prog.add_argument("--batch", type=int, default=60, help="completions sampled at once")
    prog.add_argument("--seed", type=int, default=0)
    prog.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as for pretrain)")
    prog.add_argument("--json", help="also write the table as JSON here")
    prog.set_defaults(func=_cmd_programs)
