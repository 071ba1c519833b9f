"""Random weights for the real-SGLang tier's tiny model; run by the SGLang environment's python (torch and
transformers are there, not in the project's environment):

    .venv-sglang/bin/python tests/support/tiny_model_weights.py MODEL_DIR

`MODEL_DIR` already holds `config.json` (written by `tests/support/sglang_real.py`); this adds
`model.safetensors`: a `Qwen3ForCausalLM` of that config, seeded, in bfloat16. Nothing is downloaded.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def main(directory: Path) -> None:
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(directory, local_files_only=True)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(directory, safe_serialization=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
