"""Prometheus export of the meter (off by default; needs ``prometheus_client``, the ``metrics``
extra: ``pip install 'witcert[metrics]'``).

    from witcert.metrics import PrometheusMetrics
    m = PrometheusMetrics()                # its own CollectorRegistry (or registry=REGISTRY)
    m.serve(9100)                          # optional: /metrics over HTTP
    cache = WitCertCache(model.config, scheme="kivi2", trace=m)   # or trace=Tee(tracer, m)

Series (label ``layer`` only: per head would be layers × heads × buckets series):

* ``witcert_tv_upper{layer,tier}``       histogram of TV+ per (head, step) row after repair
                                          (tier "A"; tier "B" where Tier B is metered)
* ``witcert_rows_total{layer}``           metered rows
* ``witcert_rows_certified_total{layer}`` rows with Tier A TV+ ≤ τ (the gate's τ for a certified
                                          gate, else ``certify_tau``, default 0.1)
* ``witcert_rows_flagged_total{layer}``   rows the gate flagged (budget spent) or NaN-saturated
* ``witcert_pagein_blocks_total{layer}``, ``witcert_pagein_bytes_total{layer}``
"""

from __future__ import annotations

import numpy as np

TV_BUCKETS = (0.001, 0.003, 0.01, 0.03, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 0.99, 1.0)


class PrometheusMetrics:
    """A trace sink (``record(rec, cache)``) that updates Prometheus metrics."""

    def __init__(self, registry=None, namespace: str = "witcert", certify_tau: float = 0.1):
        try:
            import prometheus_client as P
        except ImportError as e:  # pragma: no cover - depends on the install
            raise ImportError("Prometheus export needs prometheus_client: pip install 'witcert[metrics]'") from e
        self._P = P
        self.registry = registry if registry is not None else P.CollectorRegistry()
        self.certify_tau = float(certify_tau)
        kw = dict(namespace=namespace, registry=self.registry)
        self.tv = P.Histogram("tv_upper", "TV+ bound per (head, step) row after repair", ["layer", "tier"],
                              buckets=TV_BUCKETS, **kw)
        self.rows = P.Counter("rows", "metered (head, step) rows", ["layer"], **kw)
        self.certified = P.Counter("rows_certified", "rows with Tier A TV+ <= tau", ["layer"], **kw)
        self.flagged = P.Counter("rows_flagged", "rows flagged by the gate (budget spent) or NaN-saturated", ["layer"], **kw)
        self.blocks = P.Counter("pagein_blocks", "exact KV blocks paged in", ["layer"], **kw)
        self.bytes = P.Counter("pagein_bytes", "bytes paged in (K + V)", ["layer"], **kw)
        self._last_bytes: dict = {}

    def record(self, rec, cache) -> None:
        layer = str(rec.layer)
        tv = np.asarray(rec.tv_a, dtype=float).reshape(-1)
        h = self.tv.labels(layer, "A")
        for x in tv:
            h.observe(float(x))
        if getattr(rec, "tv_b", None) is not None:
            hb = self.tv.labels(layer, "B")
            for x in np.asarray(rec.tv_b, dtype=float).reshape(-1):
                hb.observe(float(x))
        gate = getattr(cache, "gate", None)
        tau = gate.tau if gate is not None and gate.policy == "certified" else self.certify_tau
        self.rows.labels(layer).inc(tv.size)
        self.certified.labels(layer).inc(int(np.sum(tv <= tau)))
        self.flagged.labels(layer).inc(int(np.sum(np.asarray(rec.flag, dtype=bool))))
        blocks = int(np.sum(rec.pagein_blocks))
        if blocks:
            self.blocks.labels(layer).inc(blocks)
        cum = getattr(cache, "pagein_bytes", None)
        if cum is not None and np.size(cum):
            key = (id(cache), id(cache.records), rec.layer)
            now = int(np.sum(cum[rec.layer]))
            prev = self._last_bytes.get(key, 0)
            if now > prev:
                self.bytes.labels(layer).inc(now - prev)
            self._last_bytes[key] = now
            if len(self._last_bytes) > 100_000:  # bound the memory of long-running servers
                self._last_bytes.clear()

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Serve /metrics on ``port`` (a daemon thread, ``prometheus_client.start_http_server``)."""
        self._P.start_http_server(port, addr=addr, registry=self.registry)

    def text(self) -> str:
        """The metrics in the Prometheus text format."""
        return self._P.generate_latest(self.registry).decode()

    def write_textfile(self, path) -> None:
        """Write the metrics for node_exporter's textfile collector (atomic rename)."""
        self._P.write_to_textfile(str(path), self.registry)

    def value(self, name: str, **labels) -> float:
        """A sample's value (tests, dashboards): ``value("witcert_rows_total", layer="0")``."""
        v = self.registry.get_sample_value(name, labels)
        return 0.0 if v is None else float(v)
