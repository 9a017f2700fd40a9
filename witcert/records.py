"""The meter's records of ``WitCertCache`` (``witcert.cache``): ``StepRecord`` (one per (forward step,
layer)), ``GraphedRecords`` (a graphed decode step's records, kept on the device until read) and
``jsonable`` (records and summaries in plain Python / JSON values). Re-exported by ``witcert.cache``."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import torch


@dataclasses.dataclass
class StepRecord:
    """Meter of one (forward step, layer): arrays [B, Hq] (maxima over the step's query rows)."""

    step: int
    layer: int
    tv_a: np.ndarray  # Tier A TV⁺ after repair
    tv_a_pre: np.ndarray  # before repair
    out_err: np.ndarray  # E⁺_V (Tier A) after repair
    tv_b: np.ndarray | None  # Tier B TV⁺ (int8_dither with delta_req), after repair
    flag: np.ndarray  # bool: not certified (gate budget spent) or non-finite inputs
    nonfinite: np.ndarray  # bool: saturated because of NaN/Inf
    pagein_blocks: np.ndarray  # [B, Hkv] blocks paged in at this step
    delta_step: float | np.ndarray | None = None  # Tier B budget per query row of this forward
    delta_spent: float | None = None  # Σ over the forward's query rows: what each (layer, head) spent
    parts_pre: np.ndarray | None = None  # [3, B, Hq] tanh / e-form / tilt before repair
    tv_b_pre: np.ndarray | None = None
    tv_real: np.ndarray | None = None  # audit=True: realised TV against exact attention
    out_err_real: np.ndarray | None = None
    audit_violations: int = 0  # rows where realised > bound (must stay 0)


def jsonable(obj, finite: bool = True):
    """``obj`` with numpy arrays / scalars, tensors and dataclasses turned into plain Python (lists,
    floats, ints, bools, dicts); ``finite``: non-finite floats become None (JSON). For ``summary()``
    (plain, ``finite=False``: an infinite bound stays inf), ``summary_json()`` and ``StepRecord``s."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: jsonable(getattr(obj, f.name), finite) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): jsonable(v, finite) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v, finite) for v in obj]
    if isinstance(obj, torch.Tensor):
        obj = obj.detach().cpu().numpy()
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist(), finite)
    if isinstance(obj, (np.bool_, bool)):
        return bool(obj)
    if isinstance(obj, (np.integer, int)):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        return float(obj) if (math.isfinite(float(obj)) or not finite) else None
    return obj


@dataclasses.dataclass
class GraphedRecords:
    """The meter of one graphed decode step (``witcert.graphs``), kept on the device until
    ``records`` is read: ``rec`` [L, len(FIELDS), B, Hq] float64 (``WitCertCache._static_attention``)."""

    #: the MeterRecord fields a graphed step keeps, in ``rec``'s column order (the flag as 0 / 1)
    FIELDS = ("tv_upper_a", "out_err_upper", "flag", "tanh", "eform", "tilt")

    step: int
    rec: torch.Tensor

    def records(self, cache) -> list:
        """One StepRecord per layer, built by ``WitCertCache._kernel_record`` as the ungraphed
        kernel path's (one host transfer for the step)."""
        r = self.rec.cpu()
        col = dict(zip(self.FIELDS, r.unbind(1)))
        col["flag"] = col["flag"] > 0
        return [cache._kernel_record(self.step, li, SimpleNamespace(tv_upper_b=None, **{k: v[li] for k, v in col.items()}),
                                     None, r.shape[2]) for li in range(r.shape[0])]
