"""The numerics settings of every verl process on the CPU: threads, portable kernels, the GPU's autocast lists.

verl starts its processes itself (the driver, the TaskRunner, one worker per rank, the rollout
server, agent-loop and reward workers), each importing torch on its own; :func:`setup_process` runs
in each of them (from :mod:`.extension`, which ``import verl`` runs, and from the rollout server) and
makes their arithmetic the same on every x86-64 CPU with AVX2, as the built-in runner's is:

- ``torch.set_num_threads`` to the scenario's ``trainer.num_threads`` (``OMP_NUM_THREADS``, which the
  gate sets with the rest of :func:`precision_harness.runs.numerics.devices.determinism_env`): a CPU
  reduction's order depends on the thread count;
- with ``PRECISION_CPU_KERNELS=portable`` (``trainer.cpu_kernels``, the default), the matrix products
  of :mod:`precision_harness.runs.numerics.cpu_kernels` (no MKL or oneDNN code chosen by the processor;
  bf16 products accumulated in float32) after the same ATen capability check as the built-in runner;
- :mod:`.autocast_policy`: CPU autocast takes the GPU's float32 op lists, so verl's bf16 mixed
  precision keeps log-probs, entropy and sums in float32 as it does on a GPU or NPU (docs/scenarios.md,
  "verl on CPU", says why the scenario reflects the GPU here).

Idempotent; torch is imported here, so the gate's own process never imports this module.
"""

from __future__ import annotations

import os

#: ``trainer.cpu_kernels`` as the gate passes it to verl's processes
ENV_KERNELS = "PRECISION_CPU_KERNELS"
#: the split_k this process was set up with, as a 1-tuple (None: not set up yet)
_DONE: tuple[int | None] | None = None


def setup_process(*, split_k: int | None = None) -> None:
    """Pin threads, install the portable kernels and the autocast policy in this process (see the module).

    ``split_k``: the portable kernels' split-K reduction (:func:`precision_harness.runs.numerics.cpu_kernels.install`),
    which the rollout server takes to stand in for a rollout engine's own kernels.

    A call without ``split_k`` in a process already set up (``import verl`` in the rollout server) does nothing.

    Raises:
        RuntimeError: portable kernels on a CPU whose ATen kernels are not the AVX2 ones (one line), or a
            ``split_k`` in a process already set up with another.
    """
    global _DONE
    if _DONE is not None:
        if split_k is not None and split_k != _DONE[0]:
            raise RuntimeError(f"verl CPU process already set up with split_k={_DONE[0]}, not {split_k}")
        return
    import torch

    threads = os.environ.get("OMP_NUM_THREADS")
    if threads:
        torch.set_num_threads(int(threads))
    if os.environ.get(ENV_KERNELS, "portable") == "portable":
        from precision_harness.runs.numerics.devices import _portable_cpu

        _portable_cpu(torch, split_k=split_k)  # the ATen capability check, then the kernels
    from precision_harness.runs.verl.cpu import autocast_policy

    autocast_policy.install()
    _DONE = (split_k,)
