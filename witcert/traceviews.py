"""The ``witcert trace`` views of a read trace: ``summarize``, ``top``, ``compare`` (dataclass
results) and their text tables (``format_*``). Plots are in ``witcert.traceplot``.

* ``summarize``: per group (default: layer; any int / str field, or several) the quantiles of a
  bound (default ``tv``, Tier A TV+ after repair), the coverage at τ (share of rows with the bound
  ≤ τ), flagged / saturated rows and page-ins; and the worst (request, step, layer) cells.
* ``top``: the k riskiest rows (request, step, layer, head) by a field.
* ``compare``: two traces (two schemes, gated vs ungated, two runs) side by side per group.

Page-in blocks and bytes are per (request, sequence, step, layer, kv head), repeated on the kv
head's query heads; totals count each once.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .trace import FIELD_BY_NAME, Trace

QUANTILES = (0.5, 0.9, 0.99)


class ViewError(ValueError):
    """A view that cannot be computed (no rows, unknown field)."""


@dataclasses.dataclass(frozen=True)
class GroupStats:
    key: tuple
    rows: int  # rows in the group
    n: int  # rows with a finite value of the field
    p50: float
    p90: float
    p99: float
    max: float
    mean: float
    coverage: tuple  # share of rows with value <= tau, one per tau
    flagged: int  # budget_spent or nan
    saturated: int
    pagein_blocks: int
    pagein_bytes: int


@dataclasses.dataclass(frozen=True)
class WorstStep:
    req: str
    seq: int
    step: int
    layer: int
    head: int  # the head with the largest value
    value: float
    config: str


@dataclasses.dataclass(frozen=True)
class TraceSummary:
    field: str
    by: tuple
    taus: tuple
    requests: int
    configs: tuple
    overall: GroupStats
    groups: tuple
    worst: tuple


@dataclasses.dataclass(frozen=True)
class TopRow:
    req: str
    seq: int
    step: int
    layer: int
    head: int
    config: str
    value: float
    tv: float
    tv_pre: float
    blocks: int


@dataclasses.dataclass(frozen=True)
class CompareRow:
    key: tuple
    a: GroupStats | None
    b: GroupStats | None


@dataclasses.dataclass(frozen=True)
class Comparison:
    field: str
    by: tuple
    taus: tuple
    label_a: str
    label_b: str
    overall_a: GroupStats
    overall_b: GroupStats
    rows: tuple


def _check_field(field: str, numeric: bool = True):
    f = FIELD_BY_NAME.get(field)
    if f is None:
        raise ViewError(f"unknown field {field!r}; fields: {', '.join(FIELD_BY_NAME)}")
    if numeric and f.kind not in ("float", "int"):
        raise ViewError(f"field {field!r} is not numeric")


def _check_by(by) -> tuple:
    by = (by,) if isinstance(by, str) else tuple(by)
    for b in by:
        if b == "config":
            continue
        f = FIELD_BY_NAME.get(b)
        if f is None or f.kind not in ("int", "str"):
            raise ViewError(f"cannot group by {b!r}: expected 'config' or an int / str field "
                            f"({', '.join(x.name for x in FIELD_BY_NAME.values() if x.kind in ('int', 'str'))})")
    return by


def _col(trace: Trace, name: str) -> np.ndarray:
    return trace.config_labels() if name == "config" else trace[name]


def _pagein(trace: Trace, mask: np.ndarray) -> tuple[int, int]:
    c = trace.columns
    idx = np.nonzero(mask)[0]
    seen, blocks, nbytes = set(), 0, 0
    for i in idx:
        if c["blocks"][i] == 0:
            continue
        k = (c["req"][i], c["seq"][i], c["step"][i], c["layer"][i], c["kv_head"][i])
        if k not in seen:
            seen.add(k)
            blocks += int(c["blocks"][i])
            nbytes += int(c["bytes"][i])
    return blocks, nbytes


def group_stats(trace: Trace, mask: np.ndarray, key: tuple, field: str, taus) -> GroupStats:
    v = trace[field][mask].astype(float)
    fin = v[np.isfinite(v)]
    q = np.quantile(fin, QUANTILES) if fin.size else [np.nan] * len(QUANTILES)
    cov = tuple(float(np.mean(fin <= t)) if fin.size else float("nan") for t in taus)
    flagged = int(np.sum((trace["budget_spent"] | trace["nan"])[mask]))
    blocks, nbytes = _pagein(trace, mask)
    return GroupStats(key=key, rows=int(mask.sum()), n=int(fin.size), p50=float(q[0]), p90=float(q[1]), p99=float(q[2]),
                      max=float(fin.max()) if fin.size else float("nan"), mean=float(fin.mean()) if fin.size else float("nan"),
                      coverage=cov, flagged=flagged, saturated=int(trace["saturated"][mask].sum()),
                      pagein_blocks=blocks, pagein_bytes=nbytes)


def _sortkey(k: tuple) -> tuple:
    return tuple((0, x) if isinstance(x, (int, float)) else (1, str(x)) for x in k)


def _groups(trace: Trace, by: tuple) -> list[tuple[tuple, np.ndarray]]:
    """(key, row mask) per distinct value of the ``by`` columns, keys sorted."""
    if len(trace) == 0:
        return []
    cols = [_col(trace, b) for b in by]
    inv = np.stack([np.unique(c.astype(str) if c.dtype == object else c, return_inverse=True)[1].reshape(-1)
                    for c in cols])
    _, first, code = np.unique(inv, axis=1, return_index=True, return_inverse=True)
    code = code.reshape(-1)
    out = []
    for g, i in enumerate(first):
        key = tuple(c[i].item() if hasattr(c[i], "item") else c[i] for c in cols)
        out.append((key, code == g))
    return sorted(out, key=lambda km: _sortkey(km[0]))


def _nonempty(trace: Trace, what: str):
    if len(trace) == 0:
        raise ViewError(f"{what}: no rows (empty trace, or nothing matches --where)")


def summarize(trace: Trace, by=("layer",), field: str = "tv", taus=(0.1, 0.5), worst: int = 5) -> TraceSummary:
    _check_field(field)
    by = _check_by(by)
    _nonempty(trace, "summary")
    all_mask = np.ones(len(trace), dtype=bool)
    groups = tuple(group_stats(trace, m, k, field, taus) for k, m in _groups(trace, by))
    # worst (request, seq, step, layer) cells: the largest value over heads
    c = trace.columns
    v = trace[field].astype(float)
    cfg = trace.config_labels()
    best: dict = {}
    for i in np.nonzero(np.isfinite(v))[0]:
        k = (c["req"][i], int(c["seq"][i]), int(c["step"][i]), int(c["layer"][i]))
        if k not in best or v[i] > v[best[k]]:
            best[k] = i
    order = sorted(best.items(), key=lambda kv: (-v[kv[1]], kv[0][2], kv[0][3]))[:worst]
    ws = tuple(WorstStep(req=str(k[0]), seq=k[1], step=k[2], layer=k[3], head=int(c["head"][i]), value=float(v[i]),
                         config=str(cfg[i])) for k, i in order)
    return TraceSummary(field=field, by=by, taus=tuple(taus), requests=len(set(zip(c["req"].tolist(), c["seq"].tolist()))),
                        configs=tuple(trace.configs()), overall=group_stats(trace, all_mask, ("all",), field, taus),
                        groups=groups, worst=ws)


def top(trace: Trace, k: int = 10, field: str = "tv") -> list[TopRow]:
    _check_field(field)
    _nonempty(trace, "top")
    c = trace.columns
    v = trace[field].astype(float)
    cfg = trace.config_labels()
    idx = np.nonzero(np.isfinite(v))[0]
    order = sorted(idx, key=lambda i: (-v[i], c["step"][i], c["layer"][i], c["head"][i]))[:k]
    return [TopRow(req=str(c["req"][i]), seq=int(c["seq"][i]), step=int(c["step"][i]), layer=int(c["layer"][i]),
                   head=int(c["head"][i]), config=str(cfg[i]), value=float(v[i]), tv=float(c["tv"][i]),
                   tv_pre=float(c["tv_pre"][i]), blocks=int(c["blocks"][i])) for i in order]


def compare(a: Trace, b: Trace, by=("layer",), field: str = "tv", taus=(0.1, 0.5), labels=("A", "B")) -> Comparison:
    _check_field(field)
    by = _check_by(by)
    _nonempty(a, f"compare ({labels[0]})")
    _nonempty(b, f"compare ({labels[1]})")
    ga = {k: group_stats(a, m, k, field, taus) for k, m in _groups(a, by)}
    gb = {k: group_stats(b, m, k, field, taus) for k, m in _groups(b, by)}
    keys = sorted(set(ga) | set(gb), key=_sortkey)
    return Comparison(field=field, by=by, taus=tuple(taus), label_a=labels[0], label_b=labels[1],
                      overall_a=group_stats(a, np.ones(len(a), bool), ("all",), field, taus),
                      overall_b=group_stats(b, np.ones(len(b), bool), ("all",), field, taus),
                      rows=tuple(CompareRow(k, ga.get(k), gb.get(k)) for k in keys))


# --------------------------------------------------------------------------- text
def _key(k: tuple) -> str:
    return ",".join(str(x) for x in k)


def _stats_cells(g: GroupStats | None, taus) -> str:
    if g is None:
        return f"{'-':>7}{'-':>7}{'-':>7}{'-':>7}" + "".join(f"{'-':>8}" for _ in taus)
    f = lambda x: f"{x:>7.3f}" if np.isfinite(x) else f"{'-':>7}"  # noqa: E731
    return f(g.p50) + f(g.p90) + f(g.p99) + f(g.max) + "".join(
        f"{c:>8.3f}" if np.isfinite(c) else f"{'-':>8}" for c in g.coverage)


def format_summary(s: TraceSummary) -> str:
    byname = ",".join(s.by)
    head = f"{byname:<12}{'rows':>7}{'p50':>7}{'p90':>7}{'p99':>7}{'max':>7}" + "".join(f"{'cov@' + format(t, 'g'):>8}" for t in s.taus)
    head += f"{'flag':>6}{'sat':>6}{'pg blk':>8}{'pg MB':>8}"
    lines = [f"trace summary of {s.field}: {s.overall.rows} rows, {s.requests} request(s), configs: {', '.join(s.configs)}",
             head]
    for g in (*s.groups, s.overall):
        lines.append(f"{_key(g.key):<12}{g.rows:>7}" + _stats_cells(g, s.taus)
                     + f"{g.flagged:>6}{g.saturated:>6}{g.pagein_blocks:>8}{g.pagein_bytes / 1e6:>8.3f}")
    if s.worst:
        lines.append(f"worst (request, step, layer) by {s.field}:")
        for w in s.worst:
            lines.append(f"  {w.value:.4f}  req {w.req} [{w.config}] seq {w.seq} step {w.step} layer {w.layer} head {w.head}")
    return "\n".join(lines)


def format_top(rows: list[TopRow], field: str) -> str:
    lines = [f"{field:>9}{'tv':>8}{'tv_pre':>8}{'blk':>5}  {'config':<18}{'req':<14}{'seq':>4}{'step':>5}{'layer':>6}{'head':>5}"]
    for r in rows:
        lines.append(f"{r.value:>9.4f}{r.tv:>8.4f}{r.tv_pre:>8.4f}{r.blocks:>5}  {r.config:<18}{r.req:<14}"
                     f"{r.seq:>4}{r.step:>5}{r.layer:>6}{r.head:>5}")
    return "\n".join(lines)


def format_compare(c: Comparison) -> str:
    byname = ",".join(c.by)
    cols = f"{'p50':>7}{'p90':>7}{'p99':>7}{'max':>7}" + "".join(f"{'cov@' + format(t, 'g'):>8}" for t in c.taus)
    w = len(cols)
    lines = [f"compare {c.field}: A = {c.label_a}, B = {c.label_b}",
             f"{'':<12}{'A':^{w}}  {'B':^{w}}{'Δp90':>8}{'Δmax':>8}",
             f"{byname:<12}{cols}  {cols}{'(B-A)':>8}{'(B-A)':>8}"]
    for r in (*c.rows, CompareRow(("all",), c.overall_a, c.overall_b)):
        d90 = f"{r.b.p90 - r.a.p90:>+8.3f}" if r.a and r.b else f"{'-':>8}"
        dmx = f"{r.b.max - r.a.max:>+8.3f}" if r.a and r.b else f"{'-':>8}"
        lines.append(f"{_key(r.key):<12}{_stats_cells(r.a, c.taus)}  {_stats_cells(r.b, c.taus)}{d90}{dmx}")
    lines.append(f"page-ins: A {c.overall_a.pagein_blocks} blocks / {c.overall_a.pagein_bytes / 1e6:.3f} MB; "
                 f"B {c.overall_b.pagein_blocks} blocks / {c.overall_b.pagein_bytes / 1e6:.3f} MB; "
                 f"flagged rows: A {c.overall_a.flagged}, B {c.overall_b.flagged}")
    return "\n".join(lines)
