"""Gradients reduced across CPU ranks over gloo are averaged, as on NCCL and HCCL (issue 28).

verl's two-rank CPU scenario relies on FSDP2's ``reduce_scatter(op=AVG)`` on gloo, which gloo
emulates as an all-reduce; an emulation that dropped the op would sum, and every gradient of a
multi-rank CPU golden would be twice the device's. The helper runs in its own processes: the pytest
process never imports torch.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

HELPER = Path(__file__).with_name("fsdp2_gloo_grads.py")


def _grads(world: int, out: Path) -> Path:
    argv = [sys.executable, str(HELPER), str(world), str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@pytest.mark.slow
def test_two_rank_gradient_of_a_replicated_batch_equals_the_one_rank_gradient(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    one = torch.load(_grads(1, tmp_path / "one.pt"))
    two = torch.load(_grads(2, tmp_path / "two.pt"))
    # the control: on 2 ranks gloo's reduce-scatter of a replicated tensor gives the input with AVG and
    # twice it with SUM (both exact), so a gradient that summed would show as twice the 1-rank one
    collective = two.pop("__collective__")
    one.pop("__collective__")
    assert torch.equal(collective["avg"], collective["input"])
    assert torch.equal(collective["sum"], 2 * collective["input"]) and collective["input"].any()
    assert sorted(one) == sorted(two)
    for name in one:
        assert one[name].any(), f"{name}: no gradient reached it"
        assert torch.equal(two[name], one[name]), f"{name}: the 2-rank gradient is not the 1-rank one"
