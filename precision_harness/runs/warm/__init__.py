"""Warm workers: runs forked from a server that already imported torch, transformers and msprobe, for the built-in
runner (:mod:`precision_harness.runs.launch`) and the API replay (:mod:`precision_harness.runs.api_replay`):
:mod:`.workers` (the per-session forkserver), :mod:`.shared` and :mod:`.server` (a server every session of a job
shares), :mod:`.preload` (the forkserver's guarded preload). It names the modules it preloads and runs, and
imports none of them."""
