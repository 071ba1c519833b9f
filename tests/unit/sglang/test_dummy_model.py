"""The Qwen3.6-27B model directory for `--load-format dummy`: its architecture is the capacity model's, and
transformers reads it as SGLang will (config, tokenizer) without any weights or network."""

from __future__ import annotations

import json

from dagster_project.sglang.capacity import QWEN3_6_27B
from dagster_project.sglang.dummy_model import MODEL_FILES, write_dummy_model
from dagster_project.sglang.sim.config import MODEL_VOCAB_SIZE
from dagster_project.tokenizer import special_ids


def test_the_shipped_config_is_the_architecture_the_capacity_model_sizes():
    config = json.loads((MODEL_FILES / "config.json").read_text())
    text, vision = config["text_config"], config["vision_config"]
    assert config["architectures"] == ["Qwen3_5ForConditionalGeneration"] and not config["language_model_only"]
    layers = text["layer_types"]
    assert len(layers) == text["num_hidden_layers"] == 64
    assert layers.count("linear_attention") == QWEN3_6_27B.linear_layers
    assert layers.count("full_attention") == QWEN3_6_27B.full_attention_layers
    assert layers[3::4] == ["full_attention"] * 16  # every fourth layer (full_attention_interval 4)
    assert (text["linear_num_key_heads"], text["linear_num_value_heads"]) == (
        QWEN3_6_27B.linear_key_heads,
        QWEN3_6_27B.linear_value_heads,
    )
    assert (text["linear_key_head_dim"], text["linear_value_head_dim"], text["linear_conv_kernel_dim"]) == (
        QWEN3_6_27B.linear_key_head_dim,
        QWEN3_6_27B.linear_value_head_dim,
        QWEN3_6_27B.conv_kernel,
    )
    assert (text["num_key_value_heads"], text["head_dim"]) == (QWEN3_6_27B.kv_heads, QWEN3_6_27B.head_dim)
    assert text["mtp_num_hidden_layers"] == QWEN3_6_27B.draft_layers and text["mamba_ssm_dtype"] == "float32"
    assert (vision["depth"], vision["hidden_size"]) == (QWEN3_6_27B.vit_layers, QWEN3_6_27B.vit_hidden_size)
    assert text["vocab_size"] == MODEL_VOCAB_SIZE and vision["out_hidden_size"] == text["hidden_size"] == 5120


def test_the_directory_loads_with_transformers_offline(tmp_path, tokenizer):
    from transformers import AutoConfig, AutoTokenizer

    directory = write_dummy_model(tmp_path / "model")
    config = AutoConfig.from_pretrained(str(directory), local_files_only=True)
    assert config.model_type == "qwen3_5" and config.text_config.num_hidden_layers == 64
    saved = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    assert len(saved) == len(tokenizer) and special_ids(saved) == special_ids(tokenizer)
    generation = json.loads((directory / "generation_config.json").read_text())
    assert set(generation["eos_token_id"]) == set(special_ids(tokenizer).eos_ids)
    text_only = write_dummy_model(tmp_path / "text", text_only=True)
    assert json.loads((text_only / "config.json").read_text())["language_model_only"] is True
