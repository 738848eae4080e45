#!/usr/bin/env python3
"""Eager per-call time of a small all_reduce through torch.distributed, for one backend.

    # efccl's own backend (efccl.torch):
    PYTHONPATH=build-torch/python torchrun --nproc_per_node 2 tools/bench/torch_backend_latency.py --backend efccl
    # torch's ProcessGroupNCCL, with efccl under it:
    LD_PRELOAD=build/lib/libefccl.so torchrun --nproc_per_node 2 tools/bench/torch_backend_latency.py --backend nccl

Both run the same efccl collective; the difference is the process group's own cost per call
(events, streams, work objects, bookkeeping). Each repeat times --iters back-to-back calls,
from a barrier to a device synchronize, and takes the slowest rank; rank 0 prints one JSON line
per mode with the median over the repeats (µs per call):

  sync:  dist.all_reduce(t)                       (async_op=False, torch's eager default)
  async: dist.all_reduce(t, async_op=True).wait()

Ranks share GPU LOCAL_RANK mod the GPU count (on one GPU, run under MPS: efccl-mprun --mps, or
nvidia-cuda-mps-control -d).
"""

import argparse
import datetime
import importlib
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["efccl", "nccl"], required=True)
    parser.add_argument("--bytes", type=int, default=8, help="message size (float32 elements)")
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json-out", help="also append the JSON lines to this file (rank 0)")
    args = parser.parse_args()
    if args.bytes % 4 or args.bytes <= 0:
        parser.error("--bytes must be a positive multiple of 4 (float32 elements)")

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    device = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(device)
    if args.backend == "efccl":
        importlib.import_module("efccl.torch")  # registers "efccl"
    dist.init_process_group(args.backend, device_id=device, timeout=datetime.timedelta(seconds=300))
    t = torch.ones(args.bytes // 4, device=device)

    def timed(call):
        for _ in range(args.warmup):
            call()
        results = []
        for _ in range(args.repeats):
            dist.barrier(device_ids=[device.index])
            torch.cuda.synchronize(device)
            start = time.perf_counter()
            for _ in range(args.iters):
                call()
            torch.cuda.synchronize(device)
            us = (time.perf_counter() - start) / args.iters * 1e6
            slowest = torch.tensor([us], device=device, dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            results.append(slowest.item())
        return results

    modes = {
        "sync": lambda: dist.all_reduce(t),
        "async": lambda: dist.all_reduce(t, async_op=True).wait(),
    }
    lines = []
    for mode, call in modes.items():
        repeats = timed(call)
        lines.append(json.dumps({
            "backend": args.backend, "mode": mode, "bytes": args.bytes, "ranks": world,
            "us_per_call": round(statistics.median(repeats), 3),
            "repeats": [round(r, 3) for r in repeats], "iters": args.iters,
            "preload": os.environ.get("LD_PRELOAD", ""), "gpu": torch.cuda.get_device_name(device),
            "torch": torch.__version__,
        }))
    if rank == 0:
        for line in lines:
            print(line, flush=True)
        if args.json_out:
            with open(args.json_out, "a") as f:
                f.write("\n".join(lines) + "\n")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
