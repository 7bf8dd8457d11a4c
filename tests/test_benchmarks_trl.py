"""benchmarks.trl_throughput refuses a model directory that is not one, before loading anything."""

import pytest

from benchmarks import trl_throughput


def test_missing_model_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        trl_throughput.main(["--model", str(tmp_path / "nowhere")])
    assert exc.value.code == 2
    assert "popgrpo lm pretrain" in capsys.readouterr().err
