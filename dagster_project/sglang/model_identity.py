"""Which model a server serves, as SGLang 0.5.23 tells it, and the two one-token probes that tell the rest.

`/model_info` and `/server_info` name the model (`model_path`, `served_model_name`; `/model_info` also its
`model_type` and `architectures` from the checkpoint's config) but neither reports the vocabulary, and an input
id at or past the vocabulary kills a real server (an IndexError in the embedding; the connection closes with no
HTTP status). The vocabulary is read without that risk from a refusal: `SamplingParams.verify` answers a
`logit_bias` key outside the vocabulary with 400 "logit_bias must has keys in [0, V - 1]"
(sampling/sampling_params.py:295-301), before the request reaches the scheduler. A second probe forces the job's
end-of-sequence id with a large `logit_bias`: a server of the same tokenizer answers that one id and stops on it
(`finish_reason` stop, `matched` the id: managers/schedule_batch.py `_check_token_based_finish`), another
model's server writes some other token or keeps going.

`QWEN3_6_27B` is the identity the project knows: the shipped config (`qwen3_6_27b/`) and the model's generation
config.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dagster_project.sglang.answer_contract import Served

_MODEL_FILES = Path(__file__).with_name("qwen3_6_27b")

# A logit_bias key no vocabulary reaches: the server refuses it, naming its vocabulary's last id.
VOCAB_PROBE_ID = 1 << 30
_VOCAB_REFUSAL = re.compile(r"logit_bias must has keys in \[0, (\d+)\]")
# Far above any logit a model writes: under greedy sampling the biased id is the token drawn.
FORCING_BIAS = 1000.0
PROBE_INPUT_IDS = [0]  # id 0 lies in every vocabulary: safe to send before the vocabulary is known
# The reason a dispatcher sets a server aside for serving another model (the start of its `reason`).
MODEL_MISMATCH = "served_model_mismatch"
# What status, `dflash fleet status` and the page write beside a server whose reported model is not the job's.
OTHER_MODEL = "OTHER MODEL"
# The fields of an info route's body (/server_info, /model_info) that name the served model.
MODEL_NAME_FIELDS = ("model_path", "served_model_name")


@dataclass(frozen=True)
class ModelIdentity:
    """A model as SGLang serves it: its name (a Hub name or a path ending in it), the architecture of its
    checkpoint, the size of its vocabulary (the embedding's rows: what input ids are range-checked against) and
    the id it ends an answer with (`<|im_end|>` for Qwen)."""

    model: str
    architecture: str  # empty: not checked
    vocab_size: int
    eos_token_id: int
    # False: `vocab_size` is the tokenizer's, which a served embedding holds (padded to a multiple, it may be larger)
    vocab_exact: bool = True

    @property
    def label(self) -> str:
        """What rows and manifests record of the model: a path's last part, so one model under the paths of
        several nodes reads the same."""
        architecture = f"{self.architecture}, " if self.architecture else ""
        return f"{model_basename(self.model)} ({architecture}vocabulary {self.vocab_size})"

    def served(self) -> Served:
        """What the answer contract holds its servers' answers to: its vocabulary, its end-of-turn id."""
        return Served(self.vocab_size, frozenset({self.eos_token_id}))


def _qwen3_6_27b() -> ModelIdentity:
    config = json.loads((_MODEL_FILES / "config.json").read_text())
    generation = json.loads((_MODEL_FILES / "generation_config.json").read_text())
    eos = generation["eos_token_id"]
    return ModelIdentity(
        model="Qwen/Qwen3.6-27B",
        architecture=config["architectures"][0],
        vocab_size=int(config["text_config"]["vocab_size"]),
        eos_token_id=int(eos[0] if isinstance(eos, list) else eos),  # <|im_end|>: what a chat turn ends with
    )


QWEN3_6_27B = _qwen3_6_27b()


def model_basename(name: str) -> str:
    """`Qwen/Qwen3.6-27B`, `/models/Qwen3.6-27B` and a Hub cache's `models--Qwen--Qwen3.6-27B/snapshots/<rev>` all
    name `qwen3.6-27b`."""
    parts = [part for part in name.strip().rstrip("/").split("/") if part]
    for part in parts:
        if part.startswith("models--"):
            return part.split("--")[-1].lower()
    return (parts[-1] if parts else "").lower()


def names_model(reported: Any, expected: str) -> bool:
    """Whether a reported `model_path` or `served_model_name` names the expected model."""
    return isinstance(reported, str) and bool(reported) and model_basename(reported) == model_basename(expected)


def info_names_model(info: Mapping[str, Any], expected: str) -> bool:
    """Whether an info route's body (or a probe keeping its fields) names the expected model: its `model_path` or its
    `served_model_name` (SGLang serves a model under a name of the operator's choosing, its path kept)."""
    return any(names_model(info.get(name), expected) for name in MODEL_NAME_FIELDS)


def reported_model(info: Mapping[str, Any]) -> str | None:
    """The model an info route's body names, as an operator reads it: the name it is served under, else its path
    (None: it names none, e.g. a router)."""
    named = [info.get(name) for name in reversed(MODEL_NAME_FIELDS)]
    return next((name for name in named if isinstance(name, str) and name), None)


def serves_other_model(info: Mapping[str, Any], expected: str) -> bool:
    """An info route's body names a model and it is not the expected one (an empty `expected`: the check is off;
    a body naming no model cannot tell)."""
    return bool(expected) and reported_model(info) is not None and not info_names_model(info, expected)


def vocab_probe_params() -> dict:
    """Sampling params that every server refuses with its vocabulary's size in the message."""
    return {"max_new_tokens": 1, "temperature": 0.0, "logit_bias": {str(VOCAB_PROBE_ID): 0.0}}


def vocab_from_refusal(message: str) -> int | None:
    """The vocabulary size a refused vocabulary probe names, or None when the refusal is another one."""
    found = _VOCAB_REFUSAL.search(message)
    return int(found.group(1)) + 1 if found else None


def forced_token(params: dict) -> int | None:
    """The id a `logit_bias` of at least 100 forces (as no model's logits reach that), if any: the largest bias wins."""
    biased = [(float(bias), int(token)) for token, bias in (params.get("logit_bias") or {}).items()]
    strongest = max(biased, default=None)
    return strongest[1] if strongest is not None and strongest[0] >= 100.0 else None


def forced_token_params(token_id: int) -> dict:
    """Sampling params under which the model must write `token_id` first (and stop, when it ends answers)."""
    return {"max_new_tokens": 1, "temperature": 0.0, "logit_bias": {str(token_id): FORCING_BIAS}}
