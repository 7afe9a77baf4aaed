import numpy as np

from common.vectors import l2_normalize


def test_rows_become_unit_length_float32_and_contiguous():
    x = np.random.default_rng(0).normal(size=(5, 7)).astype(np.float64)[:, ::2]  # float64, strided
    y = l2_normalize(x)
    assert y.dtype == np.float32 and y.flags.c_contiguous and y.shape == (5, 4)
    np.testing.assert_allclose(np.linalg.norm(y, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(y, x / np.linalg.norm(x, axis=1, keepdims=True), rtol=1e-6)


def test_a_single_vector_is_normalised_along_its_only_axis():
    np.testing.assert_allclose(l2_normalize([3.0, 4.0]), [0.6, 0.8], rtol=1e-6)


def test_vectors_without_direction_become_zero_and_nan_stays_nan():
    x = np.array([[0.0, 0.0], [1e-30, 0.0], [np.nan, 1.0], [2.0, 0.0]], np.float32)
    y = l2_normalize(x)
    assert y[0].tolist() == [0.0, 0.0] and y[1].tolist() == [0.0, 0.0]  # not a unit vector out of noise
    assert np.isnan(y[2]).all()
    assert y[3].tolist() == [1.0, 0.0]
