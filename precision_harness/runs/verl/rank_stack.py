"""Imported by verl in each of its processes (``VERL_USE_EXTERNAL_MODULES``, set by the gate on every device):
a rank process of a gate run writes its stack, ``env/rank<r>.json`` (:mod:`precision_harness.runs.host.rank_env`),
with where its torch's FSDP2 all-gather buffer is zero-filled (:func:`.fsdp2_buffers.fill_record`).

Only files, package metadata and the vendors' tools are read (:mod:`precision_harness.runs.host.stack`):
nothing touches a device, so the rank opens no context before verl picks its device.
"""

from precision_harness.runs.host.rank_env import write_from_environment
from precision_harness.runs.verl.fsdp2_buffers import fill_record

write_from_environment(fill_record())
