"""Serving metrics: Ray Serve's metrics API inside a replica, a no-op object elsewhere (tests, plain ASGI).

    lilicorr_requests_total{model,status}        requests by HTTP status ("499" = client went away)
    lilicorr_ttft_seconds{model}                 time to first token
    lilicorr_tpot_seconds{model}                 time per output token after the first
    lilicorr_accepted_tokens_per_block{model}    the request's tau
    lilicorr_running_requests / _waiting_requests{model}
"""

from __future__ import annotations

_TIME_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]
_TAU_BUCKETS = [1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0]


class NullMetrics:
    def request_done(self, model: str, status: str) -> None: ...
    def ttft(self, model: str, seconds: float) -> None: ...
    def tpot(self, model: str, seconds: float) -> None: ...
    def accepted_per_block(self, model: str, tau: float) -> None: ...
    def queue_depth(self, model: str, running: int, waiting: int) -> None: ...


NULL_METRICS = NullMetrics()


class RayServeMetrics(NullMetrics):
    """`ray.serve.metrics` instruments (exported through Ray's Prometheus endpoint with replica tags)."""

    def __init__(self):
        from ray.serve.metrics import Counter, Gauge, Histogram

        self._requests = Counter("lilicorr_requests_total", "requests by model and HTTP status",
                                 tag_keys=("model", "status"))
        self._ttft = Histogram("lilicorr_ttft_seconds", "time to first token", boundaries=_TIME_BUCKETS,
                               tag_keys=("model",))
        self._tpot = Histogram("lilicorr_tpot_seconds", "time per output token after the first",
                               boundaries=_TIME_BUCKETS, tag_keys=("model",))
        self._tau = Histogram("lilicorr_accepted_tokens_per_block", "accepted tokens per verification block",
                              boundaries=_TAU_BUCKETS, tag_keys=("model",))
        self._running = Gauge("lilicorr_running_requests", "requests generating", tag_keys=("model",))
        self._waiting = Gauge("lilicorr_waiting_requests", "requests queued, no token yet", tag_keys=("model",))

    def request_done(self, model: str, status: str) -> None:
        self._requests.inc(1, tags={"model": model, "status": status})

    def ttft(self, model: str, seconds: float) -> None:
        self._ttft.observe(seconds, tags={"model": model})

    def tpot(self, model: str, seconds: float) -> None:
        self._tpot.observe(seconds, tags={"model": model})

    def accepted_per_block(self, model: str, tau: float) -> None:
        self._tau.observe(tau, tags={"model": model})

    def queue_depth(self, model: str, running: int, waiting: int) -> None:
        self._running.set(running, tags={"model": model})
        self._waiting.set(waiting, tags={"model": model})
