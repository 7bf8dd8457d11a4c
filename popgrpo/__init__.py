"""popgrpo: population GRPO against convergence and diversity collapse.

Layers (imports point downward): entry points (``cli``) → ``study``/``ops``/``sim`` → ``train``/
``reward_models`` → ``runtime`` → ``algorithms`` → ``envs``/``policies`` → ``telemetry`` →
``core`` (pure torch/numpy) → ``config``/``registry``/``schema``. docs/reference/design.md
draws them; tests/test_import_graph.py enforces them.
"""

import time as _time

__version__ = "0.1.0"

# When this process began importing popgrpo (``time.time()``): a member actor's start is timed
# from it (:meth:`popgrpo.runtime.actors.MemberGroup.start_times`, ``benchmarks/start_phases.py``).
IMPORT_STARTED_AT = _time.time()
