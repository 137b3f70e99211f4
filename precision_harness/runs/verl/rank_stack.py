"""Imported by verl in each of its processes (``VERL_USE_EXTERNAL_MODULES``, set by the gate on every device):
the device's deterministic settings applied in every process (:func:`precision_harness.runs.numerics.devices.
worker_determinism`), and a rank process of a gate run writes its stack, ``env/rank<r>.json``
(:mod:`precision_harness.runs.host.rank_env`), with the determinism it applied, where its torch's FSDP2 all-gather
buffer is zero-filled (:func:`.fsdp2_buffers.fill_record`) and the Ray node it ran on.

Only files, package metadata, torch's process-wide switches and the vendors' tools are touched
(:mod:`precision_harness.runs.host.stack`): nothing opens a device context before verl picks its device.
"""

import os

from precision_harness.runs.host.rank_env import ENV_DEVICE, RAY_NODE, write_from_environment
from precision_harness.runs.numerics.devices import worker_determinism
from precision_harness.runs.verl.fsdp2_buffers import fill_record


def _ray_node() -> str:
    """The id of the Ray node this process runs on (its first 12 hex digits), or "" outside a Ray worker."""
    try:
        import ray

        return ray.get_runtime_context().get_node_id()[:12] if ray.is_initialized() else ""
    except Exception:  # a record never fails a run
        return ""


# the gate's runs only: a user's own verl process that happens to import the module keeps its settings
_applied = worker_determinism(os.environ.get(ENV_DEVICE, "cpu")) if os.environ.get("PRECISION_DUMP_DIR") else {}
write_from_environment({**fill_record(), **_applied, RAY_NODE: _ray_node()})
