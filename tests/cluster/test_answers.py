"""When the driver takes a call as answered: once its actor has finished it, wherever its answer
lies (popgrpo.runtime.ray_executor.first_answered), not once the answer has been pulled to the
driver's node. A wait that pulled reported a finished call on another node as not ready when
asked with no time left, as the driver asks after rebuilding another actor past the call's
deadline, and took a healthy actor as hung: the cascade that failed the frozen-node test.

The driver runs in a subprocess (tests/cluster/scenarios.py) on a 2-node loopback cluster.
"""

import pytest

pytest.importorskip("ray")

from tests.cluster import scenarios

pytestmark = [pytest.mark.ray, pytest.mark.heavy]


def test_a_finished_call_counts_as_answered_before_its_answer_is_pulled(tmp_path):
    result = scenarios.run("remote_answer", tmp_path, timeout=300)
    assert result["on_worker"] and result["answered"], result
    assert not result["pulled_by_asking"] and result["only_on_worker"], result
    assert result["fetched"], result
