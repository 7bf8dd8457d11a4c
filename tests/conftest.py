import os

import pytest
import torch

torch.set_num_threads(1)

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)
