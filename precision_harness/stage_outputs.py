"""``stage_outputs.json``: a stage's own inputs and outputs, beside its L0 ``dump.json`` (``level: auto``).

An L0 dump sees module boundaries only. What a PPO stage computes outside every module is invisible
to it: log-probs and entropy (``logsumexp``/``gather`` after the LM head), values, per-micro-batch
losses, gradient norms, and the advantages and returns an update consumes. With ``level: auto`` the
built-in runner (``runner/outputs.py``) writes their statistics to
``step_<n>/<stage>/step0/rank<r>/stage_outputs.json`` in msprobe's ``dump.json`` format:

.. code-block:: json

    {"task": "statistics", "level": "auto", "framework": "pytorch",
     "inputs": ["Stage.advantages.0.forward"],
     "data": {"Stage.advantages.0.forward": {"input_args": [{"type": "torch.Tensor", "dtype": ..., "Max": ...}]},
              "Stage.pg_loss.0.forward": {"output": [{"type": "torch.Tensor", "shape": [], "Max": ...}]}}}

Rows are named the way msprobe's compare names them (``Stage.pg_loss.1.forward.output.0``: the
loss of micro-batch 1), so the compare, the tolerance and the verdicts treat them as any API row.
:func:`merged` puts the entries listed in ``inputs`` before the dump's APIs and the rest after
them, the order the stage ran them in, so the first divergence is the earliest. This module
imports neither torch nor msprobe.
"""

from __future__ import annotations

from typing import Any

FILE = "stage_outputs.json"
#: the msprobe-style API prefix of every entry (msprobe's own are Functional, Tensor, Torch, Module...)
PREFIX = "Stage"


def merged(dump: dict[str, Any], outputs: dict[str, Any] | None) -> dict[str, Any]:
    """``dump`` (a parsed dump.json) with the stage's inputs before its APIs and its outputs after them.

    Returns ``dump`` itself when ``outputs`` is None (an L0/L1/mix run has no stage_outputs.json).
    """
    if outputs is None:
        return dump
    data = outputs.get("data") or {}
    inputs = set(outputs.get("inputs") or [])
    before = {k: v for k, v in data.items() if k in inputs}
    after = {k: v for k, v in data.items() if k not in inputs}
    return {**dump, "data": {**before, **dump["data"], **after}}


def rank_digest(dump_sha256: str, outputs_sha256: str | None) -> str:
    """A rank's identity: its dump.json digest, joined with its stage_outputs.json digest when it has one.

    Two ranks with equal digests are identical statistic for statistic (the compare's fast path).
    """
    return dump_sha256 if outputs_sha256 is None else f"{dump_sha256}+{outputs_sha256}"
