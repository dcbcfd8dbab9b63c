"""A real S3 protocol server on loopback: moto's server, for tests and benchmarks.

    python tests/support/s3server.py [--port 5000]     # runs until Ctrl-C; prints the endpoint

``start()`` runs one in a subprocess on a free 127.0.0.1 port and returns it with the
``storage_options`` that reach it through s3fs. Only 127.0.0.1 is ever used. The region is
not us-east-1, where moto's bucket creation fails through s3fs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any, Dict, Tuple

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "eu-west-1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def storage_options(endpoint: str) -> Dict[str, Any]:
    return {"key": "testing", "secret": "testing",
            "client_kwargs": {"endpoint_url": endpoint, "region_name": "eu-west-1"}}


def start(timeout: float = 30.0) -> Tuple[subprocess.Popen, str]:
    """(server process, endpoint URL); end it with ``stop(proc)``."""
    port = free_port()
    env = dict(os.environ, **CREDENTIALS)
    # the server logs every request: to a file, never to a pipe nobody reads (a full pipe blocks it)
    log = tempfile.NamedTemporaryFile(prefix="moto-", suffix=".log", delete=False)
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    proc.log_path = log.name  # type: ignore[attr-defined]
    log.close()
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.time() + timeout
    while True:
        try:
            urllib.request.urlopen(endpoint + "/moto-api/", timeout=1).read()
            return proc, endpoint
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                with open(proc.log_path, errors="replace") as f:  # type: ignore[attr-defined]
                    raise RuntimeError(f"moto's S3 server did not start: {f.read()[-500:]}") from None
            time.sleep(0.1)


def end(proc: subprocess.Popen) -> None:
    """End a process this script's caller started (by its own Popen: its PID only)."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def stop(proc: subprocess.Popen) -> None:
    end(proc)
    with contextlib.suppress(OSError):
        os.unlink(proc.log_path)  # type: ignore[attr-defined]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.parse_args()
    proc, endpoint = start()
    print(f"S3 at {endpoint}; use --storage-option client_kwargs.endpoint_url={endpoint} with "
          "AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing", flush=True)
    try:
        proc.wait()
    except KeyboardInterrupt:
        stop(proc)


if __name__ == "__main__":
    main()
