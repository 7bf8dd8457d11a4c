"""Reward models (RMs) over ideas, and WARM's math: Bradley–Terry fine-tuning, label
corruption, weight averaging, prediction ensembling (WARM, Ramé et al. 2024, ``shared/seeds/003_…``).

An RM maps what the archive stores for an idea (the idea ``x ∈ R^d``, or a completion's
sentence embedding) to a scalar score. It is a **featurizer** (an MLP shared by every RM,
pre-trained once, :func:`pretrain_featurizer`) and a linear **head**. WARM fine-tunes M RMs
from the pre-trained start with different data orders, learning rates and dropout (and, with
*Baklava*, from different checkpoints of the one pre-training run), then averages their
weights (:func:`weight_average`) instead of their predictions (:func:`ensemble_scores`, ENS).

Shapes: ``N`` ideas of width ``d``; ``n`` preference pairs ``(a, b)`` with label ``y = 1``
when ``a`` was preferred (its executed reward was higher). Everything here is pure torch:
no Ray, no environment, no files.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from popgrpo.core.merge import soup

__all__ = [
    "FinetuneSpec",
    "PreferencePairs",
    "RewardModel",
    "best_of_n",
    "best_of_n_kl",
    "bradley_terry_loss",
    "corrupt_labels",
    "ensemble_scores",
    "finetune",
    "interpolate",
    "linear_probe",
    "make_pairs",
    "pair_accuracy",
    "pretrain_featurizer",
    "weight_average",
]


class RewardModel(nn.Module):
    """``[N, d]`` → ``[N]`` scores: MLP featurizer (``depth`` ReLU layers of width ``hidden``),
    dropout, linear head. Dropout is active in ``train()`` mode only."""

    def __init__(self, in_dim: int, hidden: int = 64, depth: int = 2, dropout: float = 0.0) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = in_dim
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        self.featurizer = nn.Sequential(*layers)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(hidden, 1)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """``[N, d]`` → ``[N, hidden]``."""
        return self.featurizer(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.dropout(self.features(x))).squeeze(-1)


@dataclass(frozen=True)
class PreferencePairs:
    """``n`` preference pairs: ideas ``a``, ``b`` ``[n, d]``, labels ``y`` ``[n]`` (1.0: ``a`` preferred).

    ``corrupted`` ``[n]`` bool marks pairs whose label was swapped (:func:`corrupt_labels`);
    ``true_y`` keeps the labels before corruption.
    """

    a: torch.Tensor
    b: torch.Tensor
    y: torch.Tensor
    true_y: torch.Tensor
    corrupted: torch.Tensor

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def subset(self, mask: torch.Tensor) -> PreferencePairs:
        return PreferencePairs(self.a[mask], self.b[mask], self.y[mask], self.true_y[mask], self.corrupted[mask])


def make_pairs(ideas: torch.Tensor, rewards: torch.Tensor, n_pairs: int, generator: torch.Generator) -> PreferencePairs:
    """``n_pairs`` pairs of distinct ideas drawn uniformly from ``ideas [N, d]``, labelled by
    which executed reward (``rewards [N]``) is higher. Ties (both executions failed: both 0)
    carry no preference and are redrawn; at most ``n_pairs`` come back if too few are untied."""
    n = ideas.shape[0]
    kept_a: list[torch.Tensor] = []
    kept_b: list[torch.Tensor] = []
    have = 0
    for _ in range(20):  # untied pairs are most of a draw; a few rounds always fill it
        i = torch.randint(n, (2 * n_pairs,), generator=generator)
        j = torch.randint(n, (2 * n_pairs,), generator=generator)
        ok = (i != j) & (rewards[i] != rewards[j])
        kept_a.append(i[ok])
        kept_b.append(j[ok])
        have += int(ok.sum())
        if have >= n_pairs:
            break
    i, j = torch.cat(kept_a)[:n_pairs], torch.cat(kept_b)[:n_pairs]
    y = (rewards[i] > rewards[j]).float()
    return PreferencePairs(ideas[i], ideas[j], y, y.clone(), torch.zeros_like(y, dtype=torch.bool))


def corrupt_labels(pairs: PreferencePairs, fraction: float, generator: torch.Generator) -> PreferencePairs:
    """Swap the labels of exactly ``round(fraction · n)`` pairs, chosen uniformly (WARM §5's
    corrupted preferences); the chosen pairs are marked in ``corrupted``."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must lie in [0, 1], got {fraction}")
    n = len(pairs)
    k = round(fraction * n)
    chosen = torch.randperm(n, generator=generator)[:k]
    corrupted = torch.zeros(n, dtype=torch.bool)
    corrupted[chosen] = True
    y = torch.where(corrupted, 1.0 - pairs.true_y, pairs.true_y)
    return PreferencePairs(pairs.a, pairs.b, y, pairs.true_y, corrupted)


