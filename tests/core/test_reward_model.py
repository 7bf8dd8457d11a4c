"""WARM's math against its formulas: Bradley–Terry by hand, WA and ENS, exact corruption, pairs."""

import math

import pytest
import torch

from popgrpo.core.reward_model import (
    FinetuneSpec,
    RewardModel,
    bradley_terry_loss,
    corrupt_labels,
    ensemble_scores,
    finetune,
    interpolate,
    make_pairs,
    pair_accuracy,
    pretrain_featurizer,
    weight_average,
)


def test_bradley_terry_loss_matches_a_hand_computed_value():
    s_a = torch.tensor([2.0, 0.0, -1.0])
    s_b = torch.tensor([1.0, 0.5, 1.0])
    y = torch.tensor([1.0, 0.0, 1.0])
    # −[log σ(1) + log σ(0.5) + log σ(−2)] / 3, with log σ(z) = −log(1 + e^{−z})
    expected = (math.log1p(math.exp(-1.0)) + math.log1p(math.exp(-0.5)) + math.log1p(math.exp(2.0))) / 3
    assert float(bradley_terry_loss(s_a, s_b, y)) == pytest.approx(expected, rel=1e-6)
    assert float(bradley_terry_loss(s_a, s_b, y)) == pytest.approx((0.31326 + 0.47408 + 2.12693) / 3, abs=1e-4)


def test_weight_average_of_identical_models_equals_each():
    model = RewardModel(5, hidden=8, dropout=0.1)
    states = [{k: v.clone() for k, v in model.state_dict().items()} for _ in range(4)]
    averaged = weight_average(states)
    for key, value in model.state_dict().items():
        assert torch.allclose(averaged[key], value, atol=1e-7)
    x = torch.randn(7, 5)
    other = RewardModel(5, hidden=8).eval()
    other.load_state_dict(averaged)
    assert torch.allclose(other(x), model.eval()(x), atol=1e-6)


def test_weight_average_is_the_elementwise_mean_and_differs_from_ens_for_nonlinear_models():
    torch.manual_seed(0)
    models = [RewardModel(3, hidden=6).eval() for _ in range(3)]
    averaged = weight_average([m.state_dict() for m in models])
    for key in averaged:
        assert torch.allclose(averaged[key], torch.stack([m.state_dict()[key] for m in models]).mean(0), atol=1e-6)
    x = torch.randn(50, 3)
    wa = RewardModel(3, hidden=6).eval()
    wa.load_state_dict(averaged)
    assert not torch.allclose(wa(x), ensemble_scores([m(x) for m in models]), atol=1e-3)


def test_ens_is_the_mean_of_predictions_and_weighted_mean_with_weights():
    scores = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, -2.0]), torch.tensor([2.0, 3.0])]
    assert torch.equal(ensemble_scores(scores), torch.tensor([2.0, 1.0]))
    assert torch.allclose(ensemble_scores(scores[:2], [0.25, 0.75]), torch.tensor([2.5, -1.0]))


def test_interpolation_ends_at_each_model():
    a, b = RewardModel(3, hidden=4).state_dict(), RewardModel(3, hidden=4).state_dict()
    for key in a:
        assert torch.allclose(interpolate(a, b, 0.0)[key], a[key])
        assert torch.allclose(interpolate(a, b, 1.0)[key], b[key])
        assert torch.allclose(interpolate(a, b, 0.5)[key], (a[key] + b[key]) / 2, atol=1e-7)


@pytest.mark.parametrize("fraction", [0.0, 0.25, 0.5, 1.0])
def test_corruption_swaps_exactly_the_requested_fraction(fraction):
    gen = torch.Generator().manual_seed(3)
    ideas = torch.randn(300, 4)
    pairs = make_pairs(ideas, torch.randn(300), 1000, gen)
    corrupt = corrupt_labels(pairs, fraction, gen)
    swapped = corrupt.y != pairs.y
    assert int(swapped.sum()) == round(fraction * len(pairs)) == int(corrupt.corrupted.sum())
    assert torch.equal(swapped, corrupt.corrupted)
    assert torch.equal(corrupt.true_y, pairs.y)
    with pytest.raises(ValueError):
        corrupt_labels(pairs, 1.5, gen)


