"""Prometheus export of the meter (off by default; needs ``prometheus_client``, the ``metrics``
extra: ``pip install 'witcert[metrics]'``).

    from witcert.metrics import PrometheusMetrics
    m = PrometheusMetrics()                # its own CollectorRegistry (or registry=REGISTRY)
    m.serve(9100)                          # optional: /metrics over HTTP
    cache = WitCertCache(model.config, scheme="kivi2", trace=m)   # or trace=Tee(tracer, m)

Series, each labelled ``layer``, ``scheme`` (the cache's KV scheme) and ``model`` (``model=`` of
the constructor, else the cache config's ``name_or_path`` or ``model_type``); not per head, which
would be layers × heads × buckets series:

* ``witcert_tv_upper{layer,scheme,model,tier}``  histogram of TV+ per (head, step) row after
                                          repair (tier "A"; tier "B" where Tier B is metered)
* ``witcert_rows_total{...}``             metered rows
* ``witcert_rows_certified_total{...}``   rows with Tier A TV+ ≤ τ (the gate's τ for a certified
                                          gate, else ``certify_tau``, default 0.1)
* ``witcert_rows_flagged_total{...}``     rows the gate flagged (budget spent) or NaN-saturated
* ``witcert_pagein_blocks_total{...}``, ``witcert_pagein_bytes_total{...}``
"""

from __future__ import annotations

import numpy as np

TV_BUCKETS = (0.001, 0.003, 0.01, 0.03, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 0.99, 1.0)


class PrometheusMetrics:
    """A trace sink (``record(rec, cache)``) that updates Prometheus metrics."""

    LABELS = ("layer", "scheme", "model")

    def __init__(self, registry=None, namespace: str = "witcert", certify_tau: float = 0.1, model: str | None = None):
        try:
            import prometheus_client as P
        except ImportError as e:  # pragma: no cover - depends on the install
            raise ImportError("Prometheus export needs prometheus_client: pip install 'witcert[metrics]'") from e
        self._P = P
        self.registry = registry if registry is not None else P.CollectorRegistry()
        self.certify_tau = float(certify_tau)
        if model is not None and not isinstance(model, str):
            raise ValueError(f"model: expected a label string or None, got {type(model).__name__}")
        self.model = model
        kw = dict(namespace=namespace, registry=self.registry)
        lab = list(self.LABELS)
        self.tv = P.Histogram("tv_upper", "TV+ bound per (head, step) row after repair", lab + ["tier"],
                              buckets=TV_BUCKETS, **kw)
        self.rows = P.Counter("rows", "metered (head, step) rows", lab, **kw)
        self.certified = P.Counter("rows_certified", "rows with Tier A TV+ <= tau", lab, **kw)
        self.flagged = P.Counter("rows_flagged", "rows flagged by the gate (budget spent) or NaN-saturated", lab, **kw)
        self.blocks = P.Counter("pagein_blocks", "exact KV blocks paged in", lab, **kw)
        self.bytes = P.Counter("pagein_bytes", "bytes paged in (K + V)", lab, **kw)
        self._last_bytes: dict = {}

    def _model_label(self, cache) -> str:
        if self.model is not None:
            return self.model
        cfg = getattr(cache, "config", None)
        name = getattr(cfg, "name_or_path", None) or getattr(cfg, "_name_or_path", None) or getattr(cfg, "model_type", None)
        return str(name) if name else "unknown"

    def record(self, rec, cache) -> None:
        labels = (str(rec.layer), str(getattr(cache, "scheme", "") or "unknown"), self._model_label(cache))
        tv = np.asarray(rec.tv_a, dtype=float).reshape(-1)
        h = self.tv.labels(*labels, "A")
        for x in tv:
            h.observe(float(x))
        if getattr(rec, "tv_b", None) is not None:
            hb = self.tv.labels(*labels, "B")
            for x in np.asarray(rec.tv_b, dtype=float).reshape(-1):
                hb.observe(float(x))
        gate = getattr(cache, "gate", None)
        tau = gate.tau if gate is not None and gate.policy == "certified" else self.certify_tau
        self.rows.labels(*labels).inc(tv.size)
        self.certified.labels(*labels).inc(int(np.sum(tv <= tau)))
        self.flagged.labels(*labels).inc(int(np.sum(np.asarray(rec.flag, dtype=bool))))
        blocks = int(np.sum(rec.pagein_blocks))
        if blocks:
            self.blocks.labels(*labels).inc(blocks)
        cum = getattr(cache, "pagein_bytes", None)
        if cum is not None and np.size(cum):
            key = (id(cache), id(cache.records), rec.layer)
            now = int(np.sum(cum[rec.layer]))
            prev = self._last_bytes.get(key, 0)
            if now > prev:
                self.bytes.labels(*labels).inc(now - prev)
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
        """The sum of the samples ``name`` whose labels include ``labels`` (tests, dashboards):
        ``value("witcert_rows_total", layer="0")`` sums over schemes and models; 0 if none."""
        total = 0.0
        for metric in self.registry.collect():
            for s in metric.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    total += float(s.value)
        return total