def bradley_terry_loss(score_a: torch.Tensor, score_b: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood of the labels under Bradley–Terry:
    ``P(a ≻ b) = σ(s_a − s_b)``, loss ``−[y·log σ(s_a − s_b) + (1 − y)·log σ(s_b − s_a)]``."""
    margin = score_a - score_b
    return nn.functional.binary_cross_entropy_with_logits(margin, y)


def pair_accuracy(score_a: torch.Tensor, score_b: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of pairs whose preferred idea scores higher (a tie counts half); NaN for no pairs."""
    if y.numel() == 0:
        return math.nan
    right = torch.where(score_a == score_b, 0.5, ((score_a > score_b).float() == y).float())
    return float(right.mean())


def weight_average(
    states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float] | None = None
) -> dict[str, torch.Tensor]:
    """WARM: the (uniform, or ``weights``-weighted) average of M RMs' state dicts (a model soup)."""
    return soup(list(states), weights)


def interpolate(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor], lam: float) -> dict[str, torch.Tensor]:
    """``(1 − λ)·θ_a + λ·θ_b`` (linear mode connectivity, WARM Fig. 3)."""
    return weight_average([a, b], [1.0 - lam, lam])


def ensemble_scores(scores: Sequence[torch.Tensor], weights: Sequence[float] | None = None) -> torch.Tensor:
    """ENS: the (weighted) mean of M RMs' scores, ``M × [N]`` → ``[N]``."""
    stacked = torch.stack(list(scores))
    if weights is None:
        return stacked.mean(0)
    w = torch.as_tensor(list(weights), dtype=stacked.dtype)
    return (w[:, None] * stacked).sum(0) / w.sum()


def pretrain_featurizer(
    model: RewardModel,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    *,
    steps: int,
    n_checkpoints: int,
    lr: float,
    batch_size: int,
    generator: torch.Generator,
) -> list[dict[str, torch.Tensor]]:
    """Pre-train ``model.featurizer`` to regress ``targets [N, t]`` from ``inputs [N, d]`` through
    a temporary linear head (mean squared error, Adam), and record ``n_checkpoints`` featurizer
    state dicts evenly along the way, the last one at the end (Baklava's initialisations)."""
    probe = nn.Linear(model.head.in_features, targets.shape[1])
    with torch.random.fork_rng(devices=[]):  # pyright: ignore[reportUnknownMemberType]  # torch: fork_rng is unannotated
        torch.manual_seed(int(torch.randint(2**31 - 1, (1,), generator=generator)))  # pyright: ignore[reportUnknownMemberType]  # torch: manual_seed's seed is unannotated
        probe.reset_parameters()
    params = [*model.featurizer.parameters(), *probe.parameters()]
    optimizer = torch.optim.Adam(params, lr=lr)
    marks = {round(steps * (c + 1) / n_checkpoints) for c in range(n_checkpoints)}
    checkpoints: list[dict[str, torch.Tensor]] = []
    model.train()
    for step in range(1, steps + 1):
        index = torch.randint(inputs.shape[0], (batch_size,), generator=generator)
        loss = nn.functional.mse_loss(probe(model.features(inputs[index])), targets[index])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # pyright: ignore[reportUnknownMemberType]  # torch: backward's gradient is unannotated
        optimizer.step()  # pyright: ignore[reportUnknownMemberType]  # torch: Optimizer.step's closure is unannotated
        if step in marks:
            checkpoints.append({k: v.detach().clone() for k, v in model.featurizer.state_dict().items()})
    return checkpoints


