"""The per-client generator is NumPy's ``default_rng`` of the key, however it is seeded."""

import numpy as np
import pytest

from rayfl import rng


@pytest.mark.parametrize("key", [(0, 0, 0, rng.BATCHES), (2**32 - 1, 7, 99_999, rng.FINETUNE),
                                 (2**32, 1, 2, rng.BATCHES), (5, 3, 2**40, rng.EVAL_SAMPLE),
                                 (123, 2**31, 1_000_000, rng.BATCHES)])
def test_client_stream_is_default_rng_of_the_key(key):
    ours, reference = rng.client_stream(*key), np.random.default_rng(list(key))
    assert ours.bit_generator.state == reference.bit_generator.state
    assert (ours.permutation(64) == reference.permutation(64)).all()


def test_a_negative_key_is_refused_as_numpy_refuses_it():
    with pytest.raises(ValueError):
        rng.client_stream(-1, 0, 0)
