"""Start and stop the Serve app from Python: used by jobs/serve.py, the load benchmark and the tests.

A private local Ray instance on 127.0.0.1 unless `address` names a cluster (RAY_ADDRESS); Serve's HTTP
proxy binds `host` (127.0.0.1 unless told otherwise).
"""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from typing import Optional

from .loading import ServeSpec

APP_NAME = "lilicorr"
_started_ray = False  # stop_serve shuts Ray down only when start_serve started it


def free_port() -> int:
    """A port nothing listens on now, on the loopback address (the bench and the tests' servers)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_serve(spec: ServeSpec, host: str = "127.0.0.1", port: int = 8000, address: Optional[str] = None,
                num_replicas: int = 1, num_gpus: float = 0.0) -> str:
    """Start Ray (if needed), Serve and the app; block until /health answers 200. Returns the base URL."""
    import ray
    from ray import serve

    from .deployment import application

    global _started_ray
    if not ray.is_initialized():
        _started_ray = True
        if address:
            ray.init(address=address)
        else:
            ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    serve.start(http_options={"host": host, "port": port})
    serve.run(application(spec, num_replicas=num_replicas, num_gpus=num_gpus), name=APP_NAME, route_prefix="/")
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
    wait_healthy(url)
    return url


def wait_healthy(url: str, timeout_s: float = 120.0) -> dict:
    deadline, last = time.time() + timeout_s, None
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                return json.loads(r.read())
        except Exception as e:  # not up yet
            last = e
            time.sleep(0.5)
    raise TimeoutError(f"{url}/health did not answer 200 within {timeout_s:.0f}s (last: {last})")


def stop_serve() -> None:
    """Shut Serve down, and Ray too when start_serve started it (a caller's own Ray instance stays up)."""
    global _started_ray
    import ray
    from ray import serve

    serve.shutdown()
    if _started_ray:
        ray.shutdown()
        _started_ray = False
