"""mi_metrics.permutation_null: a null whose std is 0 up to float rounding gives z = NaN (docs/metrics.md)."""
import math

import numpy as np

import mi_metrics as mm


def test_constant_null_gives_nan_z_even_with_rounding_noise():
    # every row scores column 0 highest, so the prediction never moves and every shuffle of the labels (3 of 10
    # rows labelled 0) gives retrieval accuracy 0.3; averaging 50 copies of 0.3 leaves a std of 5.55e-17, not 0
    L = np.array([[-1.0, -2.0]] * 10) + np.linspace(0, 1e-3, 10)[:, None]
    col = np.array([0] * 3 + [1] * 7)
    null = mm.permutation_null(L, L, col, None, 50, np.random.default_rng(0), lengths=[1] * 10)
    assert 0 < null["retrieval_accuracy_null_std"] < 1e-12                 # the rounding the rule must absorb
    assert math.isnan(null["retrieval_accuracy_null_z"])


def test_varying_null_gives_a_finite_z():
    rng = np.random.default_rng(1)
    L = rng.normal(size=(8, 4))
    L[np.arange(8), np.repeat(np.arange(4), 2)] += 3.0                 # input-dependent: own prompt scores best
    null = mm.permutation_null(L, L, np.repeat(np.arange(4), 2), None, 200, np.random.default_rng(0),
                               lengths=[1] * 8)
    assert null["mi_seq_estimate_null_std"] > 0 and null["mi_seq_estimate_null_z"] > 2
    assert math.isfinite(null["retrieval_accuracy_null_z"])
