"""A server of another model stays in view after the run that set it aside: real simulators (one of the job's
model, one named as another, one under the job's name with another vocabulary), a shard run to its end, then
`status` and `dflash fleet status` name each server's model and the verdict on it."""

from __future__ import annotations

import os
import subprocess
import sys

from dagster_project.generation.dispatch import Dispatcher, DispatchOptions
from dagster_project.generation.stage import generate_shard
from dagster_project.generation_settings import GenerationSettings
from dagster_project.ops.status import collect_status, render_text
from dagster_project.sglang.model_identity import QWEN3_6_27B
from dagster_project.tokenizer import load_tokenizer
from tests.integration.test_generation_resume import write_multi_turn_prompts
from tests.support.ingest_helpers import run_stages

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
SIM = {"output_len": "uniform:16:48", "max_running_requests": 4}
OTHER_MODELS = [
    {},
    {"model_path": LLAMA, "architecture": "LlamaForCausalLM", "vocab_size": 128256},
    {"vocab_size": 151936},  # the job's name over another checkpoint: only the run's probes tell
]
STOP_IT = "no shard sends it work — stop it or point it at the right model"


def test_servers_of_another_model_stay_named_after_the_run_in_status_and_fleet_status(tmp_path, sim_fleet):
    source = tmp_path / "prompts.jsonl"
    write_multi_turn_prompts(source, conversations=6, turns=2)
    store = run_stages(tmp_path, [str(source)], num_shards=1).store
    fleet = sim_fleet(3, OTHER_MODELS, **SIM)
    good, llama, renamed = fleet.urls
    dispatcher = Dispatcher(fleet.urls, DispatchOptions(probe_interval_s=0.2), expected_model=QWEN3_6_27B)

    manifest = generate_shard(
        store, 0, tokenizer=load_tokenizer(), settings=GenerationSettings(max_new_tokens=64),
        dispatcher=dispatcher, work_dir=tmp_path,
    )  # fmt: skip
    assert manifest.ok == manifest.rows == 12 and fleet.job_requests(1) == fleet.job_requests(2) == []

    text = render_text(collect_status(store, fleet.urls))
    assert f"      model: {QWEN3_6_27B.model}, the job's" in text
    other_name = f"serves {LLAMA}, not the job's {QWEN3_6_27B.model}"
    assert f"      model: {LLAMA} — OTHER MODEL: {other_name}" in text
    assert f"ALERT [server]: {llama}: {other_name}; {STOP_IT}" in text
    # Its name is the job's; the finished run's last heartbeat keeps what its vocabulary probe found.
    found = "the run of shard 0 set it aside: served_model_mismatch: it does not serve Qwen/Qwen3.6-27B: its vocabulary"
    assert f"      model: {QWEN3_6_27B.model} — OTHER MODEL: {found}" in text
    assert f"ALERT [server]: {renamed}: {found}" in text and f"151,936 ids, not 248,320; {STOP_IT}" in text
    assert "is idle while" not in text and good not in text.split("Alerts")[-1]

    env = {
        **os.environ,
        "DFLASH_STORE": str(tmp_path / "store"),
        "DFLASH_WORK_DIR": str(tmp_path / "work"),
        "DFLASH_SGLANG_ENDPOINTS": ",".join(fleet.urls),
    }
    table = subprocess.run(
        [sys.executable, "-m", "dagster_project.cli", "fleet", "status"],
        env=env, capture_output=True, text=True, timeout=120, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert table[0].split()[:4] == ["pid", "address", "health", "model"]
    rows = {line.split()[1]: line.split()[3:] for line in table[1:]}
    assert rows[good.split("://")[1]][0] == QWEN3_6_27B.model
    assert rows[llama.split("://")[1]][:3] == [LLAMA, "(OTHER", "MODEL)"]
