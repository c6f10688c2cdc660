"""The launcher's choices, the worker's timing defaults and what a run's task host imports, in a
module with no imports: the command line's help shows them, and a command starts its task host
with ``RUN_PRELOAD`` before it loads the launcher (SQLAlchemy alone is a third of a second)."""

DEFAULT_HEARTBEAT_S = 30.0
DEFAULT_LEASE_S = 120.0
EXECUTORS = ("local", "ray", "slurm")
# What a run's process imports (torch._dynamo: the first optimizer a process builds imports it,
# over a second): once per task host, before its first run, never again per run.
RUN_PRELOAD = ("torch._dynamo", "numpy", "pandas", "pyarrow.parquet", "safetensors.torch",
               "campaign.loop.train", "campaign.loop.replay", "campaign.launch.run_body",
               "campaign.launch.run_process",
               # imported lazily by a run's first predictions file, weights file and profiled
               # phase: about 6 ms in every run's process otherwise
               "pyarrow.pandas_compat", "pyarrow.vendored.version",
               "pandas.core.arrays.arrow.extension_types", "numpy.ctypeslib",
               "torch.profiler._cupti_monitor")
