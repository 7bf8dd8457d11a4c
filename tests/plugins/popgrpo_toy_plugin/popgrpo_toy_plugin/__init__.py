"""A toy popgrpo plugin: the ``bowl`` environment and the ``toy_best`` merge.

Importing this module registers both (popgrpo imports it through the ``popgrpo.plugins``
entry point of this package's pyproject.toml). The targets are lazy ``"module:attr"``
strings: ``popgrpo config`` can check ``env.kind=bowl`` without importing torch.
"""

from popgrpo.registry import ENVIRONMENTS, MERGES

ENVIRONMENTS.register("bowl", "popgrpo_toy_plugin.envs:bowl_env")
MERGES.register("toy_best", "popgrpo_toy_plugin.merges:best_member")
