"""Generation settings and their fingerprint.

The fingerprint covers everything that changes what the model is asked or how it samples. It is stored
in every completions manifest and journal, so a shard generated under other settings is recognised as
stale and never mixed with new results.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field

import orjson

from dagster_project.records import POLICIES
from dagster_project.sglang.protocol import sampling_params


@dataclass(frozen=True)
class GenerationSettings:
    # Qwen3.6 model card, thinking mode, general tasks.
    max_new_tokens: int = field(default=32768, metadata={"help": "Cap on generated tokens per assistant turn."})
    temperature: float = 1.0
    top_p: float = 0.95
    top_k: int = 20
    min_p: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    enable_thinking: bool = field(default=True, metadata={"help": "Ask for reasoning before the answer."})
    preserve_thinking: bool = field(default=False, metadata={"help": "Keep earlier turns' reasoning in prompts."})
    policy: str = field(default="all_turns", metadata={"help": f"Multi-turn policy: {', '.join(POLICIES)}."})

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown multi-turn policy {self.policy!r}; choose one of {', '.join(POLICIES)}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    def sampling_params(self) -> dict:
        """Every sampling parameter explicit: /generate applies no generation_config defaults."""
        return sampling_params(
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            presence_penalty=self.presence_penalty,
            repetition_penalty=self.repetition_penalty,
        )

    def fingerprint(self) -> str:
        return hashlib.sha256(orjson.dumps(asdict(self), option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]
