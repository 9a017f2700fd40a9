"""witcert.bounds public API: names, shapes, library types, validation, saturation."""

import numpy as np
import pytest
import torch

import witcert.bounds as B

PUBLIC = [
    "group_slices", "group_norms", "rope", "key_witness", "value_witness", "logit_radius", "tv",
    "tv_bound_tanh", "tv_bound_eform", "tv_bound_tilt", "tv_bound", "tv_sup_bruteforce",
    "output_error_bound", "dither_variance_proxy", "dither_radius", "step_budget",
]


def test_public_names():
    for name in PUBLIC:
        assert callable(getattr(B, name)) and name in B.__all__


def test_witness_shapes_blocks_and_rounding_up():
    g = B.group_slices(8, 2)
    k = np.zeros((3, 2, 21, 8))
    kh = k.copy()
    kh[0, 1, 20, 0] = 3.0  # last, partial block
    kh[0, 1, 3, 7] = 4.0
    W = B.key_witness(k, kh, g, block_size=16)
    assert W.shape == (3, 2, 2, 2)
    assert W[0, 1, 1, 0] >= 3.0 and W[0, 1, 0, 1] >= 4.0 and W[0, 1, 0, 0] == 0.0
    per_tok = B.key_witness(k, kh, g, block_size=1)
    assert per_tok.shape == (3, 2, 21, 2)
    phi = B.value_witness(k, kh, block_size=16)
    assert phi.shape == (3, 2, 2) and phi[0, 1, 0] >= 4.0
    eps = B.logit_radius(np.ones((3, 2, 8)), W, g, 0.5, block_size=16, n=21)
    assert eps.shape == (3, 2, 21)
    assert np.all(eps[0, 1, 16:] >= 0.5 * 2.0 * 3.0)  # ‖q[g0]‖ = 2


def test_logit_radius_bad_inputs():
    g = B.group_slices(8, 2)
    W = np.ones((4, 2))
    with pytest.raises(ValueError, match="key_witness"):
        B.logit_radius(np.ones(8), np.ones((4, 3)), g, 1.0)
    with pytest.raises(ValueError, match="key_witness"):
        B.logit_radius(np.ones(8), -W, g, 1.0)
    with pytest.raises(ValueError, match="n:"):
        B.logit_radius(np.ones(8), W, g, 1.0, block_size=16, n=100)
    with pytest.raises(ValueError, match="scale"):
        B.logit_radius(np.ones(8), W, g, np.ones(2))
    with pytest.raises(ValueError, match="block_size"):
        B.key_witness(np.ones((4, 8)), np.ones((4, 8)), g, block_size=0)
    with pytest.raises(ValueError, match="k_hat"):
        B.key_witness(np.ones((4, 8)), np.ones((5, 8)), g)
    with pytest.raises(ValueError, match="groups"):
        B.key_witness(np.ones((4, 8)), np.ones((4, 8)), [np.arange(4)])
    eps = B.logit_radius(np.array([np.nan] + [1.0] * 7), W, g, 1.0, block_size=1)
    assert np.all(np.isinf(eps))  # NaN saturates to an infinite radius, never 0


def test_output_bound_validation_and_saturation():
    p = np.array([0.5, 0.5])
    v = np.ones((2, 3))
    assert B.output_error_bound(p, v, np.zeros(2), 0.0) == pytest.approx(0.0, abs=1e-9)
    assert B.output_error_bound(p, v, np.array([0.1, 0.3]), 0.0) == pytest.approx(0.2, rel=1e-9)
    assert np.isinf(B.output_error_bound(p, v * np.nan, np.zeros(2), 0.1))
    assert np.isinf(B.output_error_bound(p, v, np.zeros(2), np.nan))
    with pytest.raises(ValueError, match="v_hat"):
        B.output_error_bound(p, np.ones((3, 3)), np.zeros(2), 0.1)
    with pytest.raises(ValueError, match="value_witness_per_token"):
        B.output_error_bound(p, v, np.zeros(3), 0.1)
    with pytest.raises(ValueError, match="tv_upper"):
        B.output_error_bound(p, v, np.zeros(2), -0.1)


def test_dtypes_and_devices():
    k = torch.randn(2, 5, 8, dtype=torch.bfloat16)
    kh = k.float() + 0.01
    W = B.key_witness(k, kh, B.group_slices(8, 4), 1)
    assert isinstance(W, torch.Tensor) and W.dtype == torch.float64
    assert isinstance(B.key_witness(k.float().numpy(), kh.numpy(), B.group_slices(8, 4), 1), np.ndarray)
    with pytest.raises(ValueError, match="x"):
        B.group_norms(np.array(["a", "b"]), [np.array([0, 1])])


def test_dither_radius_formula():
    V = np.array([0.0, 1.0, 4.0])
    t = B.dither_radius(V, 10, 0.01)
    np.testing.assert_allclose(t, np.sqrt(2 * V * np.log(2 * 10 / 0.01)), rtol=1e-11)
    assert np.all(t >= np.sqrt(2 * V * np.log(2 * 10 / 0.01)))
    np.testing.assert_allclose(B.dither_radius(V, 10, 0.01, bias=np.ones(3)), t + 1, rtol=1e-11)
    with pytest.raises(ValueError, match="n:"):
        B.dither_radius(V, 0, 0.1)
    with pytest.raises(ValueError, match="variance_proxy"):
        B.dither_radius(-V - 1, 3, 0.1)
