"""Reruns on a failing stage's outcome: ``level: auto``'s localisation at L1 (the scenario rerun to that step) and the
replay of the API where the change entered (captured, replayed in float64, judged)."""
