"""popgrpo: population GRPO against convergence and diversity collapse.

Layers (imports point downward): entry points (``cli``) → ``study``/``ops``/``sim`` → ``train``/
``reward_models`` → ``runtime`` → ``algorithms`` → ``envs``/``policies`` → ``telemetry`` →
``core`` (pure torch/numpy) → ``config``/``registry``/``schema``. docs/reference/design.md
draws them; tests/test_import_graph.py enforces them.
"""

__version__ = "0.1.0"
