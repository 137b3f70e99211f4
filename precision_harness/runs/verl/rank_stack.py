"""Imported by verl in each of its processes (``VERL_USE_EXTERNAL_MODULES``, set by the gate on every device):
a rank process of a gate run writes its stack, ``env/rank<r>.json`` (:mod:`precision_harness.runs.host.rank_env`).

Only files, package metadata and the vendors' tools are read (:mod:`precision_harness.runs.host.stack`):
nothing touches a device, so the rank opens no context before verl picks its device.
"""

from precision_harness.runs.host.rank_env import write_from_environment

write_from_environment()
