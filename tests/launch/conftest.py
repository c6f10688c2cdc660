"""Fixtures the launch tests share: a real two-node Ray cluster (tests/support/ray_cluster.py)."""

from tests.support.ray_cluster import ray_cluster  # noqa: F401 - a fixture, found by name
