"""What a simulator starts from: its settings (`SimConfig`, one field per command-line flag) and the few
facts of the tokenizer it needs (`SimVocab`), small enough to share as a file across a fleet.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import orjson

from dagster_project.sglang import capacity
from dagster_project.sglang import protocol as proto
from dagster_project.sglang.model_identity import QWEN3_6_27B
from dagster_project.sglang.sim import speculation
from dagster_project.sglang.speculative import SpecSetting

MODEL_PATH = QWEN3_6_27B.model
# The padded embedding: 0.5.23 checks no input id against it, one past it kills the server.
MODEL_VOCAB_SIZE = QWEN3_6_27B.vocab_size
SGLANG_VERSION = "0.5.23"


@dataclass
class SimConfig:
    host: str = "127.0.0.1"
    port: int = 30000
    model_path: str = MODEL_PATH
    served_model_name: str | None = None
    # The served checkpoint's config as /model_info reports it, and its vocabulary (the embedding's rows): a
    # simulator of another model declares another identity (what the dispatcher's served-model check reads).
    model_type: str = "qwen3_5"
    architecture: str = QWEN3_6_27B.architecture
    vocab_size: int = MODEL_VOCAB_SIZE
    tokenizer: str | None = None  # None: the project's built-in Qwen3.6 tokenizer
    vocab_file: str | None = None  # a sketch written by `SimVocab.save`, shared by a fleet (skips the tokenizer)
    api_key: str | None = field(default=None, repr=False)
    enable_metrics: bool = False
    speculative: bool = True  # launched with NEXTN (reported as EAGLE)
    spec_draft_tokens: int = proto.SPEC_DRAFT_TOKENS
    # Unset: a chain of draft tokens − 1 steps. With top-k 1 the draft tokens follow the steps, as SGLang forces.
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int = 1
    reasoning_parser: str | None = "qwen3"
    context_length: int = 65536
    # Without `gpu_memory_gb` the pools are given: KV tokens and the real cap (default: the configured one).
    token_capacity: int = 249344
    max_running_requests: int | None = None  # --max-running-requests; unset: 48 under speculative decoding
    effective_max_running_requests: int | None = None
    # With `gpu_memory_gb` (GiB free before the weights load) the KV pool, the mamba state pool and the cap
    # are sized from memory as SGLang 0.5.23 sizes them, under these launch flags (`capacity.size_pools`);
    # running requests are then admitted against the KV pool.
    gpu_memory_gb: float | None = None
    weights_gb: float = capacity.QWEN3_6_27B.weights_gib
    mem_fraction_static: float = 0.88
    mamba_full_memory_ratio: float = 0.9
    max_mamba_cache_size: int | None = None
    disable_radix_cache: bool = False
    mamba_radix_cache_strategy: str = "extra_buffer"
    mamba_ssm_dtype: str | None = None  # None: the model's float32
    kv_cache_dtype: str = "auto"
    cuda_graph_max_bs_decode: int | None = None
    max_queued_requests: int | None = None
    seed: int = 0
    output_len: str = "lognormal:2400:0.6"  # fixed:N | uniform:A:B | lognormal:MEDIAN:SIGMA
    max_output_len: int = 32768  # natural answers never exceed this
    answer_fraction: tuple[float, float] = (0.1, 0.3)  # share of the output after </think>
    # Prompts that declare tools: the share answered with a `<tool_call>`, and the share of those calls written
    # malformed on purpose (reading the tools needs the full tokenizer: it is loaded only when this is set).
    tool_call_share: float = 0.0
    malformed_tool_call_share: float = 0.0
    # P(k drafts accepted) per verify pass, k = 0..len − 1, at a chain of len − 1 steps; other speculative
    # settings keep its per-draft acceptance (`sim.speculation.accept_probs`).
    accept_probs: tuple[float, ...] = (0.2, 0.2, 0.2, 0.4)
    accept_decay_tokens: int = 0  # context length at which acceptance has fallen halfway to none; 0: no decay
    ttft_s: float = 0.0
    prefill_s_per_token: float = 0.0
    # One decode step of a batch of one under the model card's MTP 3/1/4; it takes (1 + growth × (batch − 1)) ×
    # decode_step_s at a larger batch. Other speculative settings, and none, are priced from it
    # (`sim.speculation.step_factor`).
    decode_step_s: float = 0.0
    decode_step_growth: float = 0.0
    accept_decay_batch: int = 0  # batch size beyond one at which acceptance has fallen halfway to none; 0: no decay
    startup_s: float = 0.0  # /health answers 503 this long after start
    health_latency_s: float = 0.0  # real /health takes >= 1 s; 0 keeps tests fast
    health_check_timeout_s: float = 20.0  # SGLANG_HEALTH_CHECK_TIMEOUT: no output this long means 503
    request_log_limit: int = 1_000_000
    faults: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.speculative_num_steps is None:
            self.speculative_num_steps = self.spec_draft_tokens - 1
        elif self.speculative_eagle_topk == 1:
            self.spec_draft_tokens = self.speculative_num_steps + 1

    @property
    def spec_setting(self) -> SpecSetting | None:
        """The speculative setting served (None: MTP off); a `ValueError` for one SGLang would refuse."""
        if not self.speculative:
            return None
        return SpecSetting(self.speculative_num_steps or 0, self.speculative_eagle_topk, self.spec_draft_tokens)

    @property
    def draft_accept_probs(self) -> tuple[float, ...]:
        """P(k drafts accepted) per verify pass under the setting served (`accept_probs` without MTP)."""
        setting = self.spec_setting
        return speculation.accept_probs(self.accept_probs, setting) if setting else tuple(self.accept_probs)

    @property
    def launch_settings(self) -> capacity.LaunchSettings:
        return capacity.LaunchSettings(
            max_running_requests=self.max_running_requests,
            mamba_full_memory_ratio=self.mamba_full_memory_ratio,
            max_mamba_cache_size=self.max_mamba_cache_size,
            disable_radix_cache=self.disable_radix_cache,
            mamba_radix_cache_strategy=self.mamba_radix_cache_strategy,
            speculative_draft_tokens=self.spec_draft_tokens if self.speculative else 0,
            mamba_ssm_dtype=self.mamba_ssm_dtype or "float32",
            kv_cache_dtype=self.kv_cache_dtype,
            context_length=self.context_length,
            cuda_graph_max_bs=self.cuda_graph_max_bs_decode,
        )

    @property
    def memory_model(self) -> bool:
        return self.gpu_memory_gb is not None

    @cached_property
    def pools(self) -> capacity.Pools:
        """The KV pool, the mamba state pool and the running cap: sized from memory, or as given."""
        settings = self.launch_settings
        if self.gpu_memory_gb is not None:
            budget = capacity.pool_budget_bytes(self.gpu_memory_gb, self.weights_gb, self.mem_fraction_static)
            return capacity.size_pools(budget, settings)
        configured = settings.configured_max_running_requests or capacity.SPEC_DEFAULT_MAX_RUNNING_REQUESTS
        cap = max(1, self.effective_max_running_requests or configured)
        slots = cap * settings.state_slots_per_request  # a given cap below the flag is the state pool's doing
        bound = capacity.Resource.MAMBA_SLOTS if cap < configured else capacity.Resource.CONFIGURED
        cell = capacity.QWEN3_6_27B.kv_bytes_per_token(settings.kv_cache_dtype, settings.speculative)
        state = capacity.state_pool_bytes(settings, slots)
        return capacity.Pools(slots, self.token_capacity, cap, bound, state, self.token_capacity * cell)

    @property
    def running_cap(self) -> int:
        return self.pools.max_running_requests

    @property
    def reserved_prompt_tokens(self) -> int:
        """max(top-k × steps, draft tokens) under EAGLE/NEXTN, as SGLang adds to every prompt's length checks."""
        setting = self.spec_setting
        return setting.reserved_tokens if setting is not None else 0

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model_path

    @property
    def max_req_len(self) -> int:
        return min(self.context_length - 1, self.pools.max_total_num_tokens - 1)

    @property
    def max_req_input_len(self) -> int:
        return self.max_req_len - 5


