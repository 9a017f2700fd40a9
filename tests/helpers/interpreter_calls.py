"""The Triton interpreter without its repeated patching of ``triton.language`` on device-function calls (tests only).

In interpreter mode (``TRITON_INTERPRET=1``) a kernel launch patches ``triton.language`` so that its builtins run on
numpy (``triton.runtime.interpreter._patch_lang``), and restores it after the grid. Triton 3.7.1 also calls
``_patch_lang`` on **every call of a** ``@triton.jit`` **helper inside the kernel**, once per program and tile: a
walk of ``inspect.getmembers`` over four modules, ~1 ms each time. The launch has already patched those modules, and a
second patch changes nothing (the builtins it looks for are already replaced; the tensor and core attributes it sets
are the same wrappers again). Profiled on ``tests/cache/test_graphs.py::test_graphed_steps_match_the_kernel_path``
(2026-12-05): 23 % of the test's time.

``install()`` skips that second patch while a launch is running, for the modules the launch patched; any other call
goes to Triton's function. The kernels' semantics in the interpreter are Triton's own. Where the private names it
wraps are missing (another Triton), it installs nothing and the suite runs at Triton's speed.
"""

from __future__ import annotations

import inspect

_state = {"langs": None}  # the language modules the running launch has patched (None: no launch running)


class _NoScope:
    """What a skipped patch returns (a device-function call drops it; a launch never gets it)."""

    def restore(self):  # pragma: no cover - a launch's scope is always Triton's own
        pass


def install() -> bool:
    """Wrap ``_patch_lang`` and the grid executor's call; returns whether it did (idempotent)."""
    try:
        from triton.runtime import interpreter as ti
    except ImportError:
        return False
    orig_patch = getattr(ti, "_patch_lang", None)
    grid = getattr(ti, "GridExecutor", None)
    if orig_patch is None or grid is None or getattr(orig_patch, "_witcert_wrapped", False):
        return bool(getattr(orig_patch, "_witcert_wrapped", False))
    tl = ti.tl

    def langs_of(fn):
        return {id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and (v is tl or v is tl.core)}

    def patch_lang(fn):
        active = _state["langs"]
        if active is None:
            return orig_patch(fn)
        need = langs_of(fn)
        if need and need <= active:
            return _NoScope()
        scope = orig_patch(fn)
        active |= need
        return scope

    patch_lang._witcert_wrapped = True
    orig_call = grid.__call__

    def call(self, *args, **kwargs):
        outer = _state["langs"]
        _state["langs"] = set()
        try:
            return orig_call(self, *args, **kwargs)
        finally:
            _state["langs"] = outer

    ti._patch_lang = patch_lang
    grid.__call__ = call
    return True
