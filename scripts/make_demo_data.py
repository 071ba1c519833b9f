"""Write the demo prompt files under dagster_project/demo_data/ (deterministic; the content is ours).

    python scripts/make_demo_data.py

Three sources in three formats: a ShareGPT JSON array, an OpenAI-messages JSON Lines file and an Alpaca
JSON array; single-turn and multi-turn prompts, system prompts, and a few malformed rows whose ids
name the quarantine rule each one exercises (`bad-<reason>-...`).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT_DIR = Path(__file__).resolve().parents[1] / "dagster_project" / "demo_data"
SEED = 20260514

TOPICS = [
    "photosynthesis",
    "plate tectonics",
    "black holes",
    "how vaccines train the immune system",
    "the water cycle",
    "entropy",
    "CRISPR gene editing",
    "ocean tides",
    "binary search",
    "hash tables",
    "the TCP handshake",
    "garbage collection",
    "recursion",
    "SQL joins",
    "git rebase",
    "container images",
    "the Silk Road",
    "the printing press",
    "Roman aqueducts",
    "the Apollo program",
    "the Industrial Revolution",
    "keeping a sourdough starter alive",
    "monthly budgeting",
    "caring for houseplants",
    "training for a first 5K",
    "home composting",
    "prime numbers",
    "Bayes' theorem",
    "derivatives",
    "the Pythagorean theorem",
    "matrix multiplication",
    "supply and demand",
    "compound interest",
    "the immune response to a cold",
    "how rainbows form",
    "the history of chess",
    "bird migration",
    "solar panels",
    "bread fermentation",
    "the French Revolution",
]
AUDIENCES = [
    "a ten-year-old",
    "a first-year university student",
    "a busy manager",
    "a retired engineer",
    "a curious teenager",
]
SINGLE_TURN = [
    "Explain {topic} to {audience}.",
    "Give three common misconceptions about {topic} and correct each one.",
    "Write a three-question quiz about {topic}, with answers at the end.",
    "Summarize the key ideas of {topic} in five bullet points.",
    "Write a haiku about {topic}.",
    "What is one surprising fact about {topic}, and why is it true?",
    "Draft a short lesson plan (30 minutes) that teaches {topic}.",
]
CODE_TASKS = [
    "reverses the words of a sentence",
    "checks whether a string is a palindrome",
    "merges two sorted lists",
    "counts word frequencies in a text file",
    "returns the n-th Fibonacci number iteratively",
    "validates an IPv4 address",
    "flattens a nested list",
    "groups anagrams together",
    "computes a moving average over a list",
    "parses a duration like '1h30m' into seconds",
]
LANGUAGES = ["Python", "Rust", "Go", "TypeScript"]
SYSTEM_PROMPTS = [
    "You are a patient tutor who answers in plain language.",
    "You are a concise senior software engineer. Prefer short answers with code.",
    "You are a friendly museum guide.",
    "Reply in British English and keep answers under 200 words.",
]
FOLLOW_UPS = [
    "Can you give a concrete example?",
    "Now explain it more simply.",
    "What would change if the conditions were reversed?",
    "How would you test that someone understood it?",
]
REWRITE_TEXTS = [
    "the meeting is moved to thursday because the room was double booked sorry for the trouble",
    "our app crashes on startup when the config file is missing we should show an error instead",
    "please bring your own water bottle to the hike the trail has no fountains",
    "the library will close early on friday for inventory all loans are extended by a week",
]


class Prompts:
    """Distinct first prompts in a seeded order, so the only duplicates are the deliberate ones."""

    def __init__(self, rng: random.Random):
        chat = [
            template.format(topic=topic, audience=AUDIENCES[(i + j) % len(AUDIENCES)])
            for i, template in enumerate(SINGLE_TURN)
            for j, topic in enumerate(TOPICS)
        ]
        code = [
            f"Write a {language} function that {task}. Include a short test."
            for language in LANGUAGES
            for task in CODE_TASKS
        ]
        self._pool = chat + code
        rng.shuffle(self._pool)

    def next(self) -> str:
        return self._pool.pop()


def _answer(prompt: str) -> str:
    return f"(reference answer) A short answer to: {prompt[:60]}"


def _turns(rng: random.Random, prompts: Prompts, multi_turn: bool) -> list[tuple[str, str]]:
    first = prompts.next()
    turns = [(first, _answer(first))]
    for follow_up in rng.sample(FOLLOW_UPS, rng.randint(1, 2)) if multi_turn else []:
        turns.append((follow_up, _answer(follow_up)))
    return turns


def sharegpt_rows(rng: random.Random, prompts: Prompts) -> list[dict]:
    rows = []
    for index in range(90):
        conversation = []
        if index % 9 == 0:
            conversation.append({"from": "system", "value": rng.choice(SYSTEM_PROMPTS)})
        for question, answer in _turns(rng, prompts, multi_turn=index % 6 == 0):
            conversation += [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]
        rows.append({"id": f"sharegpt-{index:03d}", "conversations": conversation})
    rows += [
        {
            "id": "bad-unknown_role-narrator",
            "conversations": [
                {"from": "narrator", "value": "Once upon a time."},
                {"from": "human", "value": "Continue the story."},
            ],
        },
        {
            "id": "bad-starts_with_assistant-greeting",
            "conversations": [
                {"from": "gpt", "value": "Hello! How can I help?"},
                {"from": "human", "value": "Tell me about tides."},
            ],
        },
        {
            "id": "bad-empty_content-blank-question",
            "conversations": [{"from": "human", "value": "   "}, {"from": "gpt", "value": "Could you say more?"}],
        },
        {
            "id": "bad-tool_use-weather",
            "conversations": [
                {"from": "human", "value": "What's the weather in Lisbon?"},
                {"from": "function_call", "value": '{"name": "get_weather", "arguments": {"city": "Lisbon"}}'},
                {"from": "observation", "value": '{"temp_c": 21}'},
                {"from": "gpt", "value": "It is 21 degrees."},
            ],
        },
        # The same question as sharegpt-001 with another reference answer: the model would be asked it twice.
        {
            "id": "bad-duplicate-of-sharegpt-001",
            "conversations": [rows[1]["conversations"][0], {"from": "gpt", "value": "A different reference answer."}],
        },
    ]
    return rows


def openai_rows(rng: random.Random, prompts: Prompts) -> list[dict]:
    rows = []
    for index in range(80):
        messages = []
        if index % 7 == 0:
            messages.append({"role": "system" if index % 2 else "developer", "content": rng.choice(SYSTEM_PROMPTS)})
        for question, answer in _turns(rng, prompts, multi_turn=index % 7 == 3):
            content = [{"type": "text", "text": question}] if index % 5 == 0 else question
            messages += [{"role": "user", "content": content}, {"role": "assistant", "content": answer}]
        if index % 4:
            messages.pop()  # many prompt sets carry no reference answer
        rows.append(
            {"id": f"openai-{index:03d}", "messages": messages, "category": rng.choice(["chat", "code", "teaching"])}
        )
    rows += [
        {
            "id": "bad-non_string_content-image",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is in this picture?"},
                        {"type": "image_url", "image_url": {"url": "https://example.invalid/cat.png"}},
                    ],
                }
            ],
        },
        {"id": "bad-no_user_turn-system-only", "messages": [{"role": "system", "content": "You are a poet."}]},
        {
            "id": "bad-tool_use-calculator",
            "messages": [
                {"role": "user", "content": "What is 17 * 23?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"type": "function", "function": {"name": "multiply", "arguments": '{"a": 17, "b": 23}'}}
                    ],
                },
                {"role": "tool", "content": "391"},
            ],
        },
        {
            "id": "bad-misplaced_system-late-instruction",
            "messages": [
                {"role": "user", "content": "Name a prime number."},
                {"role": "system", "content": "Answer in French."},
            ],
        },
    ]
    return rows


def alpaca_rows(rng: random.Random, prompts: Prompts) -> list[dict]:
    rows = []
    for index in range(60):
        if index % 3 == 0:
            row = {
                "instruction": "Rewrite the following note with correct punctuation and capitalisation.",
                "input": REWRITE_TEXTS[index % len(REWRITE_TEXTS)] + f" (note {index})",
            }
        else:
            row = {"instruction": prompts.next(), "input": ""}
        row["output"] = _answer(row["instruction"]) if index % 2 else ""
        if index % 10 == 5:
            row["system"] = rng.choice(SYSTEM_PROMPTS)
        rows.append(row)
    rows.append(dict(rows[2]))  # an exact duplicate row: Alpaca rows have no id, so the content decides
    rows.append({"instruction": "", "input": "bad-empty_content: no instruction at all", "output": "?"})
    return rows


def write_jsonl(path: Path, rows: list[dict], raw_lines: list[bytes]) -> None:
    lines = [json.dumps(row, ensure_ascii=False).encode("utf-8") for row in rows] + raw_lines
    path.write_bytes(b"\n".join(lines) + b"\n")


def main() -> None:
    rng = random.Random(SEED)
    prompts = Prompts(rng)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / "sharegpt_chats.json").write_text(
        json.dumps(sharegpt_rows(rng, prompts), indent=1, ensure_ascii=False) + "\n"
    )
    broken = [
        b'{"id": "bad-invalid_json-cut-short", "messages": [{"role": "user", "content": "Where does this',
        b'{"id": "bad-invalid_utf8-latin1-bytes", "messages": [{"role": "user", "content": "Caf\xe9 menu ideas?"}]}',
    ]
    write_jsonl(OUT_DIR / "openai_messages.jsonl", openai_rows(rng, prompts), broken)
    (OUT_DIR / "alpaca_tasks.json").write_text(
        json.dumps(alpaca_rows(rng, prompts), indent=1, ensure_ascii=False) + "\n"
    )
    for path in sorted(OUT_DIR.iterdir()):
        print(f"{path.relative_to(OUT_DIR.parent.parent)}: {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
