"""The numerics every kind's run process shares: the device and determinism settings (:mod:`.devices`: the
environment set before torch is imported, torch-free, and the run's fingerprint), the portable CPU matrix products
(:mod:`.cpu_kernels`), and the records a run writes beside its dumps: a stage's inputs and outputs at level auto
(:mod:`.stage_outputs`) and the rollout's weight syncs (:mod:`.weight_sync`). Used by the built-in runner, by verl's
processes (the CPU support, the stage window), and for their determinism settings by command runs and the API
replay; imports nothing of the kinds of run."""
