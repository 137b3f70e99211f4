"""Scenarios: the YAML model, its three kinds, and a scenario's identity."""
