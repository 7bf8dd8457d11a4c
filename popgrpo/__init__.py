"""popgrpo: population GRPO against convergence and diversity collapse.

Layers (imports point downward): ``cli``/``train`` → ``runtime`` → ``algorithms`` →
``envs``/``policies`` → ``core`` (pure torch/numpy). See ``shared/ARCHITECTURE.md``.
"""

__version__ = "0.1.0"
