import dataclasses

import pytest

from dagster_project.sglang import capacity
from dagster_project.sglang.profiles import anchors, constants
from dagster_project.sglang.profiles.profile import (
    SEED_SPEC,
    SPEC_OFF,
    GpuProfile,
    ProfileSpec,
    SpecSettings,
    build_profile,
    chain_accept_probs,
    profile_named,
)
from dagster_project.sglang.profiles.roofline import Workload, qwen3_6_27b_shapes, roofline_for
from dagster_project.sglang.sim import rates
from dagster_project.sglang.sim.config import SimConfig


def test_every_constant_still_matches_the_source_it_was_cited_with():
    assert constants.stale_rows() == [], "a value changed: update its source and date, then renew its fingerprint"


def test_a_value_changed_without_its_source_is_caught_by_its_fingerprint():
    row = constants.BY_NAME["b200.hbm_bandwidth"]
    changed = dataclasses.replace(row, value=9.0)
    assert constants.fingerprint_of(changed.name, changed.value, changed.unit, changed.source, changed.date) != (
        changed.fingerprint
    )


def test_the_docs_show_the_constants_table_the_code_reads():
    assert constants.docs_table() == constants.markdown_table()


def test_the_shapes_from_the_config_weigh_what_a_boot_log_shows():
    shapes = qwen3_6_27b_shapes()
    total = shapes.layers + shapes.embedding + shapes.lm_head + shapes.mtp_layer
    assert 26.5e9 < total < 27.5e9  # "27B"
    # The boot log's 52.31 GiB also holds the ~0.4B-weight vision encoder.
    assert 0.97 < shapes.weights_bytes("bf16") / capacity.GIB / capacity.QWEN3_6_27B.weights_gib < 1.0
    assert shapes.weights_bytes("fp8") < 0.56 * shapes.weights_bytes("bf16")


def test_a_step_without_drafts_at_one_request_is_the_weights_over_the_bandwidth_plus_the_overhead():
    model = roofline_for("b200")
    work = Workload(weights="bf16", spec_steps=0, context_tokens=0)
    eff, hw = model.efficiency, model.hardware
    weights = model.shapes.target_streamed * 2 / (eff.weights_bandwidth * hw.bandwidth)
    state = 2 * capacity.QWEN3_6_27B.state_bytes_per_slot() / (eff.request_bandwidth * hw.bandwidth)
    assert model.decode_step_s(1, work) == pytest.approx(eff.step_overhead_s + weights + state)


def test_decode_steps_grow_linearly_with_running_requests_while_memory_bound():
    model, work = roofline_for("b200"), Workload()
    steps = [model.decode_step_s(b, work) for b in (8, 16, 24)]
    assert steps[0] < steps[1] < steps[2]
    assert steps[2] - steps[1] == pytest.approx(steps[1] - steps[0])


def test_the_h200_is_slower_than_the_b200_by_about_their_bandwidth_ratio():
    h200, b200 = profile_named("h200-bf16"), profile_named("b200-bf16")
    ratio = b200.curve().decode_rate(16) / h200.curve().decode_rate(16)
    assert ratio == pytest.approx(8.0 / 4.8, rel=0.05)
    assert profile_named("b200-fp8").curve().decode_rate(16) > b200.curve().decode_rate(16)


def test_a_profile_survives_json_and_rejects_another_format(tmp_path):
    profile = profile_named("h200-fp8")
    assert GpuProfile.load(profile.save(tmp_path / "p.json")) == profile
    raw = profile.to_json().replace(b'"format": 1', b'"format": 99')
    with pytest.raises(ValueError, match="format 99"):
        GpuProfile.from_json(raw)


def test_the_chain_acceptance_averages_to_the_accept_length():
    probs = chain_accept_probs(3.08, 4)
    assert sum(probs) == pytest.approx(1.0)
    assert 1 + sum(k * p for k, p in enumerate(probs)) == pytest.approx(3.08)


def test_the_simulator_with_a_profiles_options_runs_at_the_profiles_rate():
    profile = profile_named("b200-bf16")
    config = SimConfig(**profile.sim_options(SEED_SPEC))
    output = 2472
    simulated = rates.steady_output_rate(config, 16, output)
    expected = profile.curve(SEED_SPEC).decode_rate(16) * output / (output - 1)
    assert simulated == pytest.approx(expected, rel=0.03)
    assert config.running_cap >= 16  # the memory model of the profile runs the seed's batch
    assert SimConfig(**profile.sim_options(SPEC_OFF)).speculative is False
    # Every setting's own curve, though the simulator prices the others from its 3/1/4 step.
    for spec in (SPEC_OFF, SpecSettings(1, 1, 2)):
        config = SimConfig(**profile.sim_options(spec))
        simulated = rates.steady_output_rate(config, 16, output)
        assert simulated == pytest.approx(profile.curve(spec).decode_rate(16) * output / (output - 1), rel=0.03)


def test_the_b200_profiles_meet_their_anchors():
    checks = anchors.checks()
    assert all(check.within for check in checks), [(c.anchor, round(c.ratio, 3)) for c in checks]
    assert {check.tolerance for check in checks} == {anchors.SEED_TOLERANCE, anchors.PUBLIC_TOLERANCE, None}


def test_the_fitted_efficiency_in_the_table_is_the_one_the_seed_gives():
    fitted = anchors.fit_request_bandwidth_efficiency()
    assert constants.value("request_bandwidth_efficiency") == pytest.approx(fitted, rel=0.01), (
        f"refit: the seed now gives {fitted:.3f}"
    )


def test_every_assumption_and_fitted_value_is_flagged_in_a_built_profile():
    profile = build_profile(ProfileSpec("b200"))
    assert {row.name for row in constants.TABLE if row.flagged} <= set(profile.flagged)
