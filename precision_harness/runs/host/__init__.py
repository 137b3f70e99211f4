"""The host a run runs on, read torch-free by every kind of run: the machine (CPU, ISA flags), the software and
accelerator stack and each rank's record of it, the installed distributions' versions and msprobe's floor, and
whether a device is usable here. Imports nothing of the kinds of run."""