_WORD_TOKEN = re.compile(r"^Ġ(?=[a-z]*[aeiouy])[a-z]{2,9}$")  # byte-level BPE " word" with a vowel: fewer fragments
_WORDS = 3000  # the lowest ids are the earliest merges, i.e. the most frequent words
_SKETCH_FORMAT = 4  # part of the cache file name: bump when SimVocab's fields change


@dataclass(frozen=True)
class SimVocab:
    """What the simulator needs of a tokenizer: the ids it emits, their text, and which are special.

    Each word comes in three single-token forms, as the model writes it: ` word` inside a sentence, ` Word`
    starting one, and `Word` starting a paragraph or a part (after `<think>\\n` or `</think>\\n\\n`), where a
    leading space would be an artifact the chat template trims and the tokenizer would not reproduce.
    """

    tokenizer: str
    think_end: int | None  # None: the model's template does not reason
    eos_ids: tuple[int, ...]
    special_ids: frozenset[int]
    texts: dict[int, str]  # decoded text of every id the simulator emits
    words: tuple[int, ...]
    capitals: dict[int, int]  # ` word` → ` Word`
    openings: dict[int, int]  # ` word` → `Word`
    punctuation: tuple[int, ...]
    newline: int
    paragraph: int
    ok_answer: tuple[int, ...] = ()  # "OK.": the seed's disaster answer (the `bad_model_share` fault)
    think_start: int | None = None
    prompt_opens_reasoning: bool = True  # else the model opens the think block itself (Qwen3)
    period_paragraph: int | None = None  # ".\n\n" where the tokenizer merges it into one token

    @classmethod
    def from_tokenizer(cls, name: str, tokenizer: Any) -> SimVocab:
        from dagster_project.tokenizer import special_ids

        ids = special_ids(tokenizer)
        vocab = tokenizer.get_vocab()
        words = sorted(
            i
            for token, i in vocab.items()
            if _WORD_TOKEN.match(token) and token[1:].capitalize() in vocab and "Ġ" + token[1:].capitalize() in vocab
        )[:_WORDS]
        spelled = tokenizer.convert_ids_to_tokens(words)
        capitals = {i: vocab["Ġ" + token[1:].capitalize()] for i, token in zip(words, spelled, strict=True)}
        openings = {i: vocab[token[1:].capitalize()] for i, token in zip(words, spelled, strict=True)}

        def single(text: str) -> int:
            (token_id,) = tokenizer.encode(text, add_special_tokens=False)
            return token_id

        punctuation = (single(","), single("."))
        newline, paragraph = single("\n"), single("\n\n")
        ok_answer = tuple(tokenizer.encode("OK.", add_special_tokens=False))
        period_paragraph = tokenizer.encode(".\n\n", add_special_tokens=False)
        emitted = [
            *ok_answer,
            *words,
            *capitals.values(),
            *openings.values(),
            *punctuation,
            *(period_paragraph if len(period_paragraph) == 1 else ()),
            newline,
            paragraph,
            *((ids.think_start, ids.think_end) if ids.reasons else ()),
            *ids.eos_ids,
        ]
        return cls(
            tokenizer=name,
            think_end=ids.think_end,
            eos_ids=tuple(ids.eos_ids),
            special_ids=frozenset(i for i in emitted if not tokenizer.decode([i], skip_special_tokens=True)),
            texts={i: tokenizer.decode([i], skip_special_tokens=False) for i in emitted},
            words=tuple(words),
            capitals=capitals,
            openings=openings,
            punctuation=punctuation,
            newline=newline,
            paragraph=paragraph,
            ok_answer=ok_answer,
            think_start=ids.think_start,
            prompt_opens_reasoning=ids.prompt_opens_reasoning,
            period_paragraph=period_paragraph[0] if len(period_paragraph) == 1 else None,
        )

    def decode(self, ids: Iterable[int]) -> str:
        """The text of emitted ids, special tokens included (every one of them decodes on its own)."""
        return "".join(self.texts[i] for i in ids)

    def to_json(self) -> bytes:
        data = asdict(self)
        data["special_ids"] = sorted(self.special_ids)
        for key in ("texts", "capitals", "openings"):
            data[key] = {str(k): v for k, v in data[key].items()}
        return orjson.dumps(data)

    @classmethod
    def from_json(cls, raw: bytes) -> SimVocab:
        data = orjson.loads(raw)
        data["special_ids"] = frozenset(data["special_ids"])
        for key in ("texts", "capitals", "openings"):
            data[key] = {int(k): v for k, v in data[key].items()}
        for key in ("eos_ids", "words", "punctuation", "ok_answer"):
            data[key] = tuple(data.get(key, ()))
        return cls(**data)

    def save(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(f".{path.name}.{os.getpid()}")
        staging.write_bytes(self.to_json())
        os.replace(staging, path)  # readers never see a half-written sketch
        return path


def serving_options(tokenizer: str, served_model: str, architecture: str = "") -> dict[str, Any]:
    """The `SimConfig` fields of a simulator of the model `tokenizer` describes (a `DFLASH_TOKENIZER` value),
    served under the name `served_model`: that tokenizer's vocabulary (`len(tokenizer)`), `architecture` (a
    generic causal LM where none is given), and Qwen's reasoning parser only when its chat template reasons. Its
    end ids and the text of its answers come from the tokenizer's sketch (`load_sim_vocab(tokenizer)`)."""
    from dagster_project.tokenizer import load_tokenizer, tokenizer_profile

    profile = tokenizer_profile(load_tokenizer(tokenizer))
    return {
        "model_path": served_model,
        "vocab_size": profile.vocab_size,
        "architecture": architecture or "CausalLM",
        "model_type": "",
        "reasoning_parser": "qwen3" if profile.reasoning else None,
    }


def load_sim_vocab(tokenizer: str | None = None) -> SimVocab:
    """The vocabulary sketch of `tokenizer` (default: built-in), cached on disk next to the tokenizer.

    Building it needs the tokenizer (seconds); the cached sketch loads in milliseconds, which is what
    makes a fleet of simulators start fast.
    """
    from dagster_project import tokenizer as tokenization

    name = tokenizer or tokenization.BUILTIN_TOKENIZER
    builtin = tokenization.builtin_tokenizer_dir()  # named after a digest of everything the build reads
    if name == tokenization.BUILTIN_TOKENIZER:
        cache = builtin.with_name(f"{builtin.name}.simvocab-v{_SKETCH_FORMAT}.json")
    else:
        cache = builtin.parent / f"simvocab-v{_SKETCH_FORMAT}-{_tokenizer_key(name)}.json"
    if cache.is_file():
        return SimVocab.from_json(cache.read_bytes())
    vocab = SimVocab.from_tokenizer(name, tokenization.load_tokenizer(name))
    vocab.save(cache)
    return vocab


def _tokenizer_key(name: str) -> str:
    """A digest of `name` and, for a local directory, of its files' names, sizes and times: a tokenizer directory
    edited or replaced in place gets a new sketch, never the old one's vocabulary."""
    folder = Path(name)
    files = (
        sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir()) if folder.is_dir() else []
    )
    return hashlib.sha256(orjson.dumps([name, files])).hexdigest()[:16]
