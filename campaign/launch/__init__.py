"""Placing runs: workers that claim runs from the ledger, and the executors that start them.

The ledger is the work queue; executors (local processes, Ray, SLURM through
sbatch) only decide where worker processes run.
"""
