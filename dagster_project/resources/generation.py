import dagster as dg
from pydantic import Field

from dagster_project.generation_settings import GenerationSettings

DEFAULTS = GenerationSettings()


class GenerationConfig(dg.ConfigurableResource):
    """How every answer is generated. Defaults: the Qwen3.6 model card's thinking-mode settings.

    The values are fingerprinted into each completions manifest: changing any of them makes the shards
    generated under the old values stale instead of silently mixing settings.
    """

    max_new_tokens: int = Field(
        default=DEFAULTS.max_new_tokens, description="Cap on generated tokens per assistant turn."
    )
    temperature: float = DEFAULTS.temperature
    top_p: float = DEFAULTS.top_p
    top_k: int = DEFAULTS.top_k
    min_p: float = DEFAULTS.min_p
    presence_penalty: float = DEFAULTS.presence_penalty
    repetition_penalty: float = DEFAULTS.repetition_penalty
    enable_thinking: bool = DEFAULTS.enable_thinking
    preserve_thinking: bool = Field(
        default=DEFAULTS.preserve_thinking, description="Keep earlier turns' reasoning in prompts."
    )
    policy: str = Field(
        default=DEFAULTS.policy, description="Multi-turn policy: all_turns, last_turn, first_turn, user_only."
    )

    def settings(self) -> GenerationSettings:
        return GenerationSettings(**self.model_dump())
