"""Imported by the warm forkserver as its preload: :func:`precision_harness.runs.warm.preload` (why it is guarded)."""

from precision_harness.runs import warm

warm.preload()
