"""The fault the exact-resume tests inject: a real SIGTERM to the run's own process, once."""

from __future__ import annotations

import os
import signal
from typing import Any


def sigterm_once(options: dict[str, Any], calls: int, training: bool) -> None:
    """With ``task.fault = "sigterm"``: at the ``task.at``-th training loss (``calls``), SIGTERM
    this process unless ``task.marker`` exists, and create it (the resumed process runs on)."""
    marker = options.get("marker")
    if (options.get("fault") == "sigterm" and training and marker
            and calls >= int(options.get("at", 3)) and not os.path.exists(marker)):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGTERM)
