from __future__ import annotations

import dagster as dg
from pydantic import Field

from dagster_project.generation_settings import GenerationSettings


class GenerationConfig(dg.ConfigurableResource):
    """How every answer is generated. Defaults: the Qwen3.6 model card's thinking-mode settings.

    The values are fingerprinted into each completions manifest: changing any of them makes the shards
    generated under the old values stale instead of silently mixing settings.
    """

    max_new_tokens: int = Field(default=32768, description="Cap on generated tokens per assistant turn.")
    temperature: float = 1.0
    top_p: float = 0.95
    top_k: int = 20
    min_p: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    enable_thinking: bool = True
    preserve_thinking: bool = False
    policy: str = Field(default="all_turns", description="Multi-turn policy: all_turns, last_turn, first_turn, user_only.")

    def settings(self) -> GenerationSettings:
        return GenerationSettings(**self.model_dump())
