"""Tolerance: how far a statistic may move (the policy), how far it moves by itself (calibration), and the checks that
need no golden (invariants over a run's files, training against rollout consistency).
Imports no other room of check/."""
