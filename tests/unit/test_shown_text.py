"""Text from data or a server reaches no terminal, log line or page raw: ESC sequences (clear screen, OSC 8
hyperlinks), bidirectional overrides, line breaks that forge a line and HTML go through `shown_text` at every
output: status's text, `dflash hold`, the ingest stage's log lines, the page (its Markdown and its tables) and
`dflash fleet status`."""

from __future__ import annotations

import dataclasses
import json
import time

from dagster_project import cli
from dagster_project.generation.fleet_registry import NodeRecord, RegisteredServer
from dagster_project.generation.line_hold import Hold, HoldExample, put_hold
from dagster_project.ingest.stage import ingest_to_store
from dagster_project.ops.alerts import Alert
from dagster_project.ops.report import render_markdown, report_sections
from dagster_project.ops.status import render_text
from dagster_project.ops.terminal import fleet_table
from dagster_project.shown_text import shown, shown_markdown
from dagster_project.store.storage import LocalStore
from tests.support.full_status import full_status

CLEAR = "\x1b[2J"
LINK = "\x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\"
HTML = "<img src=x onerror=alert(1)>"
FORGED = "\nALERT [fake]: all is well"
EVIL = f"conv-{CLEAR}{LINK}{HTML}\u202e{FORGED}"


def _raw(text: str) -> list[str]:
    """The characters a terminal or a page would act on: every non-printable but the text's own line breaks."""
    return [char for char in text if not char.isprintable() and char != "\n"]


def _forged(text: str) -> bool:
    return any(line.startswith("ALERT [fake]") for line in text.splitlines())


def test_shown_escapes_what_is_not_printable_and_leaves_the_rest():
    assert shown("conv-1#turn0 — ünïcode …") == "conv-1#turn0 — ünïcode …"
    assert shown(CLEAR + LINK) == "\\x1b[2J\\x1b]8;;http://evil.example/\\x1b\\click\\x1b]8;;\\x1b\\"
    assert shown("a\u202eb\nc\td") == "a\\u202eb\\nc\\td" and shown(shown(EVIL)) == shown(EVIL)
    assert shown_markdown(f"{HTML}\nline two") == "&lt;img src=x onerror=alert(1)&gt;\nline two"


def test_status_text_escapes_ids_names_and_messages_from_the_data(tmp_path):
    status = full_status(tmp_path)
    node = NodeRecord(EVIL, EVIL, "sglang", time.time() - 900, [RegisteredServer(f"http://{EVIL}:1", 1, 0, None)])
    status = dataclasses.replace(status, stale_nodes=[node], alerts=[*status.alerts, Alert("server", EVIL)])
    text = render_text(status)
    assert not _raw(text) and not _forged(text)
    assert "\\x1b[2J\\x1b]8;;http://evil.example/" in text and "\\nALERT [fake]" in text


def test_the_page_escapes_html_and_controls_in_its_markdown_and_its_tables(tmp_path):
    status = full_status(tmp_path)
    hold = Hold("short_answers", EVIL, 0.9, 0.1, 120, "fleet", time.time(), examples=[HoldExample(EVIL, EVIL, EVIL)])
    status = dataclasses.replace(
        status, quality=dataclasses.replace(status.quality, hold=hold), alerts=[Alert("server", EVIL)]
    )
    page = render_markdown(status)
    assert not _raw(page) and not _forged(page) and "<img" not in page and "&lt;img src=x" in page
    for section in report_sections(status):
        assert not _raw(section.text) and "<img" not in section.text
        for _, table in section.tables:  # Dagster's table cells: text, one line each
            assert not [cell for row in table.rows for cell in row if _raw(cell) or "\n" in cell]
    evidence = next(
        table for section in report_sections(status) for label, table in section.tables if label == "Hold evidence"
    )
    assert evidence.rows[0][0].startswith("conv-\\x1b[2J")


def test_dflash_hold_escapes_the_event_id_server_and_excerpt(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DFLASH_STORE", str(tmp_path))
    example = HoldExample(EVIL, f"\n</think>\n\nOK.{CLEAR}", f"http://{EVIL}")
    put_hold(LocalStore(tmp_path), Hold("short_answers", EVIL, 0.9, 0.1, 120, "fleet", time.time(),
                                        examples=[example], runs=[EVIL], servers=[EVIL]))  # fmt: skip
    assert cli.main(["hold"]) == 0
    out = capsys.readouterr().out
    assert not _raw(out) and not _forged(out)
    assert "example conv-\\x1b[2J\\x1b]8;;" in out and "'\\n</think>\\n\\nOK.\\x1b[2J'" in out


def test_the_ingest_log_escapes_a_file_name_that_holds_escapes(tmp_path):
    source = tmp_path / "in"
    source.mkdir()
    name = f"x{CLEAR}{LINK.replace('/', '')}\u202e.jsonl"  # a file's name holds no "/"
    (source / name).write_text(json.dumps({"messages": [{"role": "user", "content": "hello"}]}) + "\n")
    lines: list[str] = []
    ingest_to_store(LocalStore(tmp_path / "store"), [str(source)], work_dir=tmp_path / "work", log=lines.append)
    assert lines and not [line for line in lines if _raw(line) or "\n" in line]
    assert any("x\\x1b[2J\\x1b]8;;http:evil.example\\x1b" in line for line in lines)


def test_fleet_status_escapes_what_a_server_answered():
    answered = {"url": "http://127.0.0.1:30000", "error": EVIL, "healthy": False, "served_model_name": EVIL}
    table = fleet_table([answered], {}, "here", served_model="Qwen/Qwen3.6-27B")
    assert not _raw(table) and not _forged(table) and table.count("\\x1b[2J") == 2


def test_the_live_view_escapes_what_it_shows(tmp_path):
    from dagster_project.ops.live_view import fit_screen, watch_reading

    status = dataclasses.replace(full_status(tmp_path), alerts=[Alert("server", EVIL)])
    screen = "\n".join(line for line, _ in fit_screen(watch_reading(status, notes=[EVIL]), width=400, height=60))
    assert "conv-\\x1b[2J" in screen and not _raw(screen) and not _forged(screen)
