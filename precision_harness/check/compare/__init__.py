"""The compare: a stage's ranks and a run's metrics.jsonl against the golden's, into typed verdicts (ranks side by side,
the tolerance ratios as tables, the drifts kept and their profile, changed code paths, FSDP2's unfilled rows)."""
