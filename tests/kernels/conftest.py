"""Fixtures of the kernel tests."""

import pytest


@pytest.fixture
def fused_merge_kernel(monkeypatch):
    """Off the GPU the decode serves its merge with the torch twin by default (the interpreter is
    slow); the conformance suite runs the fused Triton merge / epilogue itself
    (``pytest.mark.usefixtures("fused_merge_kernel")``)."""
    import kernels.decode as Dk

    monkeypatch.setattr(Dk, "MERGE_OFF_GPU", "kernel")
