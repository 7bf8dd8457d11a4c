"""A simulator of the Pop-GRPO scheduler at cluster scale (SimPy), with costs measured here.

:mod:`popgrpo.research.sim.costs` holds what each part of a round costs, :mod:`popgrpo.research.sim.measure`
measures those costs on this machine with the real components, :mod:`popgrpo.research.sim.model` runs
the sync and async schedules on a simulated cluster. See docs/guides/scale.md.
"""
