"""Runs: starting one scenario run as its kind runs (a worker, a command, verl's trainer, Ray), and what runs in it."""
