"""The records that cross stage boundaries, and their on-disk schemas.

* `Conversation`: one normalized conversation (JSON Lines in `conversations/shard=NNNNN/`).
* `COMPLETION_SCHEMA`: one generation event per generated assistant turn (Parquet in `completions/`).
* `TRAINING_SCHEMA`: one training row per usable generation event (Parquet in `training_set/`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import orjson

ROLES = ("system", "user", "assistant", "tool")
POLICIES = ("all_turns", "last_turn", "first_turn", "user_only")
HISTORY_GENERATED = "generated"
HISTORY_SOURCE = "source"

STATUS_OK = "ok"
STATUS_ERROR = "error"
# Not sent, by design: its reason in `error_kind` (`eval_contamination`: a conversation the contamination report
# quarantines). A final record, so exactly-once coverage counts it, and never an error or an answer.
STATUS_EXCLUDED = "excluded"
# Why a conversation matched to an evaluation set is kept out of training (`conversations.contamination`).
EVAL_CONTAMINATION = "eval_contamination"
# Why a turn whose prompt leaves no room for an answer in the trainer's max_length is not trained (or, under
# `max_new_tokens: fit`, not sent).
PROMPT_FILLS_MAX_LENGTH = "prompt_fills_max_length"
# Why a later turn of a conversation whose earlier answer `max_new_tokens: fit` cut is not sent: that answer is no
# history to build on, and the trainer cuts the conversation there anyway.
PREVIOUS_TURN_FIT_CUT = "previous_turn_fit_cut"


@dataclass
class Conversation:
    id: str
    messages: list[dict[str, Any]]
    # Indices into `messages` of the user (or tool-result) messages whose reply is generated, in order.
    generate_after: list[int]
    policy: str = "all_turns"
    # "generated": earlier assistant turns in a prompt are the model's own regenerated answers;
    # "source": the source's assistant turns are kept as context.
    history: str = HISTORY_GENERATED
    source: str = ""
    source_file: str = ""
    source_row: int = -1
    shard: int = -1
    extra: dict[str, Any] = field(default_factory=dict)
    # Tool definitions the prompts render (OpenAI's form); None when the conversation has none.
    tools: list[dict[str, Any]] | None = None

    @property
    def num_turns(self) -> int:
        return len(self.generate_after)

    def event_id(self, turn: int) -> str:
        return f"{self.id}#turn{turn}"

    def to_json(self) -> bytes:
        return orjson.dumps(self)  # orjson serializes dataclasses natively, much faster than asdict

    @classmethod
    def from_json(cls, line: bytes | str) -> Conversation:
        return cls(**orjson.loads(line))


def split_event_id(event_id: str) -> tuple[str, int]:
    conversation_id, _, turn = event_id.rpartition("#turn")
    return conversation_id, int(turn)


# The Parquet schemas are built on first use (`records.COMPLETION_SCHEMA` and the others, through the module's
# __getattr__): the records' readers that never touch Parquet (`dflash status`) do not import pyarrow.
_SCHEMAS = ("COMPLETION_SCHEMA", "PROVENANCE_FIELDS", "TRAINING_SCHEMA")


@functools.cache
def _schemas() -> dict[str, Any]:
    import pyarrow as pa

    _ids = pa.list_(pa.int32())

    COMPLETION_SCHEMA = pa.schema(
        [
            ("event_id", pa.string()),
            ("conversation_id", pa.string()),
            ("turn_index", pa.int32()),
            ("num_turns", pa.int32()),
            ("policy", pa.string()),
            ("shard", pa.int32()),
            ("status", pa.string()),  # "ok" or "error"; an error never carries an answer
            ("error_kind", pa.string()),
            ("error_message", pa.string()),
            ("prompt_ids", _ids),
            ("output_ids", _ids),
            ("text", pa.string()),
            ("finish_reason", pa.string()),  # finish_reason.type: stop | length | abort
            ("finish_matched", pa.string()),
            ("prompt_tokens", pa.int32()),
            ("completion_tokens", pa.int32()),
            ("cached_tokens", pa.int32()),
            ("spec_verify_ct", pa.int32()),
            ("spec_accept_length", pa.float64()),
            ("spec_accept_rate", pa.float64()),
            ("spec_num_correct_drafts", pa.int32()),
            ("spec_num_proposed_drafts", pa.int32()),
            ("e2e_latency_s", pa.float64()),
            ("client_latency_s", pa.float64()),
            ("server", pa.string()),
            ("rid", pa.string()),
            ("attempts", pa.int32()),
            ("finished_at", pa.float64()),
            ("settings_fingerprint", pa.string()),
            ("source", pa.string()),  # the conversation's source (the prompt file's name)
            ("weight_version", pa.string()),  # meta_info.weight_version: the model revision that answered
            # The model its server was checked to serve before answering (`ModelIdentity.label`; null: unchecked).
            ("served_model", pa.string()),
        ]
    )

    # What a training row carries of its generation event, so a bad server or a settings change can be traced and
    # excluded (null in rows assembled from completions written before a field was recorded).
    PROVENANCE_FIELDS = [
        ("source", pa.string()),
        ("server", pa.string()),
        ("weight_version", pa.string()),
        ("settings_fingerprint", pa.string()),
        ("spec_verify_ct", pa.int32()),
        ("spec_accept_length", pa.float64()),
        ("spec_accept_rate", pa.float64()),
    ]

    TRAINING_SCHEMA = pa.schema(
        [
            ("event_id", pa.string()),
            ("conversation_id", pa.string()),
            ("turn_index", pa.int32()),
            ("shard", pa.int32()),
            ("input_ids", _ids),
            ("loss_mask", pa.list_(pa.int8())),
            ("num_tokens", pa.int32()),
            ("num_loss_tokens", pa.int32()),
            ("prompt_tokens", pa.int32()),
            ("completion_tokens", pa.int32()),
            ("finish_reason", pa.string()),
            ("truncated", pa.bool_()),
            *PROVENANCE_FIELDS,
        ]
    )
    return {
        "COMPLETION_SCHEMA": COMPLETION_SCHEMA,
        "PROVENANCE_FIELDS": PROVENANCE_FIELDS,
        "TRAINING_SCHEMA": TRAINING_SCHEMA,
    }


def __getattr__(name: str) -> Any:
    if name in _SCHEMAS:
        return _schemas()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def empty_completion_row() -> dict[str, Any]:
    return {name: None for name in _schemas()["COMPLETION_SCHEMA"].names}
