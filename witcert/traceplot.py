"""Plots of a trace (``witcert trace plot``, and the demo's figures).

* ``risk_heatmap.png``  layer × query head, the largest bound over steps; one panel per scheme,
  ungated (top row) and gated (bottom row) side by side, one shared colour scale;
* ``risk_steps.png``    per config, the largest and the median bound over (layer, head) per step;
* ``risk_coverage.png`` coverage (share of rows with bound ≤ τ) against τ: TV+ (Tier A, solid),
  Tier B (dash-dot) and the realised TV of an audit (dotted), ungated and gated panels;
* ``pageins.png``       cumulative bytes paged in over the steps, per gated config.

Every legend sits outside the axes and the figures are saved with a tight bounding box, so no
label is clipped and no curve is covered.
"""

from __future__ import annotations

import logging
import pathlib

import numpy as np

from .trace import Trace

log = logging.getLogger(__name__)
KINDS = ("heatmap", "steps", "coverage", "pageins")
FILES = {"heatmap": "risk_heatmap.png", "steps": "risk_steps.png", "coverage": "risk_coverage.png", "pageins": "pageins.png"}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _colors(configs):
    import matplotlib

    schemes = list(dict.fromkeys(c.replace(" +gate", "") for c in configs))
    cmap = matplotlib.colormaps["tab10"]
    return {s: cmap(i % 10) for i, s in enumerate(schemes)}


def _integer_x(ax):
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def plot(trace: Trace, out_dir, kinds=KINDS, field: str = "tv") -> list[pathlib.Path]:
    """Write the requested plots under ``out_dir`` (created); returns the files written."""
    from .traceviews import ViewError, _check_field

    _check_field(field)  # a numeric schema field (ViewError otherwise)
    if len(trace) == 0:  # a ViewError (a ValueError): the CLI's one error line, nothing created
        raise ViewError("plot: no rows (empty trace, or nothing matches --where)")
    bad = [k for k in kinds if k not in FILES]
    if bad:
        raise ViewError(f"plot: unknown kind(s) {', '.join(map(repr, bad))}; kinds: {', '.join(KINDS)}")
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fns = {"heatmap": plot_heatmap, "steps": plot_steps, "coverage": plot_coverage, "pageins": plot_pageins}
    written = []
    for k in kinds:
        p = out / FILES[k]
        fns[k](trace, p, field=field)
        written.append(p)
        log.info("trace plot: wrote %s", p)
    return written


