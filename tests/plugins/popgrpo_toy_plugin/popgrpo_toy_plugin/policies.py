"""``toy_gaussian``: the paper's Gaussian policy under a plugin's name, registered as a plain factory.

popgrpo must treat it exactly as its built-in ``gaussian``: the same samples, packing with
``population.vectorize``, initial weights at the environment's ``idea_dim``
(tests/test_plugins.py compares whole runs).
"""

from __future__ import annotations

from popgrpo.policies import gaussian_policy


def toy_gaussian(cfg, idea_dim, generator=None):
    """The factory popgrpo calls for ``policy.kind=toy_gaussian``: ``(PolicyConfig, idea_dim, generator) → policy``."""
    return gaussian_policy(cfg, idea_dim, generator)
