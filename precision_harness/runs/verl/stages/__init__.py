"""What the gate runs inside verl's processes on every device (``cpu``, ``cuda``, ``npu``): none of it needs the
CPU platform of :mod:`precision_harness.runs.verl.cpu`.

- :mod:`.extension`: the module verl imports in each of its processes (``VERL_USE_EXTERNAL_MODULES``, set by
  :func:`precision_harness.runs.verl.engine.external_modules` on the CPU and, at ``level: auto``, on a device);
  it refuses a verl other than :data:`precision_harness.runs.verl.release.SUPPORTED_VERSIONS` in one line and
  applies :mod:`.debugger`;
- :mod:`.debugger`: the one module that patches verl's precision debugger (its stage wrapper, and msprobe's
  own time), behind that version guard;
- :mod:`.stage_window`: one profiled stage on one rank: its clock, and at ``level: auto`` what it read from
  verl's batch and returned (``stage_outputs.json``);
- :mod:`.timeline`: the run's timeline file, for the start-up profile;
- :mod:`.on_import`: a function run on a module when it is first imported (deferred patches).

Importing this package itself does nothing; :mod:`.stage_window` imports torch, and the gate's own process
never imports it.
"""
