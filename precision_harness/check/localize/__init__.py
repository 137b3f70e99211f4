"""Localisation of a failing stage: where its change entered, and msprobe's own analyses of it (the window around the
first divergence, the compare table, first diff and graph, the worker process they run in, the releases they know)."""
