"""The simple alternative to the project's ingest: one script, pyarrow + orjson, everything in one pass.

    python -m benchmarks.simple_ingest INPUT_DIR OUTPUT_DIR [--shards 1830] [--max-prompt-tokens 16384]

What a good engineer would write for a folder of ShareGPT, OpenAI-messages and Alpaca files (JSON, JSON Lines,
zstd JSON Lines, Parquet) with the project's rules: the same normalization, quarantine reasons, `all_turns`
policy, duplicate key, ids and shard assignment, so its shards hold the same conversations as the project's
(`bench_ingest` checks that). What it leaves out: its dedup set and ids live in memory, a JSON array is read
whole, and it writes no snapshot, manifests or checksums — a crash means starting over, and nothing tells a
reader a shard is complete. It reads only the layouts and roles the benchmark's input uses.

Writes OUTPUT_DIR/shard=NNNNN.jsonl (one conversation per line, as the project's records) and
OUTPUT_DIR/quarantine.jsonl, and prints a JSON summary on its last line.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import re
import sys
import unicodedata
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from dagster_project.tokenizer import CONTROL_TOKENS

ROLES = {"system": "system", "user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant"}
ROLES |= {"tool": "tool", "observation": "tool"}
CONTROL = re.compile("|".join(re.escape(token) for token in CONTROL_TOKENS))
ID_KEYS = ("id", "conversation_id", "uuid", "prompt_id")
USED_KEYS = {*ID_KEYS, "messages", "conversations", "system", "instruction", "input", "output", "history", "tools"}
SCAFFOLD_BYTES_PER_MESSAGE = 64  # more than the chat template adds around one message's content
FLUSH_BYTES = 256 << 20


class Bad(Exception):
    pass


def rows_of(path: Path):
    """(row index, parsed row or None when the line does not parse) for every row of the file."""
    name = path.name
    if name.endswith(".parquet"):
        import pyarrow.parquet as pq

        index = 0
        for batch in pq.ParquetFile(path).iter_batches(batch_size=16384):
            for row in batch.to_pylist():
                yield index, row
                index += 1
    elif name.endswith(".json"):
        yield from enumerate(orjson.loads(path.read_bytes()))
    else:
        if name.endswith(".zst"):
            import zstandard

            stream = io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(open(path, "rb")))
        else:
            stream = open(path, "rb")
        with stream:
            for index, line in enumerate(stream):
                if line.strip():
                    try:
                        yield index, orjson.loads(line)
                    except orjson.JSONDecodeError:
                        yield index, None


def text(value: Any, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise Bad("non_string_content" if value is not None else "empty_content")
    if not allow_empty and not value.strip():
        raise Bad("empty_content")
    return value


def messages_of(row: dict[str, Any]) -> tuple[str, list[dict[str, str]]]:
    system = row.get("system")
    messages = [{"role": "system", "content": text(system)}] if system else []
    if "instruction" in row:
        for query, answer in row.get("history") or []:
            messages += [{"role": "user", "content": text(query)}, {"role": "assistant", "content": answer}]
        extra_input = row.get("input")
        user = text(row["instruction"]) + (f"\n\n{extra_input}" if extra_input and extra_input.strip() else "")
        messages.append({"role": "user", "content": user})
        if row.get("output") and row["output"].strip():
            messages.append({"role": "assistant", "content": row["output"]})
        return "alpaca", messages
    fmt = "openai" if "messages" in row else "sharegpt"
    for item in row["messages" if fmt == "openai" else "conversations"]:
        role = ROLES[item.get("role", item.get("from"))]
        content = item["content"] if "content" in item else item.get("value")
        messages.append({"role": role, "content": text(content, allow_empty=role == "assistant")})
    return fmt, messages


def check(messages: list[dict[str, str]]) -> None:
    roles = [m["role"] for m in messages]
    if "user" not in roles:
        raise Bad("no_user_turn")
    if "system" in roles[1:]:
        raise Bad("misplaced_system")
    if (roles[1] if roles[0] == "system" else roles[0]) != "user":
        raise Bad("starts_with_assistant")
    for index, role in enumerate(roles):
        if role == "tool" and (index == 0 or roles[index - 1] not in ("tool",)):
            raise Bad("orphan_tool_result")  # no message of these layouts holds a tool call
    if any(CONTROL.search(m["content"]) for m in messages):
        raise Bad("control_tokens")


def too_long(messages: list[dict[str, str]], budget: int) -> bool:
    """Whether the prompt exceeds the budget: a byte count, the tokenizer only when the bytes might not fit."""
    size = sum(len(unicodedata.normalize("NFC", m["content"]).encode()) for m in messages)
    if size + SCAFFOLD_BYTES_PER_MESSAGE * len(messages) <= budget:
        return False
    from dagster_project.tokenizer import load_tokenizer, render_prompt_ids

    return len(render_prompt_ids(load_tokenizer(), messages)) > budget


def blake8(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=8).digest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("input", type=Path)
    parser.add_argument("output", type=Path)
    parser.add_argument("--shards", type=int, default=1830)
    parser.add_argument("--max-prompt-tokens", type=int, default=16384)
    args = parser.parse_args()
    args.output.mkdir(parents=True, exist_ok=True)
    seen_requests: set[bytes] = set()
    taken_ids: set[str] = set()
    shards: list[list[bytes]] = [[] for _ in range(args.shards)]
    buffered, reasons, kept, events = 0, Counter(), 0, 0
    paths = [args.output / f"shard={shard:05d}.jsonl" for shard in range(args.shards)]
    for path in paths:
        path.write_bytes(b"")

    def flush() -> None:
        for shard, lines in enumerate(shards):
            if lines:
                with open(paths[shard], "ab") as handle:
                    handle.write(b"".join(lines))
                lines.clear()

    with open(args.output / "quarantine.jsonl", "wb") as quarantine:
        for path in sorted(p.resolve() for p in args.input.iterdir() if p.is_file()):
            source = path.name.split(".")[0]
            for index, row in rows_of(path):
                try:
                    if row is None:
                        raise Bad("invalid_json")
                    fmt, messages = messages_of(row)
                    check(messages)
                    ends = [
                        i
                        for i, m in enumerate(messages)
                        if m["role"] in ("user", "tool")
                        and (i + 1 == len(messages) or messages[i + 1]["role"] == "assistant")
                    ]
                    asked = messages[: ends[-1] + 1]
                    shown = [[m["role"], "" if m["role"] == "assistant" else m["content"]] for m in asked]
                    request = blake8(orjson.dumps([None, shown]))
                    if request in seen_requests:
                        raise Bad("duplicate")
                    if too_long(asked, args.max_prompt_tokens):
                        raise Bad("too_long")
                    source_id = next((row[key] for key in ID_KEYS if isinstance(row.get(key), str)), None)
                    hashed = "h-" + blake8(orjson.dumps(messages)).hex()
                    conversation_id = next((c for c in (source_id, hashed) if c and c not in taken_ids), None)
                    if conversation_id is None:
                        raise Bad("duplicate_id")
                except Bad as bad:
                    reasons[bad.args[0]] += 1
                    quarantine.write(orjson.dumps({"reason": bad.args[0], "file": str(path), "row": index}) + b"\n")
                    continue
                seen_requests.add(request)
                taken_ids.add(conversation_id)
                extra = {k: v for k, v in row.items() if k not in USED_KEYS and isinstance(v, str | int | float)}
                extra |= {"format": fmt, "source_id": source_id}
                extra["source_user_turns"] = sum(messages[i]["role"] == "user" for i in ends)
                if conversation_id != source_id and source_id is not None:
                    extra["renamed_from"] = source_id
                shard = int.from_bytes(blake8(conversation_id.encode()), "big") % args.shards
                line = orjson.dumps(
                    {
                        "id": conversation_id,
                        "messages": messages,
                        "generate_after": ends,
                        "policy": "all_turns",
                        "history": "generated",
                        "source": source,
                        "source_file": str(path),
                        "source_row": index,
                        "shard": shard,
                        "extra": extra,
                        "tools": None,
                    }
                )
                shards[shard].append(line + b"\n")
                buffered += len(line) + 1
                kept += 1
                events += len(ends)
                if buffered > FLUSH_BYTES:
                    flush()
                    buffered = 0
    flush()
    print(orjson.dumps({"conversations": kept, "events": events, "quarantined_by_reason": reasons}).decode())
    sys.stdout.flush()


if __name__ == "__main__":
    main()
