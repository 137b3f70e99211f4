"""Imported by verl in each of its processes (``VERL_USE_EXTERNAL_MODULES``, set by the gate on every device):
FSDP2's all-gather buffers are zero-filled (:func:`precision_harness.runs.fsdp2_buffers.zero_fill`), when FSDP2's
collectives module is first imported (most verl processes never import it)."""

from precision_harness.runs.fsdp2_buffers import MODULE, zero_fill
from precision_harness.runs.verl_stages import on_import

on_import.when_imported(MODULE, zero_fill)
