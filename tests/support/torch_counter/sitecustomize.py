"""An interpreter-start hook for the torch-import count (tests/host/test_torch_imports.py): on this
interpreter's first import of torch, its pid is appended to $CAMPAIGN_TEST_TORCH_LOG. A forked
child inherits torch already imported and writes nothing: the lines count interpreters."""

import importlib.abc
import os
import sys


class _FirstTorchImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            sys.meta_path.remove(self)
            with open(os.environ["CAMPAIGN_TEST_TORCH_LOG"], "a") as log:
                log.write(f"{os.getpid()}\n")
        return None


if os.environ.get("CAMPAIGN_TEST_TORCH_LOG"):
    sys.meta_path.insert(0, _FirstTorchImport())
