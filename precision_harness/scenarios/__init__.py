"""Scenarios: what a scenario is, data plus validation: the YAML model, its three kinds, its identity.

How a scenario runs is :mod:`precision_harness.runs.kind_runners`; nothing here imports runs/ or check/.
"""
