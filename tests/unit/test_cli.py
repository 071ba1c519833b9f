"""`dflash`'s own surface, without servers or Dagster: every flag explained and each command showing only its own;
the fleet table and the live view rendered from what was read; the common mistakes ending in one line, no
traceback; and `dflash status` not importing what it does not use (a fresh interpreter per check)."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dagster_project import cli
from dagster_project.cli.fleet import parse_sim_options
from dagster_project.ops.dagster_view import DagsterView, write_view
from dagster_project.ops.pool_slots import DeadHolder
from dagster_project.ops.terminal import fleet_table
from dagster_project.processes import process_start, this_process
from dagster_project.sglang.model_identity import QWEN3_6_27B
from dagster_project.store.dataclass_json import to_json
from dagster_project.store.layout import progress_key
from dagster_project.store.storage import LocalStore, StoreLocationError, open_store
from tests.support.heartbeats import heartbeat


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ("dflash",)):
    """(command path, its parser) for the parser and every sub-parser below it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


def test_every_option_of_every_command_says_what_it_does():
    commands = list(_commands(cli.build_parser()))
    assert {" ".join(path) for path, _ in commands} >= {
        "dflash status",
        "dflash fleet up",
        "dflash fleet down",
        "dflash fleet status",
        "dflash fleet forget",
        "dflash fleet router",
        "dflash tune",
        "dflash plan",
        "dflash demo",
    }
    unexplained = [
        f"{' '.join(path)} {action.option_strings[0]}"
        for path, parser in commands
        for action in _options(parser)
        if not action.help or action.help == argparse.SUPPRESS or action.help.startswith("default:")
    ]
    assert unexplained == []
    for path, parser in commands:
        text = parser.format_help()
        assert "brief's" not in text and "BRIEF" not in text and "DESIGN" not in text, path  # no internal notes


def test_each_fleet_action_shows_only_its_own_flags():
    parsers = {" ".join(path): parser for path, parser in _commands(cli.build_parser())}
    flags = {name: {f for a in _options(p) for f in a.option_strings} for name, p in parsers.items()}
    assert {"--gpus", "--simulate", "--sim-option", "--max-running-requests"} <= flags["dflash fleet up"]
    assert flags["dflash fleet down"] == {"--node"}
    assert flags["dflash fleet status"] == {"--json"}
    assert flags["dflash fleet forget"] == {"--node"}
    assert flags["dflash fleet router"] == {"--router-port", "--router-metrics-port"}
    assert flags["dflash fleet"] == set()


def test_sim_option_lists_every_simulator_setting_with_the_default_fleet_up_starts_with():
    up = {" ".join(path): parser for path, parser in _commands(cli.build_parser())}["dflash fleet up"]
    (sim_option,) = [a for a in _options(up) if "--sim-option" in a.option_strings]
    assert 'output_len="lognormal:300:0.6"' in sim_option.help  # the demo simulator's, not SimConfig's
    assert "max_running_requests=16" in sim_option.help and "gpu_memory_gb=null" in sim_option.help
    assert "api_key" not in sim_option.help  # from SGLANG_API_KEY only
    with pytest.raises(SystemExit, match="NAME one of host, model_path"):
        parse_sim_options(["max_runing_requests=8"])


def test_demo_help_says_it_deletes_the_demo_directory(capsys):
    with pytest.raises(SystemExit):
        cli.main(["demo", "--help"])
    assert "DELETES ./.demo/" in " ".join(capsys.readouterr().out.split())


def test_fleet_status_is_a_table_with_pids_of_this_nodes_servers():
    probes = [
        {"url": "http://127.0.0.1:30000", "healthy": True, "max_running_requests": 69, "running": 12, "queued": 3},
        {"url": "http://gpu-2:30000", "healthy": False, "error": "connection refused"},
    ]
    lines = fleet_table(probes, {30000: 4242}, hostname="head", served_model=QWEN3_6_27B.model).splitlines()
    assert lines[0].split() == ["pid", "address", "health", "model", "cap", "running", "queued", "note"]
    assert lines[1].split() == ["4242", "127.0.0.1:30000", "healthy", "—", "69", "12", "3"]
    # Another node's server: no pid here, figures it did not report are unknown, not 0.
    assert lines[2].split()[:7] == ["—", "gpu-2:30000", "unreachable", "—", "—", "—", "—"]
    assert lines[2].endswith("connection refused")


