"""Imported by verl in each of its processes (``VERL_USE_EXTERNAL_MODULES``, set by the gate on every device):
a rank process of a gate run writes its stack, ``env/rank<r>.json`` (:mod:`precision_harness.runs.rank_env`), with
where its torch's FSDP2 all-gather buffer is zero-filled (:func:`precision_harness.runs.fsdp2_buffers.fill_record`).

Only files, package metadata and the vendors' tools are read (:mod:`precision_harness.runs.stack`):
nothing touches a device, so the rank opens no context before verl picks its device.
"""

from precision_harness.runs.fsdp2_buffers import fill_record
from precision_harness.runs.rank_env import write_from_environment

write_from_environment(fill_record())
