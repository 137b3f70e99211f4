"""Check: one (target, golden) pair compared item by item, by phase (each imports only the phases below it):
rerun/ -> verdicts/ -> localize/ -> compare/ -> the modules here, which every phase shares -> tolerance/."""
