"""A toy popgrpo plugin: the ``bowl`` environment, the ``toy_best`` merge and the ``toy_gaussian`` policy.

Importing this module registers them (popgrpo imports it through the ``popgrpo.plugins``
entry point of this package's pyproject.toml). The targets are lazy ``"module:attr"``
strings: ``popgrpo config`` can check ``env.kind=bowl`` without importing torch.
"""

from popgrpo.registry import ENVIRONMENTS, MERGES, POLICIES

ENVIRONMENTS.register("bowl", "popgrpo_toy_plugin.envs:bowl_env")
MERGES.register("toy_best", "popgrpo_toy_plugin.merges:best_member")
POLICIES.register("toy_gaussian", "popgrpo_toy_plugin.policies:toy_gaussian")