def plot_heatmap(trace: Trace, path, field: str = "tv"):
    plt = _plt()
    from matplotlib.ticker import MaxNLocator

    cfg = trace.config_labels()
    configs = trace.configs()
    schemes = list(dict.fromkeys(c.replace(" +gate", "") for c in configs))
    gated = any(c.endswith(" +gate") for c in configs)
    rows = 2 if gated and any(not c.endswith(" +gate") for c in configs) else 1
    L = int(trace["layer"].max()) + 1
    H = int(trace["head"].max()) + 1
    fig, axes = plt.subplots(rows, len(schemes), figsize=(2.6 * len(schemes) + 1.2, 4.6 * rows), squeeze=False,
                             sharey=True, constrained_layout=True)
    v = trace[field].astype(float)
    im = None
    for j, s in enumerate(schemes):
        for i in range(rows):
            if rows == 2:
                name = s if i == 0 else s + " +gate"
            else:
                name = s if s in configs else s + " +gate"
            ax = axes[i, j]
            m = cfg == name
            if not m.any():
                ax.set_axis_off()
                continue
            grid = np.full((L, H), np.nan)
            for lay, h, x in zip(trace["layer"][m], trace["head"][m], v[m]):
                if np.isfinite(x):
                    grid[lay, h] = x if np.isnan(grid[lay, h]) else max(grid[lay, h], x)
            im = ax.imshow(grid, aspect="auto", vmin=0, vmax=1, cmap="magma", origin="lower", interpolation="nearest")
            ax.set_title(name, fontsize=9)
            ax.set_xlabel("query head")
            ax.set_xticks(range(0, H, max(1, H // 9)))
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            if j == 0:
                ax.set_ylabel("layer")
    if im is not None:
        fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8, label=f"max {field} over steps")
    fig.suptitle(f"{field} per (layer, head): ungated" + (" (top) and gated (bottom)" if rows == 2 else ""), fontsize=10)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def plot_steps(trace: Trace, path, field: str = "tv"):
    plt = _plt()
    cfg = trace.config_labels()
    colors = _colors(trace.configs())
    v = trace[field].astype(float)
    fig, ax = plt.subplots(figsize=(7.5, 4.2), constrained_layout=True)
    for name in trace.configs():
        m = (cfg == name) & np.isfinite(v)
        steps = np.unique(trace["step"][m])
        if steps.size == 0:
            continue
        mx = [v[m & (trace["step"] == s)].max() for s in steps]
        md = [np.median(v[m & (trace["step"] == s)]) for s in steps]
        ls = "--" if name.endswith(" +gate") else "-"
        c = colors[name.replace(" +gate", "")]
        ax.plot(steps, mx, ls, color=c, marker="o", ms=3, label=f"{name} max")
        ax.plot(steps, md, ls, color=c, alpha=0.45, label=f"{name} median")
    ax.set_xlabel("decode step")
    _integer_x(ax)
    ax.set_ylabel(f"{field} over (layer, head)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def plot_coverage(trace: Trace, path, field: str = "tv"):
    plt = _plt()
    cfg = trace.config_labels()
    configs = trace.configs()
    colors = _colors(configs)
    panels = [("ungated", [c for c in configs if not c.endswith(" +gate")]),
              ("gated (after repair)", [c for c in configs if c.endswith(" +gate")])]
    panels = [p for p in panels if p[1]]
    taus = np.linspace(0, 1, 201)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels) + 1.5, 4.4), squeeze=False, sharey=True,
                             constrained_layout=True)
    handles = {}
    for ax, (title, names) in zip(axes[0], panels):
        for name in names:
            m = cfg == name
            c = colors[name.replace(" +gate", "")]
            curves = ((field, "-", f"TV+ ({field})"), ("tv_b", "-.", "Tier B TV+"), ("tv_real", ":", "realised TV (audit)"))
            for col, ls, lab in curves:
                x = trace[col][m].astype(float)
                x = x[np.isfinite(x)]
                if x.size == 0:
                    continue
                srt = np.sort(x)
                (h,) = ax.plot(taus, np.searchsorted(srt, taus, side="right") / srt.size, ls, color=c, lw=1.6)
                handles.setdefault(f"{name.replace(' +gate', '')}: {lab}", h)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("τ")
        ax.grid(alpha=0.3)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.02)
    axes[0, 0].set_ylabel("coverage: share of (layer, head, step)\nwith bound ≤ τ")
    fig.legend(list(handles.values()), list(handles.keys()), fontsize=7, loc="outside right upper")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def plot_pageins(trace: Trace, path, field: str = "tv"):
    plt = _plt()
    cfg = trace.config_labels()
    colors = _colors(trace.configs())
    c = trace.columns
    fig, ax = plt.subplots(figsize=(7.5, 4.0), constrained_layout=True)
    any_line = False
    for name in trace.configs():
        m = (cfg == name) & (c["blocks"] > 0)
        # one row per (req, seq, step, layer, kv_head) carries the bytes
        seen, per_step = set(), {}
        for i in np.nonzero(m)[0]:
            k = (c["req"][i], c["seq"][i], c["step"][i], c["layer"][i], c["kv_head"][i])
            if k not in seen:
                seen.add(k)
                per_step[int(c["step"][i])] = per_step.get(int(c["step"][i]), 0) + int(c["bytes"][i])
        steps = np.unique(c["step"][cfg == name])
        if not per_step:
            continue
        cum = np.cumsum([per_step.get(int(s), 0) for s in steps]) / 1e6
        ax.plot(steps, cum, "o-", ms=3, color=colors[name.replace(" +gate", "")], label=name)
        any_line = True
    ax.set_xlabel("decode step")
    ax.set_ylabel("cumulative page-in (MB, all requests)")
    ax.set_ylim(bottom=0)
    _integer_x(ax)
    ax.grid(alpha=0.3)
    if any_line:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    else:
        ax.text(0.5, 0.5, "no page-ins in this trace", ha="center", va="center", transform=ax.transAxes)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
