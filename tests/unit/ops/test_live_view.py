"""`dflash status --watch` on a small terminal: the verdict, then progress, rate and ETA, then the alerts summarized
to the lines left; no line wraps."""

from __future__ import annotations

import dataclasses
import json

from rich.console import Console

from dagster_project.generation.line_hold import Hold
from dagster_project.ops.alerts import Alert
from dagster_project.ops.answers.quality import QualityAnswer
from dagster_project.ops.live_view import fit_screen, watch_reading, watch_view
from dagster_project.ops.status import collect_status
from tests.support.ingest_helpers import run_stages


def status_with_alerts(tmp_path, count: int):
    source = tmp_path / "prompts.jsonl"
    source.write_text("".join(json.dumps({"id": f"c{i}", "prompt": f"Question {i}?"}) + "\n" for i in range(6)))
    outcome = run_stages(tmp_path, [str(source)], num_shards=2)
    alerts = [
        Alert("server", f"server http://10.0.0.{i}:30000 " + "is slow and says so at length " * 6) for i in range(count)
    ]
    return dataclasses.replace(collect_status(outcome.store, []), alerts=alerts)


def shown(reading, width: int = 80, height: int = 24) -> str:
    console = Console(record=True, width=width, height=height, force_terminal=True, color_system="truecolor")
    console.print(watch_view(reading, where="/data/store", every_s=10, read_at=0.0, width=width, height=height))
    return console.export_text(clear=False)


def test_at_80x24_the_verdict_progress_and_eta_come_first_and_the_alerts_are_summarized(tmp_path):
    reading = watch_reading(status_with_alerts(tmp_path, 30))
    text = shown(reading)
    lines = text.rstrip("\n").split("\n")
    assert len(lines) <= 23 and all(len(line) <= 80 for line in lines)  # fits, nothing wraps
    assert lines[0].startswith("dflash status  /data/store  read at 00:00:00 UTC")
    assert lines[1].startswith("Shards by stage (2): not done")
    assert lines[2].startswith("   events 0/6")
    assert any("ETA" in line for line in lines[3:5])
    assert "ALERT [server]" in text
    assert "more alerts: `dflash status` lists every one" in text
    assert text.index("events 0/6") < text.index("ALERT [server]")


def test_with_few_alerts_every_alert_and_then_the_other_answers_fill_the_screen(tmp_path):
    reading = watch_reading(status_with_alerts(tmp_path, 2))
    screen = [line for line, _ in fit_screen(reading, width=80, height=40)]
    assert sum(line.startswith("ALERT [server]") for line in screen) == 2
    assert not any("more alert" in line for line in screen)
    assert any(line.startswith("2. MTP (speculative decoding)") for line in screen)
    styles = [style for line, style in fit_screen(reading, width=80, height=40) if line.startswith("ALERT")]
    assert styles == ["bold red", "bold red"]


def test_a_very_short_terminal_keeps_the_verdict_and_progress(tmp_path):
    reading = watch_reading(status_with_alerts(tmp_path, 5))
    screen = [line for line, _ in fit_screen(reading, width=40, height=4)]
    assert len(screen) == 4 and all(len(line) <= 40 for line in screen)
    assert screen[0].startswith("Shards by stage") and screen[1].startswith("   events 0/6")


def test_held_at_80x24_the_verdict_names_the_held_shards_and_their_commands_then_progress(tmp_path):
    """Seen by hand in tmux (issue 45): held, the verdict was the hold's headline cut to 80 columns, which ends
    before the held shards and the commands that bring them back, and the hold's alert repeated it, cut the same."""
    status = status_with_alerts(tmp_path, 2)
    hold = Hold(
        "thinking_structure", "55% blank", figure=0.55, threshold=0.01, sample_size=103, scope="fleet", held_at=0.0,
        shards=[0, 1],
    )  # fmt: skip
    held = dataclasses.replace(
        status,
        quality=QualityAnswer(hold=hold),
        progress=status.progress.while_held(),
        alerts=[Alert("hold", hold.headline()), *status.alerts],
    )
    text = shown(watch_reading(held))
    lines = text.rstrip("\n").split("\n")
    assert len(lines) <= 23 and all(len(line) <= 80 for line in lines)
    assert lines[1].startswith("LINE HELD since 1970-01-01 00:00:00 UTC: gate thinking_structure at 55.0%")
    flat = " ".join(line.strip() for line in text.split("\n"))
    assert "held shards 0, 1 again" in flat
    assert "--partition shard-00000" in flat and "--partition shard-00001" in flat
    assert "ETA none while the line is held" in flat and "events 0/6" in flat
    assert "ALERT [hold]" not in text and sum(line.startswith("ALERT [server]") for line in lines) == 2
