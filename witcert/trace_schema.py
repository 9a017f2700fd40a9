"""The trace schema ``witcert.trace`` (a leaf: ``witcert.trace`` writes and reads it, ``witcert.predicate``
parses ``--where`` expressions against its field kinds; both import it, it imports neither).

``FIELDS`` is the documentation and the contract of one trace row (docs/trace.md)."""

from __future__ import annotations

import dataclasses

SCHEMA = "witcert.trace"
VERSION = 1
SATURATED = 1.0 - 1e-9  # tv at or above this is reported as saturated


@dataclasses.dataclass(frozen=True)
class Field:
    name: str
    kind: str  # "int" | "float" | "bool" | "str"
    required: bool
    doc: str


FIELDS: tuple[Field, ...] = (
    Field("req", "str", True, "request label (Tracer.new_request, else '<session>.<k>')"),
    Field("seq", "int", True, "sequence index within the batch"),
    Field("step", "int", True, "forward step of the request (0 = prefill, exact and not metered; 1 = first decode step)"),
    Field("layer", "int", True, "decoder layer"),
    Field("head", "int", True, "query head"),
    Field("kv_head", "int", True, "kv head the query head reads (GQA)"),
    Field("scheme", "str", True, "KV compression scheme (witcert.schemes)"),
    Field("gate", "str", False, "gate as '<policy>@<tau>' ('risk-ranked@0.9'); null: ungated"),
    Field("tier", "str", True, "'A': Tier A metered; 'AB': Tier B (int8_dither with delta_req) metered too"),
    Field("tv", "float", True, "Tier A TV+ after repair (max over the step's query rows)"),
    Field("tv_pre", "float", True, "Tier A TV+ before repair"),
    Field("tv_b", "float", False, "Tier B TV+ after repair; null without Tier B"),
    Field("tv_b_pre", "float", False, "Tier B TV+ before repair"),
    Field("delta_b", "float", False, "failure probability delta spent by Tier B on this (step, layer, head)"),
    Field("err", "float", False, "E+_V, Tier A output-error bound after repair; null when infinite (nan flag)"),
    Field("eps_max", "float", False, "largest Tier A logit radius before repair (StepRecord.eps_max, else "
                                     "2 atanh of the tanh bound); null when saturated"),
    Field("tv_tanh", "float", False, "SPEC 3(a) tanh bound before repair"),
    Field("tv_eform", "float", False, "SPEC 3(b) e-form bound before repair"),
    Field("tv_tilt", "float", False, "SPEC 3(c) dual-grid tilt bound before repair"),
    Field("tv_real", "float", False, "audit=True: realised TV against exact attention"),
    Field("err_real", "float", False, "audit=True: realised output error"),
    Field("blocks", "int", True, "blocks paged in at this step for (seq, layer, kv_head); shared by its query heads"),
    Field("bytes", "int", True, "bytes paged in (K + V) at this step for (seq, layer, kv_head); same scope"),
    Field("saturated", "bool", True, f"tv >= {SATURATED} (the bound says nothing)"),
    Field("nan", "bool", True, "NaN/Inf in the inputs (bound saturated on purpose)"),
    Field("budget_spent", "bool", True, "flagged: not certified when the gate's page-in budget ran out"),
    Field("unmetered", "bool", True, "the cache marked the row unmetered (StepRecord.unmetered)"),
    Field("time", "float", True, "unix time of the record"),
)
FIELD_BY_NAME = {f.name: f for f in FIELDS}
NUMERIC_KINDS = ("int", "float", "bool")
