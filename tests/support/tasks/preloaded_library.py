"""Stands for a library a user's task imports (scikit-learn, say): named in
tests/support/tasks/preloading.py's ``PRELOAD``, so the task host imports it once before it
forks."""
