"""popgrpo's token loss against TRL's ``GRPOTrainer`` loss, the reference implementation.

The same completions, masks, advantages and sampling / reference log-probs go to
``GRPOTrainer._compute_loss`` (a real trainer on a toy model made here) and to popgrpo's
:func:`~popgrpo.algorithms.step.grpo_loss` reduced by
:func:`~popgrpo.core.grpo.masked_aggregate`; loss and gradient must agree, for every
``loss_normalisation`` and its TRL ``loss_type``:

=====================  ===========================================================
popgrpo                TRL ``loss_type``
=====================  ===========================================================
``token``              ``bnpo`` and ``dapo`` (one process: both divide by the batch's tokens)
``sequence``           ``grpo``
``constant``           ``dr_grpo`` (divisor ``N · max_completion_length``)
=====================  ===========================================================

The first test hands both the same log-prob tensor, so only the loss is compared; the
second lets each compute log-probs from the same model (popgrpo through its LoRA policy,
TRL through its own forward) and compares the gradients on the shared adapter weights.
"""

import pytest
import torch

from popgrpo.algorithms.step import grpo_loss
from popgrpo.core.grpo import masked_aggregate
from tests.services import require_module

trl = require_module("trl")
require_module("peft")


PAIRS = [("token", "bnpo"), ("token", "dapo"), ("sequence", "grpo"), ("constant", "dr_grpo")]
N, T, CLIP, BETA = 6, 7, 0.2, 0.05


def _trainer(model, tmp_path, loss_type: str, max_completion_length: int = T):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(tmp_path / loss_type),
        loss_type=loss_type,
        beta=BETA,
        epsilon=CLIP,
        num_generations=N,
        per_device_train_batch_size=N,
        max_completion_length=max_completion_length,
        temperature=1.0,
        # TRL (1.x) multiplies the k3 KL by the importance ratio π/π_old by default; popgrpo's
        # KL is the plain k3 of DeepSeekMath eq. 4 (popgrpo.core.grpo.kl_penalty).
        use_bias_correction_kl=False,
        use_cpu=True,
        bf16=False,  # TRL turns bf16 autocast on where it can (the CPU included); popgrpo computes in float32
        report_to=[],
        logging_steps=1,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=lambda prompts, completions, **kw: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["x"] * N}),
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop; one step, no accumulation
    return trainer


def _batch(gen):
    """Completions of different lengths (one empty), log-probs near each other so some ratios clip."""
    lengths = torch.tensor([7, 5, 1, 3, 7, 0])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    old = -torch.rand(N, T, generator=gen) * 3
    ref = old + 0.3 * torch.randn(N, T, generator=gen)
    logp = old + 0.4 * torch.randn(N, T, generator=gen)
    advantages = torch.randn(N, generator=gen)
    return logp, old, ref, advantages, mask


def _popgrpo_loss(logp, old, ref, advantages, mask, normalisation):
    loss, _ = grpo_loss(
        logp,
        old,
        ref,
        advantages[:, None],
        torch.zeros(()),
        clip=CLIP,
        kl_coef=BETA,
        alpha=None,
        reduce=lambda v: masked_aggregate(v, mask, normalisation),
    )
    return loss


def _inputs(old, ref, advantages, mask, prompt_ids, completion_ids):
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids,
        "completion_mask": mask.long(),
        "advantages": advantages,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "num_items_in_batch": mask.sum(),
    }


@pytest.mark.parametrize(("normalisation", "loss_type"), PAIRS)
def test_same_log_probs_same_loss_and_gradient(tiny_lm, tmp_path, normalisation, loss_type):
    from transformers import AutoModelForCausalLM

    gen = torch.Generator().manual_seed(11)
    logp, old, ref, advantages, mask = _batch(gen)
    trainer = _trainer(AutoModelForCausalLM.from_pretrained(tiny_lm), tmp_path, loss_type)

    ours_logp = logp.clone().requires_grad_(True)
    ours = _popgrpo_loss(ours_logp, old, ref, advantages, mask, normalisation)
    ours.backward()

    theirs_logp = logp.clone().requires_grad_(True)
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (theirs_logp, torch.zeros_like(theirs_logp), None)
    ids = torch.randint(4, 20, (N, 3 + T), generator=gen)
    theirs = trainer._compute_loss(trainer.model, _inputs(old, ref, advantages, mask, ids[:, :3], ids[:, 3:]))
    theirs.backward()

    assert float(ours.detach()) == pytest.approx(float(theirs.detach()), rel=1e-6, abs=1e-7)
    torch.testing.assert_close(ours_logp.grad, theirs_logp.grad, rtol=1e-5, atol=1e-7)
    assert ours_logp.grad[mask == 0].abs().max() == 0  # padding gets no gradient
    assert ours_logp.grad[mask == 1].abs().max() > 0  # and the test is not comparing zeros


def test_normalisations_differ_so_the_pairing_is_tested(tiny_lm):
    gen = torch.Generator().manual_seed(11)
    logp, old, ref, advantages, mask = _batch(gen)
    losses = {n: float(_popgrpo_loss(logp, old, ref, advantages, mask, n)) for n in ("token", "sequence", "constant")}
    assert len({round(v, 6) for v in losses.values()}) == 3


@pytest.mark.parametrize(("normalisation", "loss_type"), [("token", "bnpo"), ("sequence", "grpo")])
def test_log_probs_from_the_model_give_the_same_adapter_gradients(tiny_lm, tmp_path, normalisation, loss_type):
    """End to end: popgrpo's policy computes its token log-probs, TRL its own, from one LoRA model."""
    from popgrpo.policies.causal_lm import CausalLMPolicy, Rollout
    from tests.lm import lm_config

    cfg = lm_config(tiny_lm, policy={"kind": "causal_lm"}).policy.causal_lm.model_copy(
        update={"loss_normalisation": normalisation, "temperature": 1.0}
    )
    policy = CausalLMPolicy(cfg, "cpu", torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():  # non-zero B, so the adapters change the model and get gradients through both paths
        for _, p in policy._adapters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    prompt = torch.randint(4, 40, (N, 4), generator=gen)  # equal-length prompts: no left padding
    completion = torch.randint(4, 40, (N, T), generator=gen)
    _, old, ref, advantages, mask = _batch(gen)
    completion = completion.masked_fill(mask == 0, policy.tokenizer.pad_token_id)
    sequences = torch.cat([prompt, completion], dim=1)
    attention = torch.cat([torch.ones_like(prompt), mask.long()], dim=1)
    rollout = Rollout(["p"] * 1, sequences, attention, mask, [""] * N, N)

    logp, _ = policy.token_log_probs(rollout)
    ours = _popgrpo_loss(logp, old, ref, advantages, mask, normalisation)
    ours_grads = torch.autograd.grad(ours, policy.parameters())

    trainer = _trainer(policy.model, tmp_path, loss_type)
    params = [p for _, p in policy._adapters()]
    theirs = trainer._compute_loss(trainer.model, _inputs(old, ref, advantages, mask, prompt, completion))
    theirs_grads = torch.autograd.grad(theirs, params)

    assert float(ours.detach()) == pytest.approx(float(theirs.detach()), rel=1e-5, abs=1e-6)
    for a, b in zip(ours_grads, theirs_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert max(float(g.abs().max()) for g in ours_grads) > 0
