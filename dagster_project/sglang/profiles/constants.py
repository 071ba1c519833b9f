"""Every number the GPU profiles rest on, with where it comes from: the one table the code and docs/GPU_PROFILES.md
both read.

A row is published (a datasheet or a published measurement), observed (the seed run's own figures), an assumption
(no published figure found: flagged wherever a profile is printed) or fitted (solved from an anchor, named in the
note). Each row carries a fingerprint of its value, unit, source and date: changing a value without its source and
date fails `tests/unit/sglang/test_profiles.py` until the fingerprint is renewed (`python -m
dagster_project.sglang.profiles.constants` prints fresh fingerprints and rewrites the docs' table), so a number
cannot drift away from its citation unnoticed.
"""

from __future__ import annotations

import enum
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path


class Kind(enum.Enum):
    PUBLISHED = "published"
    OBSERVED = "observed"
    ASSUMPTION = "assumption"
    FITTED = "fitted"


@dataclass(frozen=True)
class Constant:
    name: str
    value: float
    unit: str
    kind: Kind
    source: str  # a URL, or the document a figure comes from
    date: str  # when the source was published or last updated (ISO), as it states
    note: str
    fingerprint: str  # `fingerprint_of(...)`: renewed only together with the source and date

    @property
    def flagged(self) -> bool:
        """Not backed by a publication or a measurement: said so wherever a figure depends on it."""
        return self.kind in (Kind.ASSUMPTION, Kind.FITTED)


def fingerprint_of(name: str, value: float, unit: str, source: str, date: str) -> str:
    return hashlib.sha256(f"{name}|{value!r}|{unit}|{source}|{date}".encode()).hexdigest()[:12]


# Where each hardware figure was read (NVIDIA's own datasheets, quoted by these pages, are the primary sources).
_H200_WIKI = "https://aiwiki.ai/wiki/nvidia_h200 (quoting NVIDIA's H200 datasheet, H200 SXM)"
_H200_SPECS = "https://lzwjava.github.io/nvidia-h200-gpu-specs-en (NVIDIA's H100/H200 SXM table, *with sparsity)"
_H200_NODE = (
    "https://ai-hpc.github.io/ai-hardware-engineer-roadmap/Phase%205%20-%20Advanced%20Topics%20and%20Specialization/"
    "1.%20GPU%20Infrastructure/Nvidia%20GPU/HPC%20Setup/8x-H200-Training-Inference (8x H200 SXM system snapshot)"
)
_DGX_B200 = (
    "https://brent-newsom-nvidia.github.io/AIPS-Boom/wiki/NVIDIA-DGX-B200"
    " (quoting nvidia.com/en-us/data-center/dgx-b200)"
)
_HGX_B200_TABLE = "https://glennklockwood.com/garden/processors/B200 (HGX B200 at 1,000 W, from NVIDIA's figures)"
_VULTR_B200 = (
    "https://docs.vultr.com/inference-cookbook/cuda/getting-started/hardware-overview (nvidia-smi on HGX B200)"
)
_UNDATED = "undated, read 2026-12-01"
_GKE_QWEN = (
    "https://medium.com/google-cloud/1-million-tokens-per-second-qwen-3-5-27b-on-gke-with-b200-gpus-161da5c1b592"
)
_SEED = "the seed run: 7 B200, SGLang, NEXTN 3/1/4, as its operator reported it"

