"""A real ``mlflow server`` on loopback (SQLite backend store, artifacts in a folder), for the
mirror's test and its benchmark: started, waited for, and stopped with its process group."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tests.support.ray_cluster import random_ports


@contextlib.contextmanager
def mlflow_server(folder: Path) -> Iterator[str]:
    """The server's address while the block runs; its log is ``folder/server.log``."""
    (port,) = random_ports(1)
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
         "--artifacts-destination", str(folder / "artifacts"), "--workers", "1"],
        cwd=folder, stdout=subprocess.DEVNULL, stderr=(folder / "server.log").open("w"),
        start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise AssertionError((folder / "server.log").read_text()[-3000:])
            time.sleep(0.5)
        yield uri
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
