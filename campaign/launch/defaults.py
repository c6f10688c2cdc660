"""The launcher's choices and the worker's timing defaults, in a module with no imports so the
command line's help can show them without loading the launcher."""

DEFAULT_HEARTBEAT_S = 30.0
DEFAULT_LEASE_S = 120.0
EXECUTORS = ("local", "ray", "slurm")
