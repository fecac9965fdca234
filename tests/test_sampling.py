"""Sampling: the order of the stages, their masks, greedy, seeding and validation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chatcli.engine.sample.sampling import (
    InvalidParameter,
    SamplingParams,
    apply_repetition_penalty,
    candidates,
    logits_to_probs,
    new_generator,
    sample,
)

OPEN = dict(top_k=0, top_p=1.0, min_p=0.0)  # every filter off


def logits_from(values):
    return np.asarray(values, dtype=np.float32)


def nonzero(probs) -> list[int]:
    return np.flatnonzero(probs).tolist()


def test_temperature_zero_is_argmax():
    logits = logits_from([0.1, 3.0, 2.9, -1.0])
    assert sample(logits, SamplingParams(temperature=0)) == 1


def test_top_k_one_equals_greedy():
    logits = new_generator(0).standard_normal(500).astype(np.float32)
    params = SamplingParams(temperature=1.3, top_k=1, top_p=1.0, min_p=0.0)
    greedy = sample(logits, SamplingParams(temperature=0))
    assert all(sample(logits, params, new_generator(s)) == greedy for s in range(20))


def test_top_k_keeps_k_highest():
    probs = logits_to_probs(
        logits_from([1.0, 5.0, 3.0, 4.0, 2.0]), SamplingParams(temperature=1.0, **{**OPEN, "top_k": 2})
    )
    assert nonzero(probs) == [1, 3]
    assert math.isclose(float(probs.sum()), 1.0, rel_tol=1e-6)


def test_top_p_keeps_smallest_set_reaching_p_and_always_the_top_token():
    logits = np.log(logits_from([0.5, 0.3, 0.15, 0.05]))

    def kept(p):
        return nonzero(logits_to_probs(logits, SamplingParams(temperature=1.0, **{**OPEN, "top_p": p})))

    assert kept(0.5) == [0]
    assert kept(0.7) == [0, 1]
    assert kept(0.81) == [0, 1, 2]
    assert kept(1e-6) == [0]  # the top token always stays


def test_top_p_ties_are_stable():
    logits = logits_from([1.0, 1.0, 1.0, 1.0])
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, **{**OPEN, "top_p": 0.5}))
    assert nonzero(probs) == [0, 1]  # the earlier of equal tokens wins


def test_min_p_drops_tokens_below_fraction_of_top():
    logits = np.log(logits_from([0.6, 0.25, 0.1, 0.05]))
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, **{**OPEN, "min_p": 0.2}))
    assert nonzero(probs) == [0, 1]  # 0.1 < 0.2 * 0.6
    assert math.isclose(float(probs.sum()), 1.0, rel_tol=1e-6)


def test_repetition_penalty_divides_positive_and_multiplies_negative():
    out = apply_repetition_penalty(logits_from([2.0, -2.0, 1.0]), [0, 1], 2.0)
    assert out.tolist() == [1.0, -4.0, 1.0]


def test_repetition_penalty_applies_before_greedy():
    logits = logits_from([3.0, 2.0])
    assert sample(logits, SamplingParams(temperature=0, repeat_penalty=2.0), recent_ids=[0]) == 1


def test_seeded_generator_repeats():
    logits = new_generator(1).standard_normal(1000).astype(np.float32)
    params = SamplingParams(temperature=1.0, **OPEN)

    def draw(seed):
        return [sample(logits, params, g) for g in [new_generator(seed)] for _ in range(30)]

    assert draw(5) == draw(5)
    assert draw(5) != draw(6)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(-20, 20), min_size=2, max_size=40),
    st.floats(0.05, 3.0),
    st.integers(0, 50),
    st.floats(0.01, 1.0),
    st.floats(0.0, 1.0),
)
def test_probs_are_a_distribution_with_the_top_token(values, temperature, top_k, top_p, min_p):
    logits = logits_from(values)
    probs = logits_to_probs(logits, SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p))
    assert math.isclose(float(probs.sum()), 1.0, rel_tol=1e-5)
    assert probs[int(np.argmax(logits))] > 0
    assert bool((probs >= 0).all())


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("temperature", -0.1, "temperature must be >= 0"),
        ("top_p", 0.0, "top-p must be in (0, 1]"),
        ("top_p", 1.5, "top-p must be in (0, 1]"),
        ("top_k", -1, "top-k must be >= 0"),
        ("min_p", 1.1, "min-p must be in [0, 1]"),
        ("min_p", -0.1, "min-p must be in [0, 1]"),
        ("max_tokens", 0, "max-tokens must be >= 1"),
        ("temperature", float("nan"), "temperature"),
        ("seed", -1, "seed must be in [0, 2**64)"),
        ("seed", 2**64, "seed must be in [0, 2**64)"),
        ("logit_bias", ("5=1", "123=abc"), 'ID=BIAS, or {"ID": BIAS}), got 123=abc'),  # the item, as typed
    ],
)
def test_out_of_range_values_are_refused(field, value, words):
    with pytest.raises(InvalidParameter) as err:
        SamplingParams(**{field: value})
    assert words in str(err.value)


def test_top_k_keeps_ties_with_the_kth_in_id_order():
    probs, ids = candidates(
        logits_from([1.0, 3.0, 2.0, 2.0, 2.0, 0.5]), SamplingParams(temperature=1.0, **{**OPEN, "top_k": 2})
    )
    assert ids.tolist() == [1, 2, 3, 4]  # the k-th value, 2.0, is shared by three ids: all stay, lowest id first
    assert probs[1] == probs[2] == probs[3]


def test_draws_follow_the_probabilities():
    """Over many draws each candidate comes up as often as its probability says (and a removed one never)."""
    logits = np.log(logits_from([0.5, 0.3, 0.15, 0.05]))
    params = SamplingParams(temperature=1.0, **{**OPEN, "top_p": 0.9})  # keeps the first three
    gen = new_generator(3)
    counts = np.bincount([sample(logits, params, gen) for _ in range(20000)], minlength=4) / 20000
    expected = np.array([0.5, 0.3, 0.15, 0.0]) / 0.95
    assert np.abs(counts - expected).max() < 0.015
    assert counts[3] == 0


def test_presence_and_frequency_penalties_are_openais():
    from chatcli.engine.sample.sampling import apply_presence_frequency

    logits = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
    out = apply_presence_frequency(logits, [3, 3, 1], presence=0.5, frequency=0.25)
    assert out.tolist() == [1.0, 2.0 - 0.5 - 0.25, 3.0, 4.0 - 0.5 - 0.5]
    assert apply_presence_frequency(logits, [3], 0.0, 0.0) is logits
    params = SamplingParams(temperature=0, frequency_penalty=2.0)
    assert sample(logits, params, recent_ids=[3]) == 2  # 4 - 2 < 3: the seen token loses its lead
    assert sample(logits, SamplingParams(temperature=0), recent_ids=[3]) == 3


def test_logit_bias_is_added_first_and_minus_100_bans():
    logits = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
    assert sample(logits, SamplingParams(temperature=0, logit_bias={"3": -100})) == 2
    assert sample(logits, SamplingParams(temperature=0, logit_bias=("0=10",))) == 0
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, logit_bias={"3": -100})
    draws = {sample(logits, params, np.random.default_rng(s)) for s in range(200)}
    assert 3 not in draws and draws == {0, 1, 2}
    assert sample(logits, SamplingParams(temperature=0, logit_bias={"99": 50})) == 3  # past the vocabulary: ignored


def test_a_huge_temperature_is_a_uniform_draw_without_a_warning():
    import warnings

    logits = logits_from([3.0, 1.0, -2.0, 0.5])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's overflow RuntimeWarning fails the test
        probs = logits_to_probs(logits, SamplingParams(temperature=1e300, **OPEN))
    assert np.allclose(probs, 0.25)


@pytest.mark.parametrize("vocab, k", [(262_144, 40), (151_936, 40), (128_257, 1), (50_000, 2000), (5_000, 40)])
def test_top_k_ids_are_the_k_largest_and_their_ties(vocab, k):
    from chatcli.engine.sample.sampling import top_k_ids

    rng = np.random.default_rng(vocab + k)
    logits = (3 * rng.standard_normal(vocab)).astype(np.float32)
    logits[rng.choice(vocab, vocab // 3, replace=False)] = -np.inf  # a grammar's mask
    logits[-1] = logits.max() + 1  # in the tail past the last whole chunk, where the vocabulary has one
    kth = np.sort(logits)[-k]
    logits[rng.choice(np.flatnonzero(logits < kth), 3, replace=False)] = kth  # ties with the k-th, anywhere
    want = np.flatnonzero(logits >= np.sort(logits)[-k])
    assert np.array_equal(top_k_ids(logits, k), want)
    assert len(want) == k + 3
