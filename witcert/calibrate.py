"""Channel weights of the sketch radius, from calibration queries (SPEC §2 as amended by issue 33).

The key witness W_j ≥ ‖(r_j − r̃_j)/a‖ and the head factor c_h = |σ|‖a⊙q_h‖ (``contract.sketch``) are
sound for **any** positive weights a; the weights only decide how tight the radius is. By
Cauchy–Schwarz, E‖a⊙q‖·E‖e/a‖ over a query / residual population is smallest, for per-band energies
Q_b = E‖q[b]‖² and R_b = E‖e[b]‖², at a_b = (R_b / Q_b)^(1/4): channels where queries carry little
energy get large weights (their residual counts little), the others small ones. RoPE rotates each band
in place, so a band's energy does not depend on the position: weights per band fit every position.

The weights are computed once per model and scheme from a **calibration text** (never from the
request being metered), rounded to powers of two (products and quotients by them are exact in floating
point) in [2^-8, 2^8], normalised to a median of 1, and stored per (layer, kv head):

    cal = calibrate(model, tok, scheme="int8")     # Calibration: weights [L, Hkv, D]
    cache = WitCertCache(model.config, scheme="int8", weights=cal)
    embedded_calibration("int8")                    # the embedded SmolLM2's, computed once and cached

For the embedded model ``embedded_calibration`` computes them from ``CALIBRATION_TEXT`` on first use and
keeps them under the cache directory (``witcert.model.cache_dir``), like the converted model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import pathlib

import numpy as np
import torch

from contract.bands import _bands, _check_rope_dims
from contract.sketch import DEFAULT_SKETCH_BITS, WEIGHT_EXP_MAX, check_bits

log = logging.getLogger("witcert.calibrate")

#: the built-in calibration text (prose unrelated to the tightness prompts of ``witcert.tightness``)
CALIBRATION_TEXT = (
    "The history of mathematics spans many cultures: Babylonian tablets recorded square roots, Greek "
    "geometers proved theorems about circles and primes, Indian scholars wrote the numerals we use, and "
    "Arabic algebra gave the world systematic equations. Modern computers execute billions of instructions "
    "per second, yet the questions they answer were often posed centuries ago. In a small workshop a "
    "carpenter measures twice and cuts once; in a laboratory a chemist weighs a sample and writes the "
    "result in a notebook. Rivers carry silt to the sea, forests store carbon, and cities grow along the "
    "old trade routes. "
)
#: calibration tokens read from the text (repeated as needed)
CALIBRATION_TOKENS = 768
#: the cache directory's file of the embedded model's calibration (versioned: a new rule, a new file)
_CACHE_VERSION = 2


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Channel weights per (layer, kv head): ``weights`` [L, Hkv, D] float64, powers of two."""

    weights: np.ndarray
    scheme: str
    sketch_bits: int
    source: str  # what they were computed from (text digest, tokens)

    def __post_init__(self):
        w = np.asarray(self.weights, dtype=np.float64)
        if w.ndim != 3:
            raise ValueError(f"Calibration.weights: expected [layers, kv heads, head dim], got shape {w.shape}")
        check_weights(w)

    def layer(self, i: int) -> np.ndarray:
        return np.asarray(self.weights[i], dtype=np.float64)


def check_weights(w: np.ndarray) -> None:
    """ValueError unless every weight is a power of two in [2^-WEIGHT_EXP_MAX, 2^WEIGHT_EXP_MAX]."""
    w = np.asarray(w, dtype=np.float64)
    if not np.all(np.isfinite(w) & (w > 0)):
        raise ValueError("weights: every channel weight must be positive and finite")
    m, e = np.frexp(w)
    if not np.all(m == 0.5) or np.any(np.abs(e - 1) > WEIGHT_EXP_MAX):
        raise ValueError(f"weights: every channel weight must be a power of two in [2^-{WEIGHT_EXP_MAX}, "
                         f"2^{WEIGHT_EXP_MAX}] (exact products and quotients)")


def band_weights(q_energy: np.ndarray, r_energy: np.ndarray, head_dim: int, rotary_dim: int | None = None,
                 layout: str = "half") -> np.ndarray:
    """Weights [..., D] from per-band energies [..., bands] (``contract.bands`` order): a_b =
    (R_b/Q_b)^(1/4), rounded to the nearest power of two, normalised to a median exponent of 0 and
    clamped to [2^-WEIGHT_EXP_MAX, 2^WEIGHT_EXP_MAX]; both channels of a band get its weight."""
    head_dim, rotary_dim = _check_rope_dims(head_dim, rotary_dim)
    bands = _bands(head_dim, rotary_dim, layout)
    qe = np.asarray(q_energy, dtype=np.float64)
    re = np.asarray(r_energy, dtype=np.float64)
    if qe.shape[-1] != len(bands) or re.shape != qe.shape:
        raise ValueError(f"energies: expected [..., {len(bands)}] for both, got {qe.shape} and {re.shape}")
    with np.errstate(divide="ignore", invalid="ignore"):
        ex = 0.25 * (np.log2(np.maximum(re, 1e-300)) - np.log2(np.maximum(qe, 1e-300)))
    ex = np.where(np.isfinite(ex), ex, 0.0)
    ex = np.round(ex - np.median(ex, axis=-1, keepdims=True))
    ex = np.clip(ex, -WEIGHT_EXP_MAX, WEIGHT_EXP_MAX)
    out = np.ones(qe.shape[:-1] + (head_dim,))
    for b, chans in enumerate(bands):
        for c in chans:
            out[..., c] = 2.0 ** ex[..., b]
    return out


