"""``witcert selftest``: the kernel path's self-checks on demand (``witcert.selftest_run``): a pass exits 0 with one line
(or JSON) per scheme, a faulty decode exits 1 naming it, bad arguments exit 2. On the CPU in Triton's interpreter (the
suite sets TRITON_INTERPRET=1); under ``WITCERT_DEVICE=cuda`` on the GPU."""

from __future__ import annotations

import json
import os

import pytest

from tests.helpers.faulty_decode import patch_decode
from witcert import cli

DEV = os.environ.get("WITCERT_DEVICE", "cpu")
SMALL = ["--device", DEV, "--head-dim", "64", "--kv-heads", "2", "--q-heads", "4", "--batch", "3", "--context", "256"]


def test_a_pass_exits_0_with_a_line_per_scheme(capsys):
    assert cli.main(["selftest", "--scheme", "int8,fp8_e4m3", "--json", *SMALL]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [x["scheme"] for x in out] == ["int8", "fp8_e4m3"] and all(x["passed"] for x in out)
    assert all(x["decode_rows"] == 2 * 4 and x["informative_rows"] == 8 and x["worst_tv_ratio"] > 1.0 for x in out)


def test_a_faulty_decode_exits_1(monkeypatch, capsys):
    patch_decode(monkeypatch, lambda rec: rec.tv_upper_a.mul_(0.5))
    assert cli.main(["selftest", "--scheme", "int8", *SMALL]) == 1
    out = capsys.readouterr().out
    assert "int8" in out and "FAILED" in out and "fractional supremum" in out


@pytest.mark.parametrize("argv", [["--q-heads", "6", "--kv-heads", "4"], ["--q-heads", "18", "--kv-heads", "2"]])
def test_bad_heads_exit_2(argv, capsys):
    assert cli.main(["selftest", *SMALL, *argv]) == 2
    assert "--q-heads" in capsys.readouterr().out


def test_the_cpu_needs_the_interpreter(monkeypatch, capsys):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert cli.main(["selftest", "--device", "cpu"]) == 2
    assert "TRITON_INTERPRET=1" in capsys.readouterr().out


def test_a_scheme_without_a_kernel_fails_clearly(capsys):
    import torch

    from witcert.selftest_run import run_one

    line = run_one("nonexistent", device=DEV, dtype=torch.float32, head_dim=64, kv_heads=2, q_heads=4, batch=1,
                   context=64, window=(0, 0), sketch_bits=None)
    assert not line.passed and "has no kernel" in line.error


def test_on_demand_runs_again():
    """``witcert selftest`` runs the checks even where this process already passed them (``force``)."""
    import torch

    from witcert.selftest_run import run_one

    kw = dict(device=DEV, dtype=torch.float32 if DEV == "cpu" else torch.bfloat16, head_dim=64, kv_heads=2, q_heads=4,
              batch=2, context=128, window=(2, 8), sketch_bits=None)
    first, again = run_one("int8", **kw), run_one("int8", **kw)
    assert first.passed and again.passed and again.decode_rows == first.decode_rows == 8
