"""The sizing's search: started from the last tick's count, it finds what a bisection over
the whole range finds, in fewer evaluations."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscalerd.decide import replica_model, sizing


def model(
    slots: int, speed: float, tpot_s: float, slope_s: float, prompt: float, output: float
) -> replica_model.ReplicaView:
    mix = ((0.0, prompt, 0.5), (prompt, 4 * prompt, 0.4), (4 * prompt, float("inf"), 0.1))
    return replica_model.ReplicaView(
        slots=slots,
        prefill_tokens_per_s=speed,
        tpot_batch1_s=tpot_s,
        tpot_slope_s=slope_s,
        prompt_tokens_mean=prompt,
        prompt_tokens_sq_mean=3.0 * prompt * prompt,
        output_tokens_mean=output,
        slot_time_observed_s=None,
        estimates=(),
        prompt_mix=mix,
    )


models = st.builds(
    model,
    slots=st.integers(1, 256),
    speed=st.floats(2_000.0, 200_000.0),
    tpot_s=st.floats(0.002, 0.08),
    slope_s=st.floats(0.0, 0.001),
    prompt=st.floats(50.0, 20_000.0),
    output=st.floats(0.0, 2_000.0),
)
rate_mixes = st.lists(st.tuples(st.floats(0.1, 400.0), st.floats(0.01, 1.0)), max_size=4).map(
    lambda groups: tuple(sorted(groups, reverse=True))
)
inputs = st.builds(
    sizing.SizingInputs,
    arrival_rate_per_s=st.floats(0.01, 300.0),
    peak_to_mean=st.floats(1.0, 30.0),
    tick_s=st.just(1.0),
    wait_budget_s=st.floats(0.05, 5.0),
    tail_share=st.floats(0.001, 0.1),
    capacity_factor=st.floats(0.5, 1.0),
    level_per_s=st.one_of(st.none(), st.floats(0.01, 300.0)),
    ttft_s=st.one_of(st.none(), st.floats(0.2, 10.0)),
    clumps=st.lists(
        st.tuples(st.sampled_from([2.0, 8.0, 32.0]), st.floats(1.0, 5_000.0)), max_size=3
    ).map(tuple),
    rate_mix=rate_mixes,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(models, inputs, st.integers(1, 96), st.integers(-5, 120))
def test_a_search_started_anywhere_finds_what_bisection_finds(
    view: replica_model.ReplicaView, sized: sizing.SizingInputs, high: int, near: int
) -> None:
    plain = sizing.size(view, sized, high)
    assert sizing.size(view, sized, high, near) == plain
    # The count found holds and, above the minimum, one fewer does not: it is the edge.
    if 1 < plain.replicas < high:
        tail, _, _, fits = sizing.predicted_tail(view, sized, plain.replicas - 1)
        assert not (fits and tail <= sized.tail_share)


def test_from_the_right_count_two_evaluations_settle_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    view = model(16, 20_000.0, 0.02, 0.0002, 800.0, 200.0)
    sized = sizing.SizingInputs(40.0, 1.5, 1.0, 0.5, 0.01)
    answer = sizing.size(view, sized, 64).replicas
    assert 2 < answer < 64
    asked: list[int] = []
    real = sizing.predicted_tail

    def counted(
        v: replica_model.ReplicaView, i: sizing.SizingInputs, replicas: int
    ) -> tuple[float, float | None, float, bool]:
        asked.append(replicas)
        return real(v, i, replicas)

    monkeypatch.setattr(sizing, "predicted_tail", counted)
    # From the answer: it and one fewer (the record reuses the answer's evaluation; the
    # binding condition asks once more, one below, without bursts).
    assert sizing.size(view, sized, 64, answer).replicas == answer
    assert asked == [answer, answer - 1, answer - 1]
    asked.clear()
    # Without a start: a bisection over 1..64.
    assert sizing.size(view, sized, 64).replicas == answer
    assert len(asked) >= 7
    asked.clear()
    # One off either way: three evaluations and the binding's.
    assert sizing.size(view, sized, 64, answer + 1).replicas == answer
    assert asked == [answer + 1, answer, answer - 1, answer - 1]
    asked.clear()
    assert sizing.size(view, sized, 64, answer - 1).replicas == answer
    assert asked == [answer - 1, answer, answer - 1]
    # A start past the bound is ignored; the answer is the same.
    assert sizing.size(view, dataclasses.replace(sized), 64, 500).replicas == answer
