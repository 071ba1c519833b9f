"""Speculative settings (steps/top-k/draft tokens, or off) as SGLang 0.5.23 takes them, and how the simulator
prices them: acceptance per setting and the cost of a draft + verify step, on SimConfig values only."""

from __future__ import annotations

import pytest

from dagster_project.sglang.launch import ServerOptions, server_command
from dagster_project.sglang.profiles.profile import ROOFLINE_SPECS, SEED_SPEC, fit_linear_step, profile_named
from dagster_project.sglang.sim import speculation
from dagster_project.sglang.sim.config import SimConfig
from dagster_project.sglang.sim.rates import steady_output_rate
from dagster_project.sglang.speculative import RECIPE, SpecSetting, parse_list, parse_setting

MEASURED = (0.1, 0.1, 0.2, 0.6)  # at 3/1/4: 2.3 drafts accepted per pass, accept length 3.3


def mean_drafts(probs) -> float:
    return sum(k * p for k, p in enumerate(probs))


def test_settings_parse_as_sglang_takes_them_and_bad_ones_are_refused_with_the_reason():
    assert parse_setting("off") is None and parse_setting(" 3/1/4 ") == RECIPE
    assert parse_list("off, 2/1/3,3/2/6") == [None, SpecSetting(2, 1, 3), SpecSetting(3, 2, 6)]
    with pytest.raises(ValueError, match="forces the draft tokens to steps"):
        parse_setting("3/1/6")  # a chain verifies steps + 1 tokens, whatever is asked
    with pytest.raises(ValueError, match="STEPS/TOPK/DRAFT_TOKENS"):
        parse_setting("3-1-4")
    with pytest.raises(ValueError, match="listed twice"):
        parse_list("off,off")
    assert SpecSetting(3, 2, 6).reserved_tokens == 6 and SpecSetting(4, 2, 5).reserved_tokens == 8


def test_a_launch_serves_the_setting_asked_and_none_when_off():
    text = " ".join(server_command(ServerOptions(speculative="2/1/3"), 30000))
    assert "--speculative-num-steps 2 --speculative-eagle-topk 1 --speculative-num-draft-tokens 3" in text
    off = server_command(ServerOptions(speculative="off"), 30000)
    assert not [arg for arg in off if arg.startswith("--speculative")]
    assert ServerOptions(speculative="off").launch_settings().speculative_draft_tokens == 0
    with pytest.raises(ValueError, match="forces"):
        ServerOptions(speculative="2/1/4")


def test_acceptance_is_the_measured_one_at_its_chain_and_keeps_its_per_draft_rate_elsewhere():
    assert speculation.accept_probs(MEASURED, RECIPE) == MEASURED
    p = speculation.per_draft_acceptance(mean_drafts(MEASURED), 3)
    assert p + p**2 + p**3 == pytest.approx(mean_drafts(MEASURED))
    chains = [speculation.accept_probs(MEASURED, SpecSetting(n, 1, n + 1)) for n in (1, 2, 5)]
    assert all(sum(probs) == pytest.approx(1) and len(probs) == n + 2 for n, probs in zip((0, 1, 4), chains))
    one, two, five = map(mean_drafts, chains)
    assert one == pytest.approx(p) and one < two < mean_drafts(MEASURED) < five < 5  # longer chains, more, less each
    tree = speculation.accept_probs(MEASURED, SpecSetting(3, 2, 7))  # two candidates per level catch more
    assert mean_drafts(tree) > p + p**2 + p**3


def test_the_step_cost_is_the_recipes_own_formula_and_prices_the_others_from_it():
    for growth, batch in ((0.0, 1), (0.02, 1), (0.02, 64), (0.3, 9)):
        assert speculation.step_factor(RECIPE, growth, batch) == pytest.approx(1 + growth * (batch - 1))
    # Without drafts a step is cheaper; the gap widens with the batch (the verify pass's extra tokens).
    small = speculation.step_factor(None, 0.02, 1) / speculation.step_factor(RECIPE, 0.02, 1)
    large = speculation.step_factor(None, 0.02, 128) / speculation.step_factor(RECIPE, 0.02, 128)
    assert large < small < 1
    assert speculation.step_factor(SpecSetting(5, 1, 6), 0.02, 64) > speculation.step_factor(RECIPE, 0.02, 64)


def test_mtp_pays_at_a_small_batch_and_can_stop_paying_at_saturation():
    curve = {"decode_step_s": 0.01, "decode_step_growth": 0.05, "max_running_requests": 256, "accept_decay_batch": 40}

    def gain(batch: int) -> float:
        on = steady_output_rate(SimConfig(**curve, accept_probs=MEASURED), batch, 2000)
        off = steady_output_rate(SimConfig(**curve, speculative=False), batch, 2000)
        return on / off

    assert gain(1) > 2 and gain(256) < 1


def test_the_simulator_reports_the_setting_it_serves():
    config = SimConfig(speculative_num_steps=2)
    assert (config.speculative_num_steps, config.speculative_eagle_topk, config.spec_draft_tokens) == (2, 1, 3)
    assert config.reserved_prompt_tokens == 3 and len(config.draft_accept_probs) == 3
    assert (
        SimConfig(speculative=False).spec_setting is None and SimConfig(speculative=False).reserved_prompt_tokens == 0
    )


@pytest.mark.parametrize(("name", "tolerance"), [("h200-bf16", 0.02), ("b200-bf16", 0.02), ("b200-fp8", 0.10)])
def test_the_simulators_pricing_follows_the_gpu_profiles_roofline_for_every_setting(name, tolerance):
    profile = profile_named(name)
    step_1, growth = fit_linear_step(profile.curve(SEED_SPEC), (1, 64))
    for spec in ROOFLINE_SPECS:
        setting = SpecSetting(spec.steps, spec.topk, spec.draft_tokens) if spec.enabled else None
        for running in (1, 16, 64):
            priced = step_1 * speculation.step_factor(setting, growth, running)
            assert priced == pytest.approx(profile.curve(spec).step_s(running), rel=tolerance), (spec.label, running)