# fmt: off
TABLE: tuple[Constant, ...] = (
    # ---- hardware: NVIDIA's published figures (dense = half the "with sparsity" figure) ----
    Constant("h200.hbm_bandwidth", 4.8, "TB/s", Kind.PUBLISHED, _H200_WIKI, "2026-06-21",
             "HBM3e", "85d5350328b4"),
    Constant("h200.memory", 141.0, "GB", Kind.PUBLISHED, _H200_WIKI, "2026-06-21",
             "HBM3e; nvidia-smi shows 140.4 GiB of it (h200.memory_visible)", "c3e61047f356"),
    Constant("h200.memory_visible", 140.4, "GiB", Kind.OBSERVED,
             "SGLang 0.5.23 boot log on an H200 (avail mem before load, plus the CUDA context)", "2026-11-20",
             "what the capacity model sizes the pools from", "7d7220d6f6c2"),
    Constant("h200.bf16_dense", 989.0, "TFLOPS", Kind.PUBLISHED, _H200_NODE, _UNDATED,
             "its ~1,979 TFLOPS BF16 is the with-sparsity figure: dense is half", "dc6d3033029b"),
    Constant("h200.fp8_dense", 1979.0, "TFLOPS", Kind.PUBLISHED, _H200_SPECS, _UNDATED,
             "3,958 TFLOPS with sparsity / 2", "cd3fe2917c78"),
    Constant("b200.hbm_bandwidth", 8.0, "TB/s", Kind.PUBLISHED, _DGX_B200, "2026-05-09",
             "64 TB/s per DGX B200 / 8 GPUs; 8.0 TB/s also in " + _VULTR_B200, "743bb24d1219"),
    Constant("b200.memory", 180.0, "GB", Kind.PUBLISHED, _DGX_B200, "2026-05-09",
             "1,440 GB per DGX B200 / 8 GPUs", "ab1a4ff2d838"),
    Constant("b200.memory_visible", 179.0, "GiB", Kind.PUBLISHED, _VULTR_B200, "2026-03-11",
             "nvidia-smi memory.total on an HGX B200 (the seed's '183 GB each' is the same 183,296 MiB)",
             "6cbb8e54ad7c"),
    Constant("b200.bf16_dense", 2250.0, "TFLOPS", Kind.PUBLISHED, _HGX_B200_TABLE, _UNDATED,
             "dense matrix BF16; 4,500 with sparsity", "725de0bb27cb"),
    Constant("b200.fp8_dense", 4500.0, "TFLOPS", Kind.PUBLISHED, _HGX_B200_TABLE, _UNDATED,
             "dense matrix FP8; 72 PFLOPS sparse per DGX B200 / 8 / 2", "dd5bf5872853"),
    # ---- how much of the peak a serving engine gets: no published figure for this model ----
    Constant("weights_bandwidth_efficiency", 0.8, "of peak HBM bandwidth", Kind.ASSUMPTION,
             "assumption: large weight reads (GEMV/skinny GEMM) stream at ~80% of peak", "2026-12-01",
             "no published measurement for Qwen3.6-27B on SGLang", "adacd6cf4875"),
    Constant("step_overhead", 0.002, "s per verify pass", Kind.ASSUMPTION,
             "assumption: scheduler, sampling and kernel launches between CUDA-graph replays", "2026-12-01",
             "a fixed cost per decode step, independent of the batch", "f970d4b73cee"),
    Constant("prefill_mfu", 0.4, "of dense peak", Kind.ASSUMPTION,
             "assumption: chunked prefill of a dense 27B model reaches ~40% of dense tensor peak", "2026-12-01",
             "prefill is compute-bound; GDN chunked kernels and attention run below GEMM efficiency",
             "129b3a2d0bf7"),
    Constant("request_bandwidth_efficiency", 0.169, "of peak HBM bandwidth", Kind.FITTED,
             "fitted: the seed run's 2,271 output tok/s per B200 at 16 running (seed.decode_output_rate)",
             "2026-12-01",
             "per-request traffic (mamba state read + per-draft snapshots, KV reads): small scattered kernels",
             "15cd524426e3"),
    # ---- the seed run (observed) ----
    Constant("seed.decode_output_rate", 2271.0, "output tok/s per GPU", Kind.OBSERVED, _SEED, "2026-11-01",
             "15,900 tok/s over 7 B200 as SGLang logs it (decode batches)", "055b62665e46"),
    Constant("seed.running", 16.0, "running requests per GPU", Kind.OBSERVED, _SEED, "2026-11-01",
             "max_running_requests chosen from memory; 48 client requests per server", "ff9a75cae544"),
    Constant("seed.accept_length", 3.08, "tokens per verify pass", Kind.OBSERVED, _SEED, "2026-11-01",
             "under sustained load (accept rate 0.69); 3.5-3.8 on a single cold request", "72ba5aa3ed32"),
    Constant("seed.output_tokens", 2472.0, "output tokens per answer", Kind.OBSERVED, _SEED, "2026-11-01",
             "measured mean (2,306 planned)", "e58cf980712e"),
    Constant("seed.gpus", 7.0, "B200", Kind.OBSERVED, _SEED, "2026-11-01",
             "one node, one SGLang server per GPU", "dd58b572b3b7"),
    Constant("seed.cost_per_hour", 27.0, "US$ per hour, whole node", Kind.OBSERVED, _SEED, "2026-11-01",
             "~$1,200 expected for the run", "a980ede1ed29"),
    Constant("seed.events", 913786.0, "prompts", Kind.OBSERVED, _SEED, "2026-11-01",
             "the whole job", "9d5a2755e331"),
    Constant("seed.req_per_s", 6.1, "answers per second, whole node", Kind.OBSERVED, _SEED, "2026-11-01",
             "measured (5.6 planned): 41.5 h for 913,786 prompts", "1bd5bf837159"),
    Constant("seed.prompt_tokens", 600.0, "prompt tokens per request", Kind.ASSUMPTION,
             "assumption: the capacity model's expected prompt (no mean prompt length in the seed's figures)",
             "2026-12-01", "sets the prefill share and the decode context", "ba9133841323"),
    # ---- a public figure for the same model class ----
    Constant("public.total_rate", 11499.0, "total tok/s per B200", Kind.PUBLISHED, _GKE_QWEN, "2026-03-26",
             "1,103,941 tok/s on 96 B200; Qwen3.5-27B FP8, FP8 KV, vLLM 0.18.0, DP per GPU, MTP-1",
             "320871a657ba"),
    Constant("public.input_tokens", 1024.0, "prompt tokens per request", Kind.PUBLISHED, _GKE_QWEN, "2026-03-26",
             "InferenceMAX method, 0% prefix cache hits", "5bcb3930e69c"),
    Constant("public.output_tokens", 512.0, "output tokens per request", Kind.PUBLISHED, _GKE_QWEN, "2026-03-26",
             "InferenceMAX method", "df52ca856896"),
    Constant("public.tpot", 0.046, "s per output token", Kind.PUBLISHED, _GKE_QWEN, "2026-03-26",
             "flat at ~46 ms at every node count; with the rate it gives the running requests (Little's law)",
             "890ea32af688"),
)
# fmt: on

