"""A module whose state a test changes in its own process: a fresh process must not see it."""

COUNTER = 0
