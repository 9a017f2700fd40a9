"""The SGLang adapter's own-scheme side (``install(scheme=...)``: WitCert's codes written beside SGLang's pool by
``kernels.write.write_kv``, block size 1) runs ``witcert.selftest.check_write_kernel`` when it allocates, as the
transformers cache does. A faulty write fails the check at the first recorded write; by the adapter's rule (the meter
never breaks SGLang's write) the layer then stays unmetered, counted in ``STATE.unmetered`` with the error."""

from __future__ import annotations

import importlib.util

import pytest
import torch

if importlib.util.find_spec("sglang") is None:
    pytest.skip("pip install --no-deps sglang==0.5.23 (Makefile)", allow_module_level=True)

import witcert.integrations.sglang as ws  # noqa: E402
from kernels import write as W  # noqa: E402
from tests.helpers.sglang_pool import _clean, kv, mha, write  # noqa: E402, F401  (_clean: the autouse fixture)
from witcert import selftest as ST  # noqa: E402


def test_our_scheme_side_checks_its_write(monkeypatch):
    monkeypatch.setattr(ST, "_CHECKED", set())
    ws.install(force=True, bare=True, on_record=lambda *a: None, scheme="int8")
    write(mha(), 0, torch.arange(0, 8), *kv(8, 2))  # the first write allocates the side and checks its write
    (key,) = ST._CHECKED
    assert key[0] == "int8" and key[3] == 1  # (scheme, …, block size 1)


def test_a_faulty_write_stops_the_first_recorded_write(monkeypatch, caplog):
    monkeypatch.setattr(ST, "_CHECKED", set())
    real = W.write_kv

    def faulty(cache, *a, **kw):
        real(cache, *a, **kw)
        cache.v_norm.mul_(0.5)

    monkeypatch.setattr(W, "write_kv", faulty)
    ws.install(force=True, bare=True, on_record=lambda *a: None, scheme="int8")
    pool = mha()
    write(pool, 0, torch.arange(0, 8), *kv(8, 2))  # SGLang's write goes through: the meter never breaks a write
    # … but the layer has no witness side: its decodes are served unmetered and counted, with the reason
    assert ws.side_of(pool.k_buffer[0]) is None and not ST._CHECKED
    assert any("WriteSelfTestError" in why and "scheme int8" in why for why in ws.STATE.unmetered)
    # and logged as an error, not only counted
    assert any(r.levelname == "ERROR" and r.name == "witcert.selftest" and "self-check" in r.getMessage()
               for r in caplog.records)
