"""The verl dump layout, read without torch: what a run writes and a golden keeps.

``files``: parsing of ``dump.json``, ``stage_outputs.json`` and ``metrics.jsonl``, and rank digests;
``rows``: the one walk over a dump's tensor entries and msprobe's rows, their statistics;
``statistics``: msprobe's four statistic names and the relative change of one;
``stage``: one ``step_<n>/<stage>`` of a run or of a golden, declared as
:class:`~precision_harness.dumps.stage.StageSource`.
"""
