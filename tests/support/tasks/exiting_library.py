"""A library that ends its process at import: named in tests/support/tasks/preloading_badly.py's
``PRELOAD``, it must never be imported by the task host (a probe child finds it out)."""

import os

os._exit(3)