def capture(model, tok, text: str, n_tokens: int) -> dict:
    """Post-RoPE queries and keys of every layer for ``n_tokens`` tokens of ``text`` (repeated as
    needed): ``capture_ids`` of its token ids."""
    reps = max(1, math.ceil(n_tokens / max(1, len(tok(text)["input_ids"]))) + 1)
    return capture_ids(model, tok(text * reps, return_tensors="pt")["input_ids"][:, :n_tokens])


def capture_ids(model, ids) -> dict:
    """Post-RoPE queries and keys of every layer in one forward pass over ``ids`` [1, n]:
    {layer: (q [Hq, n, D], k [Hkv, n, D], scaling)} float64 CPU tensors."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    store: dict = {}

    def attn(module, query, key, value, attention_mask, scaling=None, **kw):
        store[module.layer_idx] = (query[0].detach().double().cpu(), key[0].detach().double().cpu(), scaling)
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kw)

    AttentionInterface.register("witcert_capture", attn)
    prev = model.config._attn_implementation
    model.set_attn_implementation("witcert_capture")
    try:
        with torch.no_grad():
            model(input_ids=ids.to(model.device))
    finally:
        model.set_attn_implementation(prev)
    return store


def calibrate(model, tok, scheme: str = "int8", sketch_bits: int = DEFAULT_SKETCH_BITS,
              text: str = CALIBRATION_TEXT, n_tokens: int = CALIBRATION_TOKENS) -> Calibration:
    """Weights for ``model`` under ``scheme`` with a ``sketch_bits`` residual sketch (module doc):
    one forward pass over the calibration text; per (layer, kv head) the band energies of its query
    heads' queries and of the keys' sketch remainder r − r̃."""
    from witcert import bounds as B
    from witcert.model import _model_dims
    from witcert.schemes import QuantContext, quantize, residual_range

    sketch_bits = check_bits(sketch_bits)
    _, L, Hq, Hkv, D, rot = _model_dims(model.config)
    bands = _bands(D, rot, "half")
    store = capture(model, tok, text, n_tokens)
    W = np.ones((L, Hkv, D))
    for layer in range(L):
        if layer not in store:
            continue
        q, k, _ = store[layer]
        kf = k.float()
        kh, meta = quantize(scheme, kf, QuantContext(role="key", layer=layer, kv_head=torch.arange(Hkv)))
        r = kh.double().numpy() - kf.double().numpy()  # [Hkv, n, D]
        if sketch_bits:
            beta = residual_range(scheme, kh, meta)
            codes, beta = B.sketch_encode(r, sketch_bits, None if beta is None else beta.numpy())
            r = r - B.sketch_decode(codes, beta, sketch_bits)
        qn = q.numpy().reshape(Hkv, Hq // Hkv, q.shape[1], D)
        qe = np.stack([(qn[..., c] ** 2).sum(-1).mean((1, 2)) for c in bands], -1)  # [Hkv, bands]
        re = np.stack([(r[..., c] ** 2).sum(-1).mean(1) for c in bands], -1)
        W[layer] = band_weights(qe, re, D, rot)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    return Calibration(W, scheme, sketch_bits, f"text sha256:{digest}, {n_tokens} tokens")


def _cache_file(scheme: str, sketch_bits: int) -> pathlib.Path:
    from witcert.model import DEFAULT_NAME, cache_dir

    return cache_dir() / f"{DEFAULT_NAME}.calibration-v{_CACHE_VERSION}-{scheme}-{sketch_bits}.npz"


def save(cal: Calibration, path) -> None:
    np.savez(path, weights=cal.weights, scheme=cal.scheme, sketch_bits=cal.sketch_bits, source=cal.source)


def load(path) -> Calibration:
    z = np.load(path, allow_pickle=False)
    return Calibration(z["weights"], str(z["scheme"]), int(z["sketch_bits"]), str(z["source"]))


def embedded_calibration(scheme: str = "int8", sketch_bits: int = DEFAULT_SKETCH_BITS, model=None, tok=None) -> Calibration:
    """The embedded SmolLM2's calibration for ``scheme`` / ``sketch_bits``: read from the cache
    directory, or computed from ``CALIBRATION_TEXT`` (loading the model unless given) and written there."""
    import os
    import tempfile

    path = _cache_file(scheme, check_bits(sketch_bits))
    if path.is_file():
        try:
            return load(path)
        except (OSError, ValueError, KeyError) as e:
            log.warning("calibration file %s unreadable (%s): computing it again", path, e)
    if model is None:
        from witcert.model import load_model

        model, tok = load_model()
    cal = calibrate(model, tok, scheme, sketch_bits)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".npz", dir=path.parent)
    os.close(fd)
    save(cal, tmp)
    os.replace(tmp, path)  # atomic: a concurrent reader never sees half a file
    log.info("calibration of the embedded model for %s (sketch %d bits) written to %s", scheme, sketch_bits, path)
    return cal
