"""A tiny Qwen3 model to serve on the CPU with the real SGLang: the real-SGLang tier's (`make test-sglang`), and
anyone's who wants a real server without a GPU (README, "One real server on the CPU").

    .venv/bin/python -m dagster_project.sglang.tiny_model /tmp/tiny-qwen3 --python .venv-sglang/bin/python

A dense `Qwen3ForCausalLM` from a config with random weights (hidden 64, 2 layers, the Qwen3.6 vocabulary of
248,320 ids: 16 M parameters, 32 MB), and the project's Qwen3.6 tokenizer saved beside it. Nothing is downloaded.
Its answers are noise (the quality gates block them: lift their thresholds in the run config); its protocol is the
real server's. The weights are written by the SGLang environment's python (`make sglang-cpu`): torch and
transformers live there, not in the project's environment.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from dagster_project.sglang.model_identity import QWEN3_6_27B

# The directory's name is the served model's: the fleet resource matches a path ending in it (DFLASH_SERVED_MODEL).
TINY_MODEL_NAME = "tiny-qwen3"
# Qwen3.6's vocabulary and special ids, from its shipped config (`QWEN3_6_27B`); the layers as small as SGLang serves.
_QWEN3_6_GENERATION = json.loads(
    (Path(__file__).with_name("qwen3_6_27b") / "generation_config.json").read_text(encoding="utf-8")
)
GENERATION_CONFIG = {key: _QWEN3_6_GENERATION[key] for key in ("bos_token_id", "eos_token_id", "pad_token_id")}
TINY_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": QWEN3_6_27B.vocab_size,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "tie_word_embeddings": True,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000,
    "rms_norm_eps": 1e-06,
    "hidden_act": "silu",
    "attention_bias": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": GENERATION_CONFIG["bos_token_id"],
    "eos_token_id": QWEN3_6_27B.eos_token_id,
}
# What the fleet resource checks such a model's servers against (its name and architecture; Qwen3.6's vocabulary
# and end token are the defaults), as a job on another model sets it in the environment.
TINY_MODEL_ENV = {"DFLASH_SERVED_MODEL": TINY_MODEL_NAME, "DFLASH_SERVED_ARCHITECTURE": TINY_CONFIG["architectures"][0]}

# Run by the SGLang environment's python: a seeded model of the config in the directory, in bfloat16.
_WRITE_WEIGHTS = """
import sys, torch
from transformers import AutoConfig, AutoModelForCausalLM
torch.manual_seed(0)
config = AutoConfig.from_pretrained(sys.argv[1], local_files_only=True)
AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(sys.argv[1], safe_serialization=True)
"""


def build_tiny_model(directory: Path, python: Path) -> Path:
    """The tiny model in `directory` (made; reused when complete): config, generation config, tokenizer, then the
    random weights written by `python` (the SGLang environment's)."""
    from dagster_project.tokenizer import load_tokenizer

    directory = Path(directory)
    if (directory / "model.safetensors").is_file():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(TINY_CONFIG, indent=2) + "\n")
    (directory / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2) + "\n")
    load_tokenizer().save_pretrained(str(directory))
    subprocess.run([str(python), "-c", _WRITE_WEIGHTS, str(directory)], check=True, timeout=600)
    return directory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", type=Path, help=f"where to build it (its name is the served model's, e.g. "
                        f"{TINY_MODEL_NAME})")  # fmt: skip
    parser.add_argument(
        "--python", type=Path, required=True, help="the SGLang environment's python (make sglang-cpu: .venv-sglang)"
    )
    args = parser.parse_args(argv)
    print(build_tiny_model(args.directory, args.python))
    return 0


if __name__ == "__main__":
    sys.exit(main())
