"""The task host: at most one interpreter per process that runs task code or places runs.

Every command, ``campaign worker``, SLURM array task or Ray worker task that needs
torch spawns at most one host (:mod:`campaign.host.host_process`): it imports torch,
the loop and a task's declared preloads once (:mod:`campaign.host.preloads`),
never initialises CUDA and never computes, and forks every child that runs task
code: the run, the guarded plan/inspect/order calls, the pilot's fresh-process
checks and the replay of a final artifact (:mod:`campaign.host.calls`). The process that asks
(:mod:`campaign.host.client`) imports no torch. The host ignores the
scheduler's signals (SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2): only the
supervisor decides what a signal means for a run. It dies with its owner, and
its children die with it. A local launch's workers join their launcher's host
(``CAMPAIGN_SHARED_HOST``) instead of spawning their own: it serves them until the
last one goes, and a worker's children die with that worker.
"""
