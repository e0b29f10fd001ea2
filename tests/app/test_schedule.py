"""The learning-rate schedule, written once and read by both trainers step by step."""

from __future__ import annotations

import math

import pytest

from multihead.app.schedule import learning_rate


def test_warms_up_linearly_then_decays_with_the_inverse_square_root() -> None:
    peak, warmup = 2e-3, 100
    assert learning_rate(1, peak=peak, warmup=warmup) == pytest.approx(peak / warmup)
    assert learning_rate(50, peak=peak, warmup=warmup) == pytest.approx(peak / 2)
    assert learning_rate(100, peak=peak, warmup=warmup) == pytest.approx(peak)
    assert learning_rate(400, peak=peak, warmup=warmup) == pytest.approx(peak / 2)
    assert learning_rate(10_000, peak=peak, warmup=warmup) == pytest.approx(peak / 10)
    rates = [learning_rate(step, peak=peak, warmup=warmup) for step in range(1, 1000)]
    assert max(rates) == pytest.approx(peak)
    assert rates.index(max(rates)) == warmup - 1


def test_is_the_papers_formula_with_its_own_peak() -> None:
    """The paper: d_model^-0.5 · min(step^-0.5, step · warmup^-1.5), whose peak is (d_model · warmup)^-0.5."""
    d_model, warmup = 512, 4000
    for step in (1, 10, 3999, 4000, 4001, 100_000):
        paper = d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
        assert learning_rate(step, peak=(d_model * warmup) ** -0.5, warmup=warmup) == pytest.approx(paper)


def test_step_zero_is_read_as_the_first_step() -> None:
    assert learning_rate(0, peak=1.0, warmup=10) == learning_rate(1, peak=1.0, warmup=10)
    assert math.isfinite(learning_rate(0, peak=1.0, warmup=1))
