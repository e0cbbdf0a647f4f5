"""Wait for a server this machine just started to answer over HTTP (the screenshot's TensorBoard, the tests' MLflow)."""

from __future__ import annotations

import subprocess
import time
import urllib.request


def answers(url: str, process: subprocess.Popen, timeout_s: float, poll_s: float = 0.25) -> bool:
    """True once `url` answers 200; False when `process` (the server) exits first or `timeout_s` passes. A server
    still starting refuses connections (OSError), so each refusal waits `poll_s` and asks again."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return True
        except OSError:
            time.sleep(poll_s)
    return False
