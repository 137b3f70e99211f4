"""verl scenarios (``engine: verl``): verl's own trainer behind the gate.

- :mod:`.engine`: the overrides the gate owns, rollout pinning, Hydra's compose, the extension hook's variables;
- :mod:`.profile`: a run's start-up profile; :mod:`.shared_ray`, :mod:`.ray_head`: the Ray instance the verl runs
  of a gate process share on cpu, and its watcher;
- imported by verl itself in each of its processes (``VERL_USE_EXTERNAL_MODULES``): :mod:`.rank_stack` (each rank's
  stack), :mod:`.fsdp2_fill` (FSDP2's all-gather buffers zero-filled, :mod:`.fsdp2_buffers`), :mod:`.stages` (the
  stage window, every device) and :mod:`.cpu` (the CPU platform).

Importing this package itself does nothing: its modules are what verl or the gate imports."""
