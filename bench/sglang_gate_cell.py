"""The metered+gate column of bench/sglang_h200.py (issue 36): the patched SGLang decode with the certified gate on,
eager (the gate reads the record on the host and pages exact KV in, so it cannot be captured in a CUDA graph: the
adapter refuses that capture with ``GraphCaptureUnsupported``).

    gate_cell(ws, call, tau, layer_id, loc, k, v, iters) -> GateCell

``ws``: ``witcert.integrations.sglang`` installed with ``scheme="sglang"`` and no gate; ``call()``: one patched decode
call on a cell whose writes ``ws.record_write`` recorded; ``loc`` / ``k`` / ``v``: the slots and the exact K / V (the
model's, before SGLang's scale division) of those writes, which a ``HostExactStore`` (pinned host memory on CUDA) is
given. For the calls the adapter's gate and store are set, and restored after, whatever happens. The time is wall
clock around ``iters`` calls with the device synchronised at both ends (the gate synchronises every call anyway); then
one more call is counted (its report and served record, through the adapter's record sink, which it forwards).
"""

from __future__ import annotations

import dataclasses
import time

import torch


@dataclasses.dataclass(frozen=True)
class GateCell:
    """What the gated calls did: ``ms`` per timed call; the counts are one further call's (its ``GateReport``, none
    when no row is over τ) and the record it served."""

    tau: float
    ms: float
    rows_over: int  # request rows with some query head over τ in the first pass
    rows_repaired: int  # rows re-served from the overlay
    slots_paged: int  # (row, kv head, slot) page-ins
    rejected: int  # page-ins the store check refused
    tv_pre_max: float  # the first pass's largest TV⁺
    tv_post_max: float  # the served record's largest TV⁺ after repair

    def line(self, metered_ms: float) -> str:
        """The benchmark's comment line for this τ beside the ungated eager call's ``metered_ms``."""
        return (f"#   metered+gate τ {self.tau:g}: {self.ms:.3f} ms eager ({self.ms / metered_ms:.2f}× the ungated "
                f"eager call), rows over τ {self.rows_over}, repaired {self.rows_repaired}, slots paged "
                f"{self.slots_paged}, refused {self.rejected}, TV⁺ max {self.tv_pre_max:.3g} → {self.tv_post_max:.3g}; "
                f"graph: not capturable (the gate's host syncs)")


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def gate_cell(ws, call, tau: float, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              iters: int) -> GateCell:
    """The gated call's time and what its gate did (module doc)."""
    from witcert.gate import Gate
    from witcert.integrations.sglang_gate import _check_gate

    if iters < 1:
        raise ValueError(f"iters: expected >= 1, got {iters}")
    st = ws.STATE
    if st.gate is not None:
        raise ValueError("gate_cell: the adapter already has a gate; install it without one (the cell sets its own)")
    gate = Gate("certified", tau=tau)
    dev = k.device
    store = ws.HostExactStore(pin=dev.type == "cuda")
    store.write(layer_id, loc, k, v)
    _check_gate(gate, store, st.scheme)
    served = []
    forward = st.on_record

    def keep(layer_id, rec):  # the served record of the counted call, then the adapter's own sink
        served.append(rec)
        if forward is not None:
            forward(layer_id, rec)
        else:
            st.records.append((layer_id, rec))

    st.gate, st.exact_store = gate, store
    try:
        call()  # (untimed: the overlay's compile and the store's first reads)
        _sync(dev)
        t0 = time.perf_counter()
        for _ in range(iters):
            call()
        _sync(dev)
        ms = (time.perf_counter() - t0) * 1e3 / iters
        # one more call, untimed, counted: its report (a call with no row over τ has none) and the record it served
        st.gate_log.clear()
        st.on_record = keep
        call()
        _sync(dev)
        if not served:
            raise RuntimeError("gate_cell: the call served no metered record (did it reach the patched decode?)")
        post = float(served[-1].tv_upper_a.max())
        if not st.gate_log:
            return GateCell(tau=tau, ms=ms, rows_over=0, rows_repaired=0, slots_paged=0, rejected=0,
                            tv_pre_max=post, tv_post_max=post)
        r = st.gate_log[-1]
        return GateCell(tau=tau, ms=ms, rows_over=len(r.rows), rows_repaired=len(r.repaired_rows),
                        slots_paged=len(r.paged), rejected=int(r.rejected),
                        tv_pre_max=float(r.tv_pre.max()), tv_post_max=post)
    finally:
        st.gate, st.exact_store, st.on_record = None, None, forward
