"""A fault in the compiled decode, for the self-check's tests: ``patch_decode(monkeypatch, change)`` makes
``kernels.decode.decode`` apply ``change(record)`` to the meter record of every call (e.g. TV⁺ halved)."""

from __future__ import annotations


def patch_decode(monkeypatch, change) -> None:
    import kernels.decode as KD

    real = KD.decode

    def faulty(*a, **kw):
        out = real(*a, **kw)
        change(out.meter)
        return out

    monkeypatch.setattr(KD, "decode", faulty)
