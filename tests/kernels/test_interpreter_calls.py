"""``tests.helpers.interpreter_calls``: the suite's interpreter skips re-patching ``triton.language`` on device-function
calls inside a launch, and nothing else changes (CPU only: on the GPU there is no interpreter)."""

import os

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the interpreter only")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter as ti  # noqa: E402

from tests.helpers import interpreter_calls  # noqa: E402


@triton.jit
def _inner(x):
    return tl.where(x > 0, tl.exp(x), -x)


@triton.jit
def _middle(x, N: tl.constexpr):
    y = _inner(x)
    for i in tl.static_range(2):
        y = y + _inner(x * (i + 1))
    return y, tl.sum(y, axis=0), tl.max(tl.reshape(y, (N // 2, 2)).T, axis=1)


@triton.jit
def _kernel(X, Y, S, M, FAIL: tl.constexpr, N: tl.constexpr):
    x = tl.load(X + tl.arange(0, N))
    y, s, m = _middle(x, N)
    tl.store(Y + tl.arange(0, N), y)
    tl.store(S, s)
    tl.store(M + tl.arange(0, 2), m)
    tl.static_assert(FAIL == 0, "asked to fail")


def _expected(x):
    inner = lambda t: np.where(t > 0, np.exp(t), -t)  # noqa: E731
    y = inner(x) + inner(x) + inner(2 * x)
    return y, y.sum(), y.reshape(-1, 2).T.max(axis=1)


def test_installed_on_the_pinned_triton():
    """The pinned Triton has the private names it wraps: the suite runs at the patched speed (a Triton that moves them
    makes this fail, not the suite silently slower)."""
    if os.environ.get("WITCERT_TEST_PLAIN_INTERPRETER") == "1":
        pytest.skip("the plain interpreter was asked for")
    assert getattr(ti._patch_lang, "_witcert_wrapped", False)
    assert interpreter_calls.install() is True  # idempotent


def test_nested_device_calls_compute_what_numpy_does_before_and_after_a_failed_launch():
    x = torch.tensor(np.linspace(-2, 2, 8), dtype=torch.float32)
    for fail in (0, 1, 0):
        y, s, m = torch.empty(8), torch.empty(1), torch.empty(2)
        if fail:
            with pytest.raises(Exception):
                _kernel[(1,)](x, y, s, m, FAIL=fail, N=8)
            assert interpreter_calls._state["langs"] is None  # the launch's state is reset after an exception
            continue
        _kernel[(1,)](x, y, s, m, FAIL=fail, N=8)
        ey, es, em = _expected(x.double().numpy())
        np.testing.assert_allclose(y.numpy(), ey, rtol=1e-6)
        np.testing.assert_allclose(s.numpy()[0], es, rtol=1e-6)
        np.testing.assert_allclose(m.numpy(), em, rtol=1e-6)
    # outside a launch the language is Triton's own again (the launch's scope restored it)
    assert tl.core.is_builtin(tl.where) and interpreter_calls._state["langs"] is None


def test_a_device_call_outside_a_launch_is_patched_as_triton_does(monkeypatch):
    """Only calls inside a running launch skip the patch: anything else reaches Triton's ``_patch_lang``."""
    seen = []
    monkeypatch.setattr(interpreter_calls, "_state", {"langs": None})
    calls = {"n": 0}

    class _Scope:
        def restore(self):
            pass

    def counting(fn):
        calls["n"] += 1
        seen.append(fn.__name__)
        return _Scope()

    # a fresh wrapper around a counting "Triton" function
    monkeypatch.setattr(ti, "_patch_lang", counting)
    monkeypatch.setattr(ti.GridExecutor, "__call__", ti.GridExecutor.__call__)
    assert interpreter_calls.install() is True
    w = ti._patch_lang
    w(_inner.fn)  # no launch running: Triton's
    assert calls["n"] == 1
    interpreter_calls._state["langs"] = set()  # a launch running, nothing patched yet
    w(_kernel.fn)
    assert calls["n"] == 2
    w(_inner.fn)  # the same language, already patched in this launch: skipped
    assert calls["n"] == 2 and seen == ["_inner", "_kernel"]
