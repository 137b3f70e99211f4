"""pytest-precision's engine, importable without pytest.

The public stage API for training loops of your own is :func:`stage` (``precision_harness.stage``):
it dumps one verl stage in verl's layout when the gate runs the loop as a command scenario, and does
nothing otherwise. Importing this package imports neither torch nor msprobe.
"""

from precision_harness.runs.stage_api import StageError, stage

__all__ = ["StageError", "stage"]
