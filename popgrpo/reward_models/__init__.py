"""Learned reward models as a proxy for costly execution, and WARM (Ramé et al. 2024).

* :mod:`popgrpo.core.reward_model`: the math (RM module, Bradley–Terry, corruption, WA, ENS).
* :mod:`~popgrpo.reward_models.data`: preference pairs from executed ideas of a reference policy.
* :mod:`~popgrpo.reward_models.store`: the RM directory (what ``popgrpo rm train`` writes).
* :mod:`~popgrpo.reward_models.proxy`: a member's reward source from an RM directory.
* :mod:`~popgrpo.reward_models.tune`: ``popgrpo rm train``, M fine-tunings as Ray Tune trials.

This package's ``__init__`` imports nothing, so a member can import the proxy alone.
"""
