"""Imported by the warm forkserver as its preload: :func:`precision_harness.runs.warm.workers.preload` (why it is
guarded)."""

from precision_harness.runs.warm import workers as warm

warm.preload()
