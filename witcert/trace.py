"""Trace records of the meter: one row per (request, sequence, step, layer, query head).

Schema ``witcert.trace`` version 1 (``FIELDS`` below is the documentation and the contract),
stored as JSON Lines: the first line is the header

    {"kind": "header", "schema": "witcert.trace", "version": 1, "created": "...", "writer": "witcert 0.1.0",
     "sample_every": 1, "min_tv": null, "where": null, "meta": {...}}

and every later line one row ``{"req": "kivi2", "seq": 0, "step": 1, "layer": 0, "head": 0, ...}``.
A reader accepts any header of the same schema and version; unknown row fields are ignored,
missing optional fields read as null (NaN in float columns). Non-finite floats are written as
null (``err`` of a NaN row is infinite: its ``nan`` flag says so).

Writing (``Tracer``) is crash-safe: each StepRecord's rows go out as one ``os.write`` of whole
lines (no Python buffer to lose); a process killed mid-write leaves at most one torn last line,
which ``read_trace`` detects (no final newline), skips and warns about, and which a ``Tracer``
opening the file for appending truncates first (with a warning), so it is never glued to the
next row. Torn lines cannot be misread: a proper prefix of a JSON object line is never a
complete JSON object, and the reader also requires the newline. A corrupt line in the middle
raises ``TraceError`` naming the line.

Tracing is on per cache (``WitCertCache(..., trace=tracer)``); with ``trace=None`` the cache pays
one attribute test per (step, layer). At record time a tracer can keep 1 step in N
(``sample_every``: steps with ``step % N == 0``), only rows whose bound before repair exceeds
``min_tv``, and only rows matching a ``where`` predicate (``witcert.predicate``), so tracing can
stay on in serving.

    from witcert.trace import Tracer, read_trace
    with Tracer("run.trace.jsonl", meta={"model": "smollm2"}) as tr:
        tr.new_request("kivi2")                       # label of the next request (else "<session>.<k>")
        cache = WitCertCache(model.config, scheme="kivi2", trace=tr)
        model.generate(ids, past_key_values=cache, max_new_tokens=16)
    t = read_trace("run.trace.jsonl")                 # Trace: header + one numpy column per field
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import pathlib
import secrets
import time
import warnings
import weakref

import numpy as np

from . import __version__, predicate
from .predicate import compile_predicate
from .trace_schema import FIELD_BY_NAME, FIELDS, NUMERIC_KINDS, SATURATED, SCHEMA, VERSION, Field  # noqa: F401 (re-exported)

log = logging.getLogger(__name__)


class TraceError(ValueError):
    """A file that is not a readable witcert trace (the message names the file and line)."""


class TraceWarning(UserWarning):
    """A trace was read or appended to after a repair (a torn last line skipped or truncated);
    the command line prints it as one ``warning:`` line."""




def schema_markdown() -> str:
    """The schema as a Markdown table (docs/trace.md, ``witcert trace schema``)."""
    lines = [f"Schema `{SCHEMA}` version {VERSION}", "", "| field | type | required | meaning |", "| --- | --- | --- | --- |"]
    lines += [f"| `{f.name}` | {f.kind} | {'yes' if f.required else 'no'} | {f.doc} |" for f in FIELDS]
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class TraceHeader:
    schema: str = SCHEMA
    version: int = VERSION
    created: str = ""
    writer: str = ""
    sample_every: int = 1
    min_tv: float | None = None
    where: str | None = None
    meta: dict = dataclasses.field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"kind": "header", **dataclasses.asdict(self)}, sort_keys=False)

    @classmethod
    def from_obj(cls, obj: dict, where: str) -> "TraceHeader":
        if not isinstance(obj, dict) or obj.get("kind") != "header":
            raise TraceError(f"{where}: the first line is not a witcert trace header")
        if obj.get("schema") != SCHEMA:
            raise TraceError(f"{where}: schema {obj.get('schema')!r}, expected {SCHEMA!r}")
        if obj.get("version") != VERSION:
            raise TraceError(f"{where}: trace version {obj.get('version')!r}; this witcert reads version {VERSION}")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in obj.items() if k in names})


# --------------------------------------------------------------------------- StepRecord -> rows
def _gate_label(gate) -> str | None:
    return None if gate is None else f"{gate.policy}@{gate.tau:g}"


def _per_row(x, shape, dtype=float):
    """An optional StepRecord field as a [B, Hq] array (scalar broadcast), or None."""
    if x is None:
        return None
    a = np.asarray(x, dtype=dtype)
    return np.broadcast_to(a, shape) if a.ndim == 0 else a.reshape(shape)


def record_columns(rec, cache, req: str, kv_bytes: np.ndarray | None = None, now: float | None = None) -> dict:
    """The rows of one StepRecord (``witcert.cache``) as columns of length B·Hq, ordered (seq, head).

    ``kv_bytes`` [B, Hkv]: bytes paged in at this step (else blocks × a full block's bytes).
    Reads StepRecord fields by name and tolerates missing optional ones (``eps_max``,
    ``unmetered``, ``delta_spent``), so fields added later do not break tracing."""
    tv = np.asarray(rec.tv_a, dtype=float)
    Bsz, Hq = tv.shape
    Hkv = int(getattr(cache, "num_kv_heads", Hq))
    GQ = max(1, Hq // Hkv)
    shape = (Bsz, Hq)
    heads = np.arange(Hq)
    pre = np.asarray(rec.tv_a_pre, dtype=float)
    parts = getattr(rec, "parts_pre", None)
    tvb = _per_row(getattr(rec, "tv_b", None), shape)
    delta = getattr(rec, "delta_spent", None)
    if delta is None and tvb is not None:
        delta = getattr(rec, "delta_step", None)
    eps = _per_row(getattr(rec, "eps_max", None), shape)
    if eps is None and parts is not None:
        with np.errstate(divide="ignore", invalid="ignore"):
            th = np.asarray(parts[0], dtype=float)
            eps = np.where(th < SATURATED, 2.0 * np.arctanh(np.clip(th, 0.0, SATURATED)), np.nan)
    blocks = np.asarray(rec.pagein_blocks, dtype=np.int64).reshape(Bsz, -1)
    if kv_bytes is None:
        T, D = int(getattr(cache, "block_size", 16)), int(getattr(cache, "head_dim", 0))
        kv_bytes = blocks * 2 * T * D * 4
    kvh = heads // GQ
    flag = np.asarray(rec.flag, dtype=bool)
    nonfinite = np.asarray(rec.nonfinite, dtype=bool)
    unmet = _per_row(getattr(rec, "unmetered", None), shape, dtype=bool)
    cols = {
        "req": np.full(Bsz * Hq, req, dtype=object),
        "seq": np.repeat(np.arange(Bsz), Hq),
        "step": np.full(Bsz * Hq, int(rec.step)),
        "layer": np.full(Bsz * Hq, int(rec.layer)),
        "head": np.tile(heads, Bsz),
        "kv_head": np.tile(kvh, Bsz),
        "scheme": np.full(Bsz * Hq, str(getattr(cache, "scheme", "")), dtype=object),
        "gate": np.full(Bsz * Hq, _gate_label(getattr(cache, "gate", None)), dtype=object),
        "tier": np.full(Bsz * Hq, "A" if tvb is None else "AB", dtype=object),
        "tv": tv.reshape(-1),
        "tv_pre": pre.reshape(-1),
        "tv_b": None if tvb is None else tvb.reshape(-1),
        "tv_b_pre": None if getattr(rec, "tv_b_pre", None) is None else _per_row(rec.tv_b_pre, shape).reshape(-1),
        "delta_b": None if delta is None else _per_row(delta, shape).reshape(-1),
        "err": np.asarray(rec.out_err, dtype=float).reshape(-1),
        "eps_max": None if eps is None else eps.reshape(-1),
        "tv_tanh": None if parts is None else np.asarray(parts[0], dtype=float).reshape(-1),
        "tv_eform": None if parts is None else np.asarray(parts[1], dtype=float).reshape(-1),
        "tv_tilt": None if parts is None else np.asarray(parts[2], dtype=float).reshape(-1),
        "tv_real": None if getattr(rec, "tv_real", None) is None else np.asarray(rec.tv_real, float).reshape(-1),
        "err_real": None if getattr(rec, "out_err_real", None) is None else np.asarray(rec.out_err_real, float).reshape(-1),
        "blocks": blocks[:, kvh].reshape(-1),
        "bytes": np.asarray(kv_bytes, dtype=np.int64).reshape(Bsz, -1)[:, kvh].reshape(-1),
        "saturated": (tv >= SATURATED).reshape(-1),
        "nan": nonfinite.reshape(-1),
        "budget_spent": (flag & ~nonfinite).reshape(-1),
        "unmetered": np.zeros(Bsz * Hq, bool) if unmet is None else unmet.reshape(-1),
        "time": np.full(Bsz * Hq, time.time() if now is None else now),
    }
    return _complete(cols, Bsz * Hq)


def _complete(cols: dict, n: int) -> dict:
    """Every schema field as a column of length n (absent optional fields: NaN / None)."""
    out = {}
    for f in FIELDS:
        c = cols.get(f.name)
        if c is None:
            c = np.full(n, np.nan) if f.kind == "float" else np.full(n, None, dtype=object)
        out[f.name] = c
    return out


def _rows_json(cols: dict, keep: np.ndarray) -> bytes:
    idx = np.nonzero(keep)[0]
    if idx.size == 0:
        return b""
    lists = {}
    for f in FIELDS:
        c = cols[f.name][idx]
        if f.kind == "float":
            c = np.asarray(c, dtype=float)
            lists[f.name] = [None if not np.isfinite(x) else float(x) for x in c]
        elif f.kind in ("int", "bool"):
            lists[f.name] = [None if x is None else (bool(x) if f.kind == "bool" else int(x)) for x in c]
        else:
            lists[f.name] = [None if x is None else str(x) for x in c]
    names = [f.name for f in FIELDS]
    lines = [json.dumps(dict(zip(names, vals)), allow_nan=False) for vals in zip(*(lists[n] for n in names))]
    return ("\n".join(lines) + "\n").encode()


# --------------------------------------------------------------------------- writer
@dataclasses.dataclass
class _RequestState:
    records_id: int
    label: str
    last_bytes: np.ndarray  # [L, B] the cache's cumulative page-in bytes at its last record


class Tracer:
    """A trace sink for ``WitCertCache(..., trace=...)``: appends rows to a JSON Lines file
    (``path``) or keeps them in memory (``path=None``; ``to_trace()``).

    ``sample_every`` N: keep steps with ``step % N == 0``; ``min_tv``: keep rows whose Tier A
    bound before repair exceeds it (or that are NaN-flagged); ``where``: a ``witcert.predicate``
    expression rows must match. A request starts when a cache first records or after its
    ``reset()``; its label is the one given to ``new_request`` before, else ``<session>.<k>``."""

    def __init__(self, path=None, *, sample_every: int = 1, min_tv: float | None = None, where: str | None = None,
                 meta: dict | None = None, fsync: bool = False):
        if not isinstance(sample_every, int) or isinstance(sample_every, bool) or sample_every < 1:
            raise ValueError(f"sample_every: expected an int >= 1, got {sample_every!r}")
        if min_tv is not None and not (isinstance(min_tv, (int, float)) and 0 <= min_tv <= 1):
            raise ValueError(f"min_tv: expected a number in [0, 1], got {min_tv!r}")
        self.sample_every, self.min_tv, self.fsync = sample_every, min_tv, fsync
        self.where = predicate.compile_predicate(where) if where else None
        self.header = TraceHeader(created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                                  writer=f"witcert {__version__}", sample_every=sample_every, min_tv=min_tv,
                                  where=where, meta=dict(meta or {}))
        self.session = secrets.token_hex(3)
        self._k = 0
        self._next_label: str | None = None
        self._requests: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.rows_written = 0
        self.records_seen = 0
        self.path = None if path is None else pathlib.Path(path)
        self._memory: list[dict] | None = [] if path is None else None
        self._fd = None
        if self.path is not None:
            self._check_existing()

    # -- file handling
    def _check_existing(self):
        """Fail early (before any model work) on a path that cannot take this trace."""
        p = self.path
        if p.exists() and p.is_dir():
            raise ValueError(f"{p}: is a folder, expected a trace file")
        if not p.exists() or p.stat().st_size == 0:
            return
        with open(p, "rb") as f:
            first = f.readline()
        if not first.endswith(b"\n"):
            return  # a torn header: repaired (truncated) when the first row is written
        try:
            TraceHeader.from_obj(json.loads(first), f"{p}:1")
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise TraceError(f"{p}:1: not a witcert trace (cannot append to it)") from None

    def _open(self):
        """Open for appending at the first write: create the folder, truncate a torn last line,
        write the header into a new (or empty) file. (The command line's ``--trace`` takes only a
        file in an existing folder: ``witcert.argtypes.out_file``.)"""
        p = self.path
        p.parent.mkdir(parents=True, exist_ok=True)
        keep = _repair_torn_tail(p) if p.exists() and p.stat().st_size else 0
        self._fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        if keep == 0:
            self._write((self.header.to_json() + "\n").encode())
        else:
            log.info("trace: appending to %s (session %s)", p, self.session)

    def _write(self, data: bytes):
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
        if self.fsync:
            os.fsync(self._fd)

    def close(self):
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- requests
    def new_request(self, label: str | None = None) -> None:
        """Label the next request (the next cache that records, or the next after a reset)."""
        self._next_label = label

    def _request(self, cache) -> _RequestState:
        st = self._requests.get(cache)
        if st is None or st.records_id != id(cache.records):
            label = self._next_label if self._next_label is not None else f"{self.session}.{self._k}"
            self._next_label = None
            self._k += 1
            st = _RequestState(id(cache.records), label, np.zeros((0, 0), dtype=np.int64))
            self._requests[cache] = st
        return st

    # -- the sink
    def record(self, rec, cache) -> None:
        self.records_seen += 1
        st = self._request(cache)
        cum = np.asarray(getattr(cache, "pagein_bytes", np.zeros((0, 0))), dtype=np.int64)
        if st.last_bytes.shape != cum.shape:
            st.last_bytes = np.zeros_like(cum)
        delta = cum[rec.layer] - st.last_bytes[rec.layer] if cum.size else None
        if cum.size:
            st.last_bytes[rec.layer] = cum[rec.layer]
        if rec.step % self.sample_every:
            return
        kv_bytes = _split_bytes(np.asarray(rec.pagein_blocks, dtype=np.int64), delta, cache)
        cols = record_columns(rec, cache, st.label, kv_bytes)
        keep = np.ones(len(cols["tv"]), dtype=bool)
        if self.min_tv is not None:
            keep &= (cols["tv_pre"] > self.min_tv) | cols["nan"]
        if self.where is not None:
            keep &= self.where.evaluate(cols)
        if self._memory is not None:
            if keep.any():
                self._memory.append({k: v[keep] for k, v in cols.items()})
            self.rows_written += int(keep.sum())
            return
        data = _rows_json(cols, keep)
        if data:
            if self._fd is None:
                self._open()
            self._write(data)
            self.rows_written += int(keep.sum())

    def to_trace(self) -> "Trace":
        """The rows kept so far (in-memory tracer; a file tracer: read the file back)."""
        if self._memory is None:
            return read_trace(self.path)
        if not self._memory:
            return Trace(self.header, _complete({}, 0))
        cols = {f.name: np.concatenate([b[f.name] for b in self._memory]) for f in FIELDS}
        return Trace(self.header, _typed(cols))


def _split_bytes(blocks: np.ndarray, delta, cache):
    """Bytes per (seq, kv head) of one (step, layer): the exact per-sequence total the cache
    accounted (``delta`` [B]), split over its kv heads by blocks (full blocks; the last kv head
    that paged in takes the remainder of a partial tail block)."""
    T, D = int(getattr(cache, "block_size", 16)), int(getattr(cache, "head_dim", 0))
    layer0 = next((ly for ly in getattr(cache, "layers", []) if getattr(ly, "dtype", None) is not None), None)
    item = layer0.dtype.itemsize if layer0 is not None and hasattr(layer0.dtype, "itemsize") else 4
    out = blocks * 2 * T * D * item
    if delta is None or len(delta) != blocks.shape[0]:
        return out
    for b in range(blocks.shape[0]):
        nz = np.nonzero(blocks[b])[0]
        if nz.size:
            out[b, nz[-1]] += int(delta[b]) - int(out[b].sum())
    return out


def _repair_torn_tail(p: pathlib.Path) -> int:
    """Truncate a torn last line (no final newline) of ``p``; returns the size kept."""
    size = p.stat().st_size
    with open(p, "rb+") as f:
        f.seek(max(0, size - 1))
        if f.read(1) == b"\n":
            return size
        # find the last newline
        pos, chunk = size, 65536
        keep = 0
        while pos > 0:
            start = max(0, pos - chunk)
            f.seek(start)
            buf = f.read(pos - start)
            i = buf.rfind(b"\n")
            if i >= 0:
                keep = start + i + 1
                break
            pos = start
        f.truncate(keep)
    warnings.warn(f"trace {p}: dropped a torn last line ({size - keep} bytes) before appending", TraceWarning,
                  stacklevel=3)
    return keep


class Tee:
    """Hand every record to several sinks (a Tracer and PrometheusMetrics, say)."""

    def __init__(self, *sinks):
        self.sinks = [s for s in sinks if s is not None]

    def record(self, rec, cache) -> None:
        for s in self.sinks:
            s.record(rec, cache)

    def new_request(self, label: str | None = None) -> None:
        """Forwarded to every sink that labels requests (Tracers, nested Tees)."""
        for s in self.sinks:
            if hasattr(s, "new_request"):
                s.new_request(label)


# --------------------------------------------------------------------------- reader
@dataclasses.dataclass
class Trace:
    """A read trace: its header and one numpy column per schema field (``FIELDS``), all of
    length ``len(trace)``. Floats: float64 with NaN for null; ints: int64; bools: bool;
    strings: object arrays (None for null)."""

    header: TraceHeader
    columns: dict
    skipped_torn: int = 0

    def __len__(self) -> int:
        return len(self.columns["tv"])

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.columns:
            raise KeyError(f"no trace field {name!r}; fields: {', '.join(FIELD_BY_NAME)}")
        return self.columns[name]

    def select(self, mask: np.ndarray) -> "Trace":
        return Trace(self.header, {k: v[mask] for k, v in self.columns.items()}, self.skipped_torn)

    def where(self, expr: str | None) -> "Trace":
        """Rows matching a ``witcert.predicate`` expression (all rows for None / empty)."""
        if not expr:
            return self
        return self.select(compile_predicate(expr).evaluate(self.columns))

    def configs(self) -> list[str]:
        """Distinct '<scheme>' / '<scheme> +gate' labels in first-seen order."""
        return list(dict.fromkeys(self.config_labels()))

    def config_labels(self) -> np.ndarray:
        g = self.columns["gate"]
        s = self.columns["scheme"]
        return np.array([f"{a} +gate" if b is not None else str(a) for a, b in zip(s, g)], dtype=object)


def _typed(raw: dict) -> dict:
    cols = {}
    for f in FIELDS:
        v = raw[f.name]
        if f.kind == "float":
            cols[f.name] = np.array([np.nan if x is None else x for x in v], dtype=float)
        elif f.kind == "int":
            cols[f.name] = np.array([0 if x is None else x for x in v], dtype=np.int64)
        elif f.kind == "bool":
            cols[f.name] = np.array([bool(x) for x in v], dtype=bool)
        else:
            cols[f.name] = np.array(list(v), dtype=object)
    return cols


def read_trace(path) -> Trace:
    """Read a JSON Lines trace. A torn last line is skipped with a warning; any other
    unreadable line raises ``TraceError`` (``path:line: why``)."""
    p = pathlib.Path(path)
    if p.is_dir():
        raise TraceError(f"{p}: is a folder, expected a trace file")
    if not p.is_file():
        raise TraceError(f"{p}: no such trace file")
    data = p.read_bytes()
    lines = data.split(b"\n")
    torn = 0
    if lines and lines[-1] == b"":
        lines.pop()
    elif lines:
        # the file does not end with a newline: its last line was torn by a crash mid-write
        torn = 1
        warnings.warn(f"trace {p}: skipped a torn last line ({len(lines[-1])} bytes, no newline)", TraceWarning,
                      stacklevel=2)
        lines.pop()
    if not lines:
        raise TraceError(f"{p}: empty trace (no header)")
    try:
        header = TraceHeader.from_obj(json.loads(lines[0]), f"{p}:1")
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise TraceError(f"{p}:1: not a witcert trace (the header is not JSON)") from None
    raw = {f.name: [] for f in FIELDS}
    required = [f.name for f in FIELDS if f.required]
    for i, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise TraceError(f"{p}:{i}: corrupt line in the middle of the trace (not JSON)") from None
        if not isinstance(obj, dict):
            raise TraceError(f"{p}:{i}: a row must be a JSON object")
        if obj.get("kind") == "header":
            continue
        missing = [k for k in required if obj.get(k) is None and k not in ("gate",)]
        if missing:
            raise TraceError(f"{p}:{i}: row lacks required field(s) {', '.join(missing)}")
        for f in FIELDS:
            v = obj.get(f.name)
            if v is not None and not _VALID[f.kind](v):
                raise TraceError(f"{p}:{i}: field {f.name!r}: expected {_EXPECTED[f.kind]} or null, got {v!r:.40}")
            raw[f.name].append(v)
    return Trace(header, _typed(raw), torn)


#: the JSON value types a row field of each kind accepts (null aside); bools are not numbers here
_VALID = {"float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
          "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
          "bool": lambda v: isinstance(v, bool),
          "str": lambda v: isinstance(v, str)}
_EXPECTED = {"float": "a number", "int": "an integer", "bool": "true / false", "str": "a string"}
