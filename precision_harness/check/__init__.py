"""Check: one (target, golden) pair compared item by item, with tolerance, invariants and localisation."""