def test_a_store_root_under_a_file_or_a_uri_missing_its_colon_is_refused(tmp_path):
    file = tmp_path / "store.txt"
    file.write_text("not a store")
    for root in (file, file / "sub"):
        with pytest.raises(StoreLocationError, match=f"{file} is a file"):
            open_store(str(root))
    for uri in ("s3//bucket/x", "S3//bucket"):
        with pytest.raises(StoreLocationError, match="missing the colon"):
            open_store(uri)
    assert open_store(str(tmp_path / "s3" / "bucket")).uri.endswith("s3/bucket")  # a plain path stays one


def _dflash(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    environment = {
        **os.environ,
        "DFLASH_STORE": str(tmp_path / "store"),
        "DFLASH_WORK_DIR": str(tmp_path / "work"),
        "DAGSTER_HOME": "",
        **env,
    }
    return subprocess.run(
        [sys.executable, "-m", "dagster_project.cli", *args], env=environment, capture_output=True, text=True
    )


@pytest.mark.parametrize("store", ["file", "s3//bucket/x", "s3:/bucket"])
def test_a_store_setting_that_cannot_work_ends_status_in_one_line(tmp_path, store):
    if store == "file":
        store = str(tmp_path / "a-file")
        Path(store).write_text("")
    result = _dflash(tmp_path, "status", DFLASH_STORE=store)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("dflash status: "), result.stderr
    assert "DFLASH_STORE" in result.stderr or "s3://bucket/prefix" in result.stderr or "s3://" in result.stderr


def test_status_on_an_empty_store_says_what_to_materialize_first_and_imports_no_dagster(tmp_path):
    """Run in a fresh interpreter as `dflash status` runs, then list what it imported."""
    probe = (
        "import sys, io, contextlib, json\n"
        "from dagster_project import cli\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        "    code = cli.main(['status'])\n"
        "heavy = ('dagster', 'transformers', 'botocore', 'boto3', 'aiohttp', 'pyarrow')\n"
        "heavy = sorted(m for m in heavy if m in sys.modules)\n"
        "print(json.dumps({'code': code, 'out': out.getvalue(), 'heavy': heavy}))\n"
    )
    environment = {
        **os.environ,
        "DFLASH_STORE": str(tmp_path / "store"),
        "DFLASH_WORK_DIR": str(tmp_path / "work"),
        "DAGSTER_HOME": "",
    }
    result = subprocess.run([sys.executable, "-c", probe], env=environment, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["code"] == 0 and report["heavy"] == []
    first = report["out"].splitlines()[0]
    assert first.startswith("NOTHING TO REPORT YET") and "has no raw_prompts" in first
    assert "--select raw_prompts,conversations" in first


def test_status_with_dagster_home_shows_the_recorded_view_with_its_age_and_imports_no_dagster(tmp_path):
    """The head node's case: DAGSTER_HOME set. Without --dagster, status shows what the run_report asset recorded
    (its age, the pool alert naming `dflash free-slots`) and names the command that ends a run seen dead now."""
    store = LocalStore(tmp_path / "store")
    write_view(
        store,
        DagsterView(
            taken_at=time.time() - 120,
            materialized=[0, 1, 2, 3],
            dead_runs=[DeadHolder("killed-run", "ended (FAILURE)")],
            pool_alerts=["run waiting-run waits for a slot ... Free their slots: `dflash free-slots killed-run`"],
        ),
    )
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    started = process_start(child.pid)
    child.wait()  # the process the heartbeat names is gone: the run is dead
    host, _, _ = this_process()
    beat = heartbeat(0, host=host, pid=child.pid, process_start=started, run_id="dead-run")
    store.put_bytes(progress_key(0), to_json(beat))
    home = tmp_path / "dagster_home"
    home.mkdir()
    probe = (
        "import sys, io, contextlib, json\n"
        "from dagster_project import cli\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        "    code = cli.main(['status'])\n"
        "print(json.dumps({'code': code, 'out': out.getvalue(), 'dagster': 'dagster' in sys.modules}))\n"
    )
    environment = {
        **os.environ,
        "DFLASH_STORE": str(store.root),
        "DFLASH_WORK_DIR": str(tmp_path / "work"),
        "DAGSTER_HOME": str(home),
    }
    result = subprocess.run([sys.executable, "-c", probe], env=environment, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["code"] == 0 and report["dagster"] is False
    text = report["out"]
    assert re.search(
        r"Dagster \(as of 12\d s ago, recorded by run_report\): 4 completions shards materialized; "
        r"dead runs: killed-run \(ended \(FAILURE\)\)",
        text,
    ), text
    assert re.search(r"ALERT \[pool\]: .*`dflash free-slots killed-run` \(as of 12\d s ago\)", text), text
    dead = next(line for line in text.splitlines() if "ALERT [dead_runs]" in line)
    assert "dead-run" in dead and "`dflash status --dagster`" in dead and "`dflash free-slots dead-run`" in dead


def test_status_without_a_recorded_view_says_so_and_what_reads_the_instance(tmp_path):
    result = _dflash(tmp_path, "status")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Dagster: no view recorded yet" in result.stdout and "`dflash status --dagster`" in result.stdout


def test_fleet_status_without_a_fleet_says_so_at_once_and_json_prints_no_server(tmp_path) -> None:
    """Run in a fresh interpreter as `dflash fleet status` runs, then list what it imported: no Dagster, so it
    answers within about a second."""
    probe = (
        "import sys, io, contextlib, json\n"
        "from dagster_project import cli\n"
        "out, err = io.StringIO(), io.StringIO()\n"
        "with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):\n"
        "    codes = [cli.main(['fleet', 'status']), cli.main(['fleet', 'status', '--json'])]\n"
        "heavy = ('dagster', 'transformers', 'botocore', 'boto3', 'pyarrow')\n"
        "heavy = sorted(m for m in heavy if m in sys.modules)\n"
        "print(json.dumps({'codes': codes, 'out': out.getvalue(), 'err': err.getvalue(), 'heavy': heavy}))\n"
    )
    environment = {**os.environ, "DFLASH_STORE": str(tmp_path / "store"), "DFLASH_WORK_DIR": str(tmp_path / "work")}
    for name in ("DFLASH_SGLANG_ENDPOINTS", "DFLASH_SGLANG_ROUTER"):
        environment.pop(name, None)
    result = subprocess.run([sys.executable, "-c", probe], env=environment, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["codes"] == [1, 1] and report["heavy"] == [], report
    assert report["out"] == "", "--json prints one line per server: none"
    assert report["err"].splitlines() == [report["err"].splitlines()[0]] * 2
    assert report["err"].startswith("no fleet: no node registered in the store, nothing recorded in ")


def test_hold_shows_the_gate_and_its_evidence_and_a_release_records_who_when_why(tmp_path, monkeypatch, capsys):
    from dagster_project.generation.line_hold import Hold, HoldExample, put_hold, read_hold, read_hold_log

    monkeypatch.setenv("DFLASH_STORE", str(tmp_path))
    store = LocalStore(tmp_path)
    example = HoldExample("conv-1#turn0", "\n</think>\n\nOK.", "http://127.0.0.1:30000")
    put_hold(
        store, Hold("short_answers", "BLOCKED: 90% short", 0.9, 0.1, 120, "fleet", time.time(), examples=[example])
    )

    assert cli.main(["hold"]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith("LINE HELD") and "short_answers at 90.0% (threshold 10.0%, 120 answers, fleet)" in shown
    assert "conv-1#turn0" in shown and "OK." in shown and "dflash hold release" in shown
    with pytest.raises(SystemExit, match="--reason"):
        cli.main(["hold", "release"])
    assert cli.main(["hold", "release", "--override", "short_answers", "--reason", "known", "--by", "ana"]) == 0
    assert read_hold(store) is None
    [released] = read_hold_log(store).released
    assert (released.released_by, released.release_reason, released.overridden) == ("ana", "known", ["short_answers"])
    with pytest.raises(SystemExit, match="no hold is in force"):
        cli.main(["hold", "release", "--reason", "again"])


def test_hold_release_says_what_it_drops_and_drop_all_is_recorded(tmp_path, monkeypatch, capsys):
    """A release keeps the answers before the hold's onset; `--drop-all` drops the held runs' answers whole (recorded
    in the log, which `line_stop.condemned_answers` reads)."""
    from dagster_project.generation.line_hold import Hold, put_hold, read_hold_log

    monkeypatch.setenv("DFLASH_STORE", str(tmp_path))
    store = LocalStore(tmp_path)
    held = Hold("short_answers", "BLOCKED", 0.9, 0.1, 120, "run", time.time(), onset=time.time() - 60)
    put_hold(store, held)
    assert cli.main(["hold", "release", "--reason", "fixed", "--by", "ana"]) == 0
    assert "those before it are kept" in capsys.readouterr().out
    put_hold(store, held)
    assert cli.main(["hold", "release", "--drop-all", "--reason", "unsure", "--by", "ana"]) == 0
    assert "every answer the held runs journaled is dropped" in capsys.readouterr().out
    assert [hold.drop_all for hold in read_hold_log(store).released] == [False, True]
    put_hold(store, held)
    with pytest.raises(SystemExit, match="choose one"):
        cli.main(["hold", "release", "--drop-all", "--override", "short_answers", "--reason", "r"])