def test_pairs_are_labelled_by_the_higher_executed_reward_and_skip_ties():
    gen = torch.Generator().manual_seed(0)
    ideas = torch.arange(40, dtype=torch.float32)[:, None]  # idea i is the number i
    rewards = torch.where(torch.arange(40) % 2 == 0, 0.0, torch.arange(40, dtype=torch.float32))  # evens "failed"
    pairs = make_pairs(ideas, rewards, 500, gen)
    assert len(pairs) == 500
    ra, rb = rewards[pairs.a[:, 0].long()], rewards[pairs.b[:, 0].long()]
    assert bool((ra != rb).all())
    assert torch.equal(pairs.y, (ra > rb).float())


def test_pair_accuracy_counts_ties_half():
    a, b = torch.tensor([1.0, 0.0, 2.0, 5.0]), torch.tensor([0.0, 1.0, 2.0, 1.0])
    y = torch.tensor([1.0, 1.0, 0.0, 0.0])
    assert pair_accuracy(a, b, y) == pytest.approx((1 + 0 + 0.5 + 0) / 4)
    assert math.isnan(pair_accuracy(a[:0], b[:0], y[:0]))


def test_finetuning_learns_a_preference_and_pretraining_records_checkpoints():
    gen = torch.Generator().manual_seed(1)
    ideas = torch.randn(400, 4, generator=gen)
    true = ideas[:, 0] - ideas[:, 1]  # the preference the RM must learn
    pairs = make_pairs(ideas, true, 600, gen)
    torch.manual_seed(0)
    model = RewardModel(4, hidden=16)
    checkpoints = pretrain_featurizer(
        model, ideas, ideas.norm(dim=1, keepdim=True), steps=60, n_checkpoints=3, lr=1e-2, batch_size=32, generator=gen
    )
    assert len(checkpoints) == 3 and not torch.equal(checkpoints[0]["0.weight"], checkpoints[-1]["0.weight"])
    assert torch.equal(checkpoints[-1]["0.weight"], model.featurizer.state_dict()["0.weight"])
    before = pair_accuracy(model(pairs.a), model(pairs.b), pairs.y)
    losses = finetune(model, pairs, FinetuneSpec(lr=3e-3, dropout=0.1, data_seed=5, epochs=8))
    after = pair_accuracy(model(pairs.a), model(pairs.b), pairs.y)
    assert losses[-1] < losses[0] and after > 0.9 > before
    assert not model.training and model.dropout.p == 0.1


def test_best_of_n_takes_the_value_of_the_top_scored_candidate_and_its_kl():
    from popgrpo.core.reward_model import best_of_n, best_of_n_kl

    scores = torch.tensor([[0.1, 0.9, 0.3], [2.0, -1.0, 0.0]])
    values = torch.tensor([[10.0, 20.0, 30.0], [1.0, 2.0, 3.0]])
    assert torch.equal(best_of_n(scores, values), torch.tensor([20.0, 1.0]))
    assert best_of_n_kl(1) == 0.0
    assert best_of_n_kl(4) == pytest.approx(math.log(4) - 0.75)


def test_linear_probe_trains_the_head_only():
    from popgrpo.core.reward_model import linear_probe

    gen = torch.Generator().manual_seed(2)
    ideas = torch.randn(300, 4, generator=gen)
    pairs = make_pairs(ideas, ideas[:, 0], 400, gen)
    torch.manual_seed(1)
    model = RewardModel(4, hidden=16)
    featurizer = {k: v.clone() for k, v in model.featurizer.state_dict().items()}
    head = {k: v.clone() for k, v in model.head.state_dict().items()}
    losses = linear_probe(model, pairs, epochs=5, lr=1e-2, batch_size=64, generator=gen)
    assert losses[-1] < losses[0]
    assert all(torch.equal(v, model.featurizer.state_dict()[k]) for k, v in featurizer.items())
    assert not torch.equal(head["weight"], model.head.weight)
