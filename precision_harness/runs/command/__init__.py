"""Command runs: any process that writes verl's dump layout under ``$PRECISION_DUMP_DIR`` (:mod:`.run`); a verl
scenario is run as one (:mod:`precision_harness.runs.verl.engine`)."""
