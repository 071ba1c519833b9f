"""The simulator's throughput in closed form: what its scheduler and acceptance model produce in steady state.

A decode step of `running` requests takes `decode_step_s x (1 + decode_step_growth x (running - 1))` under the
model card's MTP 3/1/4, and `speculation.step_factor` of `decode_step_s` under another setting or none; a request
of L output tokens spends `ttft_s + prompt x prefill_s_per_token` in prefill, then (L - 1) / a verify passes of
one step each, where a is the mean tokens per pass at that batch (`AcceptModel.mean_tokens_per_pass`; one
without speculative decoding). With c requests in flight the batch is b = min(c, cap) (past the cap requests
queue), and the server writes b x L tokens per request duration. Benchmarks compute the true knee from this.
"""

from __future__ import annotations

from dagster_project.sglang.sim import speculation
from dagster_project.sglang.sim.config import SimConfig
from dagster_project.sglang.sim.outputs import AcceptModel


def decode_pace(config: SimConfig, running: int) -> float:
    """Decode speed with `running` requests relative to a batch of one under the model card's MTP 3/1/4."""
    return 1.0 / speculation.step_factor(config.spec_setting, config.decode_step_growth, max(1, running))


def steady_output_rate(config: SimConfig, concurrency: int, output_tokens: float, prompt_tokens: int = 0) -> float:
    """Output tokens/s of one simulator with `concurrency` requests in flight, answers of `output_tokens`."""
    batch = max(1, min(concurrency, config.running_cap))
    step = config.decode_step_s / decode_pace(config, batch)
    per_pass = 1.0
    if config.speculative:
        accept = AcceptModel(
            config.draft_accept_probs, config.accept_decay_tokens, config.seed, config.accept_decay_batch
        )
        per_pass = accept.mean_tokens_per_pass(prompt_tokens, batch)
    duration = config.ttft_s + prompt_tokens * config.prefill_s_per_token + (output_tokens - 1) / per_pass * step
    return batch * output_tokens / duration
