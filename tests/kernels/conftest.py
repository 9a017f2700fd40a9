"""Fixtures of the kernel tests."""

import pytest


@pytest.fixture
def fused_merge_kernel(monkeypatch):
    """Off the GPU the decode serves its merge with the torch twin by default (the interpreter is
    slow); the conformance suite runs the fused Triton merge / epilogue itself
    (``pytest.mark.usefixtures("fused_merge_kernel")``)."""
    import kernels.decode as Dk

    monkeypatch.setattr(Dk, "MERGE_OFF_GPU", "kernel")


@pytest.fixture(params=[8])
def refined_tilt(request, monkeypatch):
    """The tilt's refinement on (``epilogue_jit.REFINE_TOP``: 0, the coarse grid alone, by default since run Y11):
    the tests of the refinement and its stop run with the ``param`` largest coarse intervals refinable (the kernel
    launches, the twin and the bridge read it at call time)."""
    import kernels.epilogue_jit as EJ

    monkeypatch.setattr(EJ, "REFINE_TOP", request.param)
    return request.param
