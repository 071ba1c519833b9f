"""The embedded demo data: every `bad-<reason>-...` row is quarantined for that reason, every tool row kept."""

from __future__ import annotations

from pathlib import Path

from dagster_project.settings import DEMO_DATA_DIR
from tests.support.ingest_helpers import run_stages


def test_every_bad_demo_row_is_quarantined_for_the_reason_its_id_names(tmp_path: Path) -> None:
    outcome = run_stages(tmp_path, [str(DEMO_DATA_DIR)])
    quarantined = {q["id"]: q["reason"] for q in outcome.quarantined if (q["id"] or "").startswith("bad-")}
    assert quarantined, "the demo exercises the quarantine rules"
    assert {row_id: row_id.split("-")[1] for row_id in quarantined} == quarantined
    tool_rows = {c.id: c for c in outcome.conversations if c.id.startswith("tool-")}
    assert set(tool_rows) == {"tool-calculator", "tool-weather"}
    assert all(c.history == "source" and c.tools and c.num_turns == 2 for c in tool_rows.values())