BY_NAME: dict[str, Constant] = {row.name: row for row in TABLE}


def value(name: str) -> float:
    return BY_NAME[name].value


def stale_rows() -> list[str]:
    """Rows whose fingerprint no longer matches their value, unit, source and date."""
    return [
        row.name
        for row in TABLE
        if fingerprint_of(row.name, row.value, row.unit, row.source, row.date) != row.fingerprint
    ]


DOCS_PAGE = Path(__file__).resolve().parents[3] / "docs" / "GPU_PROFILES.md"
_DOCS_BLOCK = re.compile(r"(<!-- constants -->\n).*?(\n<!-- /constants -->)", re.S)


def markdown_table() -> str:
    """The table as docs/GPU_PROFILES.md shows it (the docs test compares them)."""
    lines = [
        "| name | value | unit | kind | source | date | note |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in TABLE:
        kind = f"**{row.kind.value}**" if row.flagged else row.kind.value
        lines.append(f"| `{row.name}` | {row.value:g} | {row.unit} | {kind} | {row.source} | {row.date} | {row.note} |")
    return "\n".join(lines)


def docs_table() -> str | None:
    """The table as the docs page holds it now (None: the page has no constants block)."""
    found = _DOCS_BLOCK.search(DOCS_PAGE.read_text())
    return found.group(0)[len("<!-- constants -->\n") : -len("\n<!-- /constants -->")] if found else None


def write_docs_table() -> None:
    text = DOCS_PAGE.read_text()
    DOCS_PAGE.write_text(_DOCS_BLOCK.sub(lambda m: m.group(1) + markdown_table() + m.group(2), text))


if __name__ == "__main__":
    for row in TABLE:
        print(row.name, fingerprint_of(row.name, row.value, row.unit, row.source, row.date))
    write_docs_table()
