"""Imported by verl in each of its processes (``VERL_USE_EXTERNAL_MODULES``, set by the gate on every device):
FSDP2's all-gather buffers are zero-filled (:func:`precision_harness.runs.verl.fsdp2_buffers.zero_fill`), when FSDP2's
collectives module is first imported (most verl processes never import it), under whichever of its names the
installed torch has."""

from precision_harness.runs.verl.fsdp2_buffers import MODULES, zero_fill
from precision_harness.runs.verl.stages import on_import

for _module in MODULES:
    on_import.when_imported(_module, zero_fill)
