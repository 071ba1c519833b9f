"""CPU stand-ins for the two `sgl_kernel` ops SGLang 0.5.23 still calls on a CPU without AMX (`fleet up --cpu`).

PyPI's `sglang-kernel` wheel is built for CUDA alone: importing it fails on `libcuda.so.1`, and PyPI has no CPU
build of it. On a CPU without AMX, SGLang's layers take their torch-native paths, and only these two ops of the
kernel package are still called directly:

* `assign_req_to_token_pool_cpu` — `srt/mem_cache/allocation.py`, on every request: writes each request's new KV
  cache locations into its row of the request→token table;
* `copy_all_layer_kv_cache_cpu` — `kernels/ops/kvcache/cache_move.py`, with speculative decoding only: copies KV
  rows within each layer's buffer.

`dflash fleet up --cpu` puts this module's folder first on the server's PYTHONPATH (`launch.CPU_KERNELS`), so
`import sgl_kernel` finds this module instead of the CUDA wheel. It runs in the SGLang environment (torch is
there), never in the project's. Any other op SGLang imports from it is a stub that fails
loudly when called, naming the op, rather than letting a CPU test run on a path nobody wrote.
"""

from __future__ import annotations

import ctypes

import torch

__version__ = "0.4.10"  # the sglang-kernel release sglang 0.5.23 pins; some callers compare it


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """`req_to_token[req, start:end] = out_cache_loc[the request's slice]`, the requests' slices laid end to end in
    `out_cache_loc` in batch order (what the CUDA kernel and its Triton twin do)."""
    del pool_len  # the table's row length: every slice already fits in it
    at = 0
    for req, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist(), strict=True):
        count = end - start
        req_to_token[req, start:end] = out_cache_loc[at : at + count].to(req_to_token.dtype)
        at += count


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """For every layer buffer (a raw address and its row size in bytes), copy row `src_loc[i]` onto `tgt_loc[i]`."""
    for address, row_bytes in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        for source, target in zip(src_loc.tolist(), tgt_loc.tolist(), strict=True):
            ctypes.memmove(address + target * row_bytes, address + source * row_bytes, row_bytes)


class MissingKernelOp(NotImplementedError):
    """A kernel op this stand-in does not provide was called."""


def __getattr__(name: str):
    """Any other op: a stub that fails naming the op when called. SGLang imports several CPU ops at module load
    (`from sgl_kernel import build_tree_kernel_efficient_cpu`, ...) on paths a dense model without speculative
    decoding never calls; the import must succeed, the call must not."""
    if name.startswith("__"):  # the import system's own probes (__path__, __spec__ ...) are not ops
        raise AttributeError(name)

    def missing(*args, **kwargs):
        raise MissingKernelOp(
            f"sgl_kernel.{name}: the CPU stand-in (dagster_project/sglang/cpu_kernels) provides only "
            "assign_req_to_token_pool_cpu and copy_all_layer_kv_cache_cpu; SGLang took a path that needs the "
            f"kernel op {name!r}"
        )

    missing.__name__ = missing.__qualname__ = name
    return missing
