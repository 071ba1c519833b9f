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

# DFlash needs two consecutive supervised tokens for an anchor: a row with less room is not worth a request.
MIN_OUTPUT_TOKENS = 2
# What the chat template writes after an answer that a training row holds and the model does not generate: none.
# The model writes the turn's closing `<|im_end|>` itself, as its last output token (counted by max_new_tokens),
# and a row is prompt + output, so the template's "\n" after it is in no row.
TEMPLATE_CLOSING_TOKENS = 0
# How an answer ended when it stopped at its `max_new_tokens: fit` cap (`GenerationSettings.answer_end`): where the
# trainer cuts its row anyway, so neither length-capped nor an error; every gate, the watch and the suite count it so.
FIT_CUT = "fit_cut"


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
    fit_max_length: int | None = field(
        default=None,
        metadata={
            "help": "max_new_tokens: fit. The trainer's max_length (e.g. 4096): each request's max_new_tokens becomes "
            "that minus its prompt's tokens (never above max_new_tokens), so nothing is generated that the trainer "
            "cuts, and a prompt that leaves no room is not sent; the set then cannot be trained at a longer "
            "max_length. Unset: max_new_tokens for every request."
        },
    )

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown multi-turn policy {self.policy!r}; choose one of {', '.join(POLICIES)}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.fit_max_length is not None and self.fit_max_length <= MIN_OUTPUT_TOKENS:
            raise ValueError(
                f"fit_max_length must leave room for {MIN_OUTPUT_TOKENS} output tokens, got {self.fit_max_length}"
            )

    def request_cap(self, prompt_tokens: int) -> int:
        """A request's max_new_tokens: the cap, or under fit what the trainer's row leaves after the prompt (and the
        template's closing tokens) if less. Under `MIN_OUTPUT_TOKENS`: the prompt fills the row, nothing to send."""
        if self.fit_max_length is None:
            return self.max_new_tokens
        return min(self.max_new_tokens, self.fit_max_length - prompt_tokens - TEMPLATE_CLOSING_TOKENS)

    def cut_by_fit(self, prompt_tokens: int, output_tokens: int, finish_reason: str | None) -> bool:
        """Whether an answer stopped at its fitted cap (below max_new_tokens): cut where the trainer would cut it."""
        cap = self.request_cap(prompt_tokens)
        return finish_reason == "length" and cap < self.max_new_tokens and output_tokens >= cap

    def answer_end(self, prompt_tokens: int, output_tokens: int, finish_reason: str | None) -> str | None:
        """How an answer ended, as the gates count it: its finish_reason, or `FIT_CUT` where fit cut it (`length`
        then means what it says: cut by max_new_tokens, length-capped)."""
        return FIT_CUT if self.cut_by_fit(prompt_tokens, output_tokens, finish_reason) else finish_reason

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
        settings = asdict(self)
        if settings["fit_max_length"] is None:  # unset, the settings fingerprint as they did before fit existed
            del settings["fit_max_length"]
        return hashlib.sha256(orjson.dumps(settings, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]
