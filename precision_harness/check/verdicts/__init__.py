"""Verdicts: the one compare path item by item into outcomes (items), what a verdict prints, and the judgement an
outcome holds of an API that computes differently."""
