"""The replay: one API call msprobe captured (``task: tensor``), recomputed on the CPU in float64 and in its
output's own dtype, in a worker process of its own (``python -m precision_harness.runs.api_replay``).

:mod:`.names` (torch-free) says from an API's name whether it can be replayed at all; the worker
(:mod:`.__main__`, :mod:`.replay`, :mod:`.figures`) imports torch and msprobe; everything it takes
from msprobe's internals is in :mod:`.msprobe_acc`, behind its version guard. The judgement over
the figures the worker returns is :mod:`precision_harness.check.verdicts.judgement`.
"""
