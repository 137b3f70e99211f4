"""Runs: starting one scenario run (a worker, a command, verl's trainer, Ray) and what runs inside it."""