def linear_probe(
    model: RewardModel, pairs: PreferencePairs, *, epochs: int, lr: float, batch_size: int, generator: torch.Generator
) -> list[float]:
    """Train ``model.head`` alone on ``pairs`` (Bradley–Terry, Adam), the featurizer frozen, no
    dropout: the linear probe every RM then starts from (WARM appendix B.3, after LP-FT), which
    keeps fine-tuned features close to their start and so their weights averageable."""
    features_a = model.features(pairs.a).detach()
    features_b = model.features(pairs.b).detach()
    optimizer = torch.optim.Adam(model.head.parameters(), lr=lr)
    losses: list[float] = []
    for _ in range(epochs):
        order = torch.randperm(len(pairs), generator=generator)
        total = 0.0
        for start in range(0, len(pairs), batch_size):
            index = order[start : start + batch_size]
            score_a = model.head(features_a[index]).squeeze(-1)
            score_b = model.head(features_b[index]).squeeze(-1)
            loss = bradley_terry_loss(score_a, score_b, pairs.y[index])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # pyright: ignore[reportUnknownMemberType]  # torch: backward's gradient is unannotated
            optimizer.step()  # pyright: ignore[reportUnknownMemberType]  # torch: Optimizer.step's closure is unannotated
            total += float(loss.detach()) * len(index)
        losses.append(total / len(pairs))
    return losses


@dataclass(frozen=True)
class FinetuneSpec:
    """One RM's fine-tuning: its sources of diversity (data order seed, lr, dropout) and budget."""

    lr: float
    dropout: float
    data_seed: int
    epochs: int = 10
    batch_size: int = 64
    weight_decay: float = 0.0


def finetune(model: RewardModel, pairs: PreferencePairs, spec: FinetuneSpec) -> list[float]:
    """Fine-tune every parameter of ``model`` on ``pairs`` with the Bradley–Terry loss (Adam),
    ``spec.epochs`` passes in the order drawn from ``spec.data_seed``; returns each epoch's mean loss.

    The dropout rate is set to ``spec.dropout`` (it has no parameters, so RMs with different
    rates still average). The model is left in ``eval()`` mode.
    """
    model.dropout.p = spec.dropout
    generator = torch.Generator().manual_seed(spec.data_seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=spec.lr, weight_decay=spec.weight_decay)
    n = len(pairs)
    losses: list[float] = []
    model.train()
    with torch.random.fork_rng(devices=[]):  # pyright: ignore[reportUnknownMemberType]  # torch: fork_rng is unannotated
        torch.manual_seed(spec.data_seed)  # dropout masks draw from the global stream  # pyright: ignore[reportUnknownMemberType]
        for _ in range(spec.epochs):
            order = torch.randperm(n, generator=generator)
            total = 0.0
            for start in range(0, n, spec.batch_size):
                index = order[start : start + spec.batch_size]
                loss = bradley_terry_loss(model(pairs.a[index]), model(pairs.b[index]), pairs.y[index])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()  # pyright: ignore[reportUnknownMemberType]  # torch: backward's gradient is unannotated
                optimizer.step()  # pyright: ignore[reportUnknownMemberType]  # torch: Optimizer.step's closure is unannotated
                total += float(loss.detach()) * len(index)
            losses.append(total / n)
    model.eval()
    return losses


def best_of_n(scores: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Best-of-N re-ranking: for each of ``R`` groups of ``N`` candidates, the ``values`` of the
    candidate the proxy ``scores`` highest; ``[R, N]`` both → ``[R]``."""
    return values.gather(1, scores.argmax(dim=1, keepdim=True)).squeeze(1)


def best_of_n_kl(n: int) -> float:
    """KL(best-of-N ‖ reference) = log N − (N − 1)/N (WARM §6, after Stiennon et al. 2020)."""
    return math.log(n) - (n - 1) / n
