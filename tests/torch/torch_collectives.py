#!/usr/bin/env python3
"""PyTorch's collectives on efccl: exact results of every operation torch.distributed offers.

Run on a machine with one or more GPUs (torch >= 2.4; written against torch 2.11); ranks map to
GPU LOCAL_RANK mod the GPU count, so with one GPU every rank shares it (efccl only: NCCL refuses
two ranks on one GPU, and processes sharing a GPU want an MPS daemon):

    LD_PRELOAD=build/lib/libefccl.so torchrun --nproc_per_node 2 tests/torch/torch_collectives.py
    LD_PRELOAD=build/lib/libefccl.so build/bin/efccl-mprun -n 2 -- python3 tests/torch/torch_collectives.py

With `--backend efccl` (or EFCCL_TORCH_BACKEND=efccl) it checks efccl's own process-group
backend instead (`import efccl.torch`; no preload: torch's NCCL stays loaded beside it):

    PYTHONPATH=build-torch/python torchrun --nproc_per_node 2 tests/torch/torch_collectives.py --backend efccl

It reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT (both launchers set them).
`--only all_to_all,batch_isend` runs only the checks whose names contain one of the parts. The
skewed all_to_all_single checks exercise efccl's balancer (on by default; docs/balancer.md):
tests/runtime/run_gpu_balance.sh runs them on one GPU with EFCCL_BALANCE_TOPOLOGY set.
Without the preload it checks torch's own NCCL, which is how the script itself is validated.
Inputs are small integers (or sums divisible by the world size for AVG), so every result is
exactly representable in every dtype and is compared exactly. Prints "PASS <check>" or
"FAIL <check>: <details>" per check (rank 0 prints PASS lines, any rank prints its FAILs), a
summary on rank 0, and exits nonzero when any check failed on this rank.
"""

import datetime
import faulthandler
import os
import signal
import struct
import sys
import time
import traceback

import torch
import torch.distributed as dist

BACKEND = os.environ.get("EFCCL_TORCH_BACKEND", "nccl")
if "--backend" in sys.argv:
    BACKEND = sys.argv[sys.argv.index("--backend") + 1]
if BACKEND == "efccl":
    import efccl.torch  # noqa: F401 - registers the backend

# --only SUBSTR[,SUBSTR...]: run only the checks whose names contain one of them (the balancer's
# GPU script runs the all-to-all and point-to-point checks this way).
ONLY = []
if "--only" in sys.argv:
    ONLY = [part for part in sys.argv[sys.argv.index("--only") + 1].split(",") if part]

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", RANK))
# Several ranks may share a GPU (efccl allows it; NCCL does not): rank i uses GPU i mod count.
DEVICE_INDEX = LOCAL_RANK % torch.cuda.device_count()
DEVICE = torch.device("cuda", DEVICE_INDEX)
N = 1000  # elements per rank in most checks (not a multiple of anything in particular)
BIG = (1 << 22) + 3  # a large, odd size too: other algorithms and protocols, tiling remainders
SIZES = [N, BIG]

passed = []
failed = []
skipped = []

# A fatal signal (a crash in native code) prints every thread's Python traceback first; so
# does the SIGTERM with which torchrun stops the other ranks after one failed (where each was).
faulthandler.enable(all_threads=True)
if hasattr(faulthandler, "register"):
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
# EFCCL_TORCH_TRACE_CHECKS=1 (run_gpu_checks.sh --crash-trace): every rank says when it starts
# and ends each check, so that a crash is placed even where its output is lost.
TRACE_CHECKS = os.environ.get("EFCCL_TORCH_TRACE_CHECKS") == "1"


class Skip(Exception):
    """A check that cannot run here (never counted as passed)."""


def report(name, ok, details=""):
    if ok:
        passed.append(name)
        if RANK == 0:
            print(f"PASS {name}", flush=True)
    else:
        failed.append(name)
        print(f"FAIL {name}: [rank {RANK}] {details}", flush=True)


def trace(what, name):
    if TRACE_CHECKS:
        print(f"[rank {RANK}] {time.strftime('%H:%M:%S')} {what} {name}", flush=True)


def check(name, fn):
    """Runs one check; an exception is a failure with its message."""
    if ONLY and not any(part in name for part in ONLY):
        return
    trace("START", name)
    try:
        result = fn()
        if result is None or result is True:
            report(name, True)
        else:
            report(name, False, result)
    except Skip as e:
        skipped.append(name)
        if RANK == 0:
            print(f"SKIP {name}: {e}", flush=True)
    except Exception as e:  # noqa: BLE001 - every failure is reported, none ends the run
        report(name, False, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}")
    trace("END", name)


def compare(got, expected):
    """None when equal element for element, else where they first differ."""
    if got.dtype != expected.dtype or got.shape != expected.shape:
        return f"got {got.dtype} {tuple(got.shape)}, expected {expected.dtype} {tuple(expected.shape)}"
    ne = (got != expected).nonzero()
    if ne.numel() == 0:
        return None
    i = tuple(ne[0].tolist())
    return (f"{ne.shape[0]} of {got.numel()} elements differ; first at {i}: "
            f"got {got[i].item()}, expected {expected[i].item()}")


def ramp(n, dtype, scale=1, offset=0):
    """offset + scale * (i % 13 - 6) for i < n: small integers of both signs."""
    i = torch.arange(n, device=DEVICE, dtype=torch.int64)
    return (offset + scale * (i % 13 - 6)).to(dtype)


# ---- all_reduce ------------------------------------------------------------------------------

FLOATS = [torch.float32, torch.bfloat16, torch.float16]


def value(rank, dtype, n=N):
    """Rank `rank`'s contribution: every sum, min, max and (divisible) average is exact."""
    if dtype == torch.int64:
        # Beyond 2**53: an int64 reduction done through doubles would round.
        return ramp(n, dtype, scale=(rank + 1) * WORLD, offset=(rank + 1) * (1 << 40) * WORLD)
    # At most WORLD * (WORLD + 1) / 2 * 6 * WORLD in magnitude: exact in bf16 for WORLD <= 4,
    # in fp16 for WORLD <= 8 (integers up to 256 / 2048).
    return ramp(n, dtype, scale=(rank + 1) * WORLD)


def expected_reduction(op, dtype, n=N):
    values = torch.stack([value(r, torch.int64 if dtype == torch.int64 else torch.float64, n)
                          for r in range(WORLD)])
    if op == dist.ReduceOp.SUM:
        out = values.sum(0)
    elif op == dist.ReduceOp.MAX:
        out = values.max(0).values
    elif op == dist.ReduceOp.MIN:
        out = values.min(0).values
    else:  # AVG: the sums are multiples of WORLD by construction
        total = values.sum(0)
        assert bool((total % WORLD == 0).all())
        out = total // WORLD
    return out.to(dtype)


def all_reduce_check(op, dtype, n):
    def run():
        t = value(RANK, dtype, n)
        dist.all_reduce(t, op=op)
        return compare(t, expected_reduction(op, dtype, n))
    return run


OPS = [("sum", dist.ReduceOp.SUM), ("avg", dist.ReduceOp.AVG), ("max", dist.ReduceOp.MAX),
       ("min", dist.ReduceOp.MIN)]

# AVG: NCCL's ncclAvg, which torch's NCCL group allows for every dtype but bool; the float
# results are checked exactly where the world size is a power of two (1/WORLD exact, whether
# the library pre-multiplies or post-divides), the int64 ones always (integer division of
# multiples of WORLD).
POWER_OF_TWO = WORLD & (WORLD - 1) == 0


def all_reduce_checks():
    for n in SIZES:
        for dtype in FLOATS + [torch.int64]:
            for op_name, op in OPS:
                name = f"all_reduce {op_name} {str(dtype).replace('torch.', '')} x{n}"
                if op == dist.ReduceOp.AVG and dtype in FLOATS and not POWER_OF_TWO:
                    if ONLY and not any(part in name for part in ONLY):
                        continue
                    report(name, False, f"not checked: the world size {WORLD} is not a power of two")
                    continue
                check(name, all_reduce_check(op, dtype, n))
        # In place on a view: torch passes the same pointer as send and receive buffer.
        def in_place_view(n=n):
            t = value(RANK, torch.float32, n + 8)
            dist.all_reduce(t[8:])
            want = torch.cat([value(RANK, torch.float32, n + 8)[:8],
                              expected_reduction(dist.ReduceOp.SUM, torch.float32, n + 8)[8:]])
            return compare(t, want)
        check(f"all_reduce sum on an offset view x{n}", in_place_view)
        for dtype in FLOATS + [torch.int64]:
            check(f"all_reduce product {str(dtype).replace('torch.', '')} x{n}",
                  all_reduce_product(dtype, n))
        if hasattr(dist, "_make_nccl_premul_sum"):
            for dtype in FLOATS:
                check(f"all_reduce premul_sum(0.5) {str(dtype).replace('torch.', '')} x{n}",
                      all_reduce_premul_sum(dtype, n, tensor_factor=False))
            check(f"all_reduce premul_sum(tensor 0.5) float32 x{n}",
                  all_reduce_premul_sum(torch.float32, n, tensor_factor=True))


def product_value(rank, dtype, n):
    """1, -1 or 2 by position and rank: every product over <= 8 ranks is exact."""
    i = torch.arange(n, device=DEVICE, dtype=torch.int64)
    table = torch.tensor([1, -1, 2], device=DEVICE, dtype=torch.int64)
    return table[(i + rank) % 3].to(dtype)


def all_reduce_product(dtype, n):
    def run():
        t = product_value(RANK, dtype, n)
        dist.all_reduce(t, op=dist.ReduceOp.PRODUCT)
        expected = product_value(0, torch.int64, n)
        for r in range(1, WORLD):
            expected = expected * product_value(r, torch.int64, n)
        return compare(t, expected.to(dtype))
    return run


def all_reduce_premul_sum(dtype, n, tensor_factor):
    # Each rank's value times 0.5, summed: the values are multiples of WORLD, so halves of them
    # and their sums are exact in every dtype checked.
    def run():
        factor = torch.tensor([0.5], device=DEVICE, dtype=dtype) if tensor_factor else 0.5
        try:
            op = dist._make_nccl_premul_sum(factor)
        except TypeError as e:
            raise Skip(f"this torch makes no premul_sum of a tensor factor ({e})") from e
        t = value(RANK, dtype, n)
        dist.all_reduce(t, op=op)
        scale = 0.5
        if BACKEND == "nccl" and dtype == torch.bfloat16 and not tensor_factor:
            # ProcessGroupNCCL hands NCCL a float scalar labelled ncclBfloat16
            # (unpackPreMulSum<float, ncclBfloat16>); NCCL reads its first two bytes as the
            # bfloat16 scalar: 0.0 for 0.5. NCCL 2.28.9 itself returns zeros (2x H200,
            # 2026-11-27); under LD_PRELOAD efccl must return the same.
            low = struct.unpack("<I", struct.pack("<f", 0.5))[0] & 0xFFFF
            scale = struct.unpack("<f", struct.pack("<I", low << 16))[0]
        expected = sum(value(r, torch.float64, n) * scale for r in range(WORLD))
        return compare(t, expected.to(dtype))
    return run


def all_reduce_coalesced_check():
    # Three tensors of different sizes (torch wants one dtype), one call.
    sizes = (N, 7, 33)
    ts = [value(RANK, torch.float32, n) for n in sizes]
    dist.all_reduce_coalesced(ts, op=dist.ReduceOp.SUM)
    for t, n in zip(ts, sizes):
        problem = compare(t, expected_reduction(dist.ReduceOp.SUM, torch.float32, n))
        if problem:
            return f"x{n}: {problem}"
    return None


def coalescing_manager_check():
    """torch's _coalescing_manager: all_reduce, all_gather_into_tensor and
    reduce_scatter_tensor batched into one call of the backend each."""
    from torch.distributed.distributed_c10d import _coalescing_manager

    ts = [value(RANK, torch.float32, n) for n in (N, 17)]
    with _coalescing_manager(device=DEVICE, async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t)
    cm.wait()
    for t, n in zip(ts, (N, 17)):
        problem = compare(t, expected_reduction(dist.ReduceOp.SUM, torch.float32, n))
        if problem:
            return f"all_reduce x{n}: {problem}"
    ins = [ramp(n, torch.float32, offset=10 * RANK) for n in (N, 5)]
    outs = [torch.full((WORLD * n,), -1.0, device=DEVICE) for n in (N, 5)]
    with _coalescing_manager(device=DEVICE, async_ops=True) as cm:
        for out, inp in zip(outs, ins):
            dist.all_gather_into_tensor(out, inp)
    cm.wait()
    for out, n in zip(outs, (N, 5)):
        problem = compare(out, torch.cat([ramp(n, torch.float32, offset=10 * r) for r in range(WORLD)]))
        if problem:
            return f"all_gather_into_tensor x{n}: {problem}"
    ins = [torch.cat([ramp(n, torch.float32, offset=100 * j + RANK) for j in range(WORLD)]) for n in (N, 5)]
    outs = [torch.full((n,), -1.0, device=DEVICE) for n in (N, 5)]
    with _coalescing_manager(device=DEVICE, async_ops=True) as cm:
        for out, inp in zip(outs, ins):
            dist.reduce_scatter_tensor(out, inp)
    cm.wait()
    for out, n in zip(outs, (N, 5)):
        expected = sum(ramp(n, torch.float32, offset=100 * RANK + r) for r in range(WORLD))
        problem = compare(out, expected)
        if problem:
            return f"reduce_scatter_tensor x{n}: {problem}"
    return None


# ---- rooted and gather/scatter collectives ----------------------------------------------------

def broadcast(n):
    def run():
        for root in range(WORLD):
            want = ramp(n, torch.float32, scale=3, offset=7 + root)
            t = want.clone() if RANK == root else torch.zeros(n, device=DEVICE)
            dist.broadcast(t, src=root)
            problem = compare(t, want)
            if problem:
                return f"root {root}: {problem}"
        return None
    return run


def reduce(n):
    def run():
        for root in range(WORLD):
            t = value(RANK, torch.int64, n)
            dist.reduce(t, dst=root, op=dist.ReduceOp.SUM)
            if RANK == root:  # the result is defined on the root only
                problem = compare(t, expected_reduction(dist.ReduceOp.SUM, torch.int64, n))
                if problem:
                    return f"root {root}: {problem}"
        return None
    return run


def all_gather_into_tensor(n):
    def run():
        out = torch.full((WORLD * n,), -1.0, device=DEVICE, dtype=torch.bfloat16)
        dist.all_gather_into_tensor(out, ramp(n, torch.bfloat16, offset=10 * RANK))
        expected = torch.cat([ramp(n, torch.bfloat16, offset=10 * r) for r in range(WORLD)])
        return compare(out, expected)
    return run


def reduce_scatter_tensor(n):
    def run():
        # Rank r contributes block j = ramp + 100 j + r; block j of the sum lands on rank j.
        inp = torch.cat([ramp(n, torch.float32, offset=100 * j + RANK) for j in range(WORLD)])
        out = torch.full((n,), -1.0, device=DEVICE)
        dist.reduce_scatter_tensor(out, inp, op=dist.ReduceOp.SUM)
        expected = sum(ramp(n, torch.float32, offset=100 * RANK + r) for r in range(WORLD))
        return compare(out, expected)
    return run


def all_to_all_even(n):
    def run():
        # Element k of the block from rank s to rank d: 1000 s + 10 d + k % 10.
        k = torch.arange(n, device=DEVICE, dtype=torch.int64) % 10
        inp = torch.cat([1000 * RANK + 10 * d + k for d in range(WORLD)]).to(torch.float32)
        out = torch.full_like(inp, -1)
        dist.all_to_all_single(out, inp)
        expected = torch.cat([1000 * s + 10 * RANK + k for s in range(WORLD)]).to(torch.float32)
        return compare(out, expected)
    return run


def all_gather_list(n):
    def run():
        # Outputs that are not views of one buffer (a list form needs its own copies).
        outs = [torch.full((n,), -1, device=DEVICE, dtype=torch.int32) for _ in range(WORLD)]
        dist.all_gather(outs, ramp(n, torch.int32, offset=7 * RANK))
        for r, out in enumerate(outs):
            problem = compare(out, ramp(n, torch.int32, offset=7 * r))
            if problem:
                return f"from rank {r}: {problem}"
        return None
    return run


def reduce_scatter_list(n):
    def run():
        inputs = [ramp(n, torch.float32, offset=100 * j + RANK) for j in range(WORLD)]
        out = torch.full((n,), -1.0, device=DEVICE)
        dist.reduce_scatter(out, inputs, op=dist.ReduceOp.SUM)
        return compare(out, sum(ramp(n, torch.float32, offset=100 * RANK + r) for r in range(WORLD)))
    return run


def gather(n):
    def run():
        for root in range(WORLD):
            mine = ramp(n, torch.float32, scale=2, offset=RANK * 3 + root)
            outs = [torch.full((n,), -1.0, device=DEVICE) for _ in range(WORLD)] if RANK == root else None
            dist.gather(mine, gather_list=outs, dst=root)
            if RANK == root:
                for r in range(WORLD):
                    problem = compare(outs[r], ramp(n, torch.float32, scale=2, offset=r * 3 + root))
                    if problem:
                        return f"root {root}, from rank {r}: {problem}"
        return None
    return run


def scatter(n):
    def run():
        for root in range(WORLD):
            parts = ([ramp(n, torch.int64, offset=1000 * d + root) for d in range(WORLD)]
                     if RANK == root else None)
            out = torch.full((n,), -1, device=DEVICE, dtype=torch.int64)
            dist.scatter(out, scatter_list=parts, src=root)
            problem = compare(out, ramp(n, torch.int64, offset=1000 * RANK + root))
            if problem:
                return f"root {root}: {problem}"
        return None
    return run


def all_to_all_list():
    # A block of its own size for every (source, destination) pair, as separate tensors.
    def block(src, dst):
        return (1000 * src + 10 * dst + torch.arange(block_size(src, dst), device=DEVICE) % 10).to(torch.float16)

    inputs = [block(RANK, d) for d in range(WORLD)]
    outputs = [torch.full((block_size(s, RANK),), -1, device=DEVICE, dtype=torch.float16)
               for s in range(WORLD)]
    dist.all_to_all(outputs, inputs)
    for s in range(WORLD):
        problem = compare(outputs[s], block(s, RANK))
        if problem:
            return f"from rank {s}: {problem}"
    return None


def block_size(src, dst):
    return 17 * ((src + 2 * dst) % 3) + 5  # uneven, different per direction


def all_to_all_uneven():
    def block(src, dst):
        return (1000 * src + 10 * dst + torch.arange(block_size(src, dst), device=DEVICE) % 10).to(torch.int64)

    inp = torch.cat([block(RANK, d) for d in range(WORLD)])
    out_sizes = [block_size(s, RANK) for s in range(WORLD)]
    out = torch.full((sum(out_sizes),), -1, device=DEVICE, dtype=torch.int64)
    dist.all_to_all_single(out, inp, output_split_sizes=out_sizes,
                           input_split_sizes=[block_size(RANK, d) for d in range(WORLD)])
    return compare(out, torch.cat([block(s, RANK) for s in range(WORLD)]))


def skewed_size(src, dst):
    """Elements src sends dst in the skewed all-to-all: one hot pair (rank 0 -> rank 1, about
    8 MiB of int64) and odd, uneven sizes of tens to hundreds of KiB elsewhere, so that the
    balancer (EFCCL_BALANCE, on by default) splits the large transfers and their tails (bytes
    past the last whole chunk) and the small ones take their default paths."""
    if src == 0 and dst == 1:
        return (1 << 20) + 7
    return 2000 + 20011 * ((3 * src + dst) % 7) + 13 * dst + src


def all_to_all_skewed(graph):
    def run():
        def block(src, dst):
            return (1000000 * src + 1000 * dst
                    + torch.arange(skewed_size(src, dst), device=DEVICE) % 1000).to(torch.int64)

        inp = torch.cat([block(RANK, d) for d in range(WORLD)])
        out_sizes = [skewed_size(s, RANK) for s in range(WORLD)]
        in_sizes = [skewed_size(RANK, d) for d in range(WORLD)]
        out = torch.full((sum(out_sizes),), -1, device=DEVICE, dtype=torch.int64)
        expected = torch.cat([block(s, RANK) for s in range(WORLD)])
        for _ in range(2):  # the second call repeats the demand: the plan and programs are kept
            out.fill_(-1)
            dist.all_to_all_single(out, inp, output_split_sizes=out_sizes,
                                   input_split_sizes=in_sizes)
            problem = compare(out, expected)
            if problem:
                return problem
        if not graph:
            return None
        # Captured (the balanced programs' executors are pinned to the graph), replayed twice;
        # warmed up on a side stream first, as torch recommends.
        side = torch.cuda.Stream(device=DEVICE)
        side.wait_stream(torch.cuda.current_stream(DEVICE))
        with torch.cuda.stream(side):
            dist.all_to_all_single(out, inp, output_split_sizes=out_sizes,
                                   input_split_sizes=in_sizes)
        torch.cuda.current_stream(DEVICE).wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            dist.all_to_all_single(out, inp, output_split_sizes=out_sizes,
                                   input_split_sizes=in_sizes)
        for step in range(2):
            out.fill_(-1)
            torch.cuda.synchronize(DEVICE)
            g.replay()
            torch.cuda.synchronize(DEVICE)
            problem = compare(out, expected)
            if problem:
                return f"replay {step}: {problem}"
        return None
    return run


# ---- point to point ---------------------------------------------------------------------------

NEXT = (RANK + 1) % WORLD
PREV = (RANK - 1) % WORLD


def send_recv_ring():
    # Even ranks send first, odd ranks receive first: no cycle of blocking sends.
    out = ramp(N, torch.float32, offset=1000 * RANK)
    got = torch.full((N,), -1.0, device=DEVICE)
    if RANK % 2 == 0:
        dist.send(out, dst=NEXT)
        dist.recv(got, src=PREV)
    else:
        dist.recv(got, src=PREV)
        dist.send(out, dst=NEXT)
    return compare(got, ramp(N, torch.float32, offset=1000 * PREV))


def batch_isend_irecv_ring(n):
    def run():
        # Both directions at once, in one group.
        to_next = ramp(n, torch.float16, offset=RANK + 1)
        to_prev = ramp(n, torch.float16, offset=-(RANK + 1))
        from_prev = torch.zeros(n, device=DEVICE, dtype=torch.float16)
        from_next = torch.zeros(n, device=DEVICE, dtype=torch.float16)
        ops = [dist.P2POp(dist.isend, to_next, NEXT), dist.P2POp(dist.irecv, from_prev, PREV),
               dist.P2POp(dist.isend, to_prev, PREV), dist.P2POp(dist.irecv, from_next, NEXT)]
        for request in dist.batch_isend_irecv(ops):
            request.wait()
        torch.cuda.synchronize(DEVICE)
        return (compare(from_prev, ramp(n, torch.float16, offset=PREV + 1))
                or compare(from_next, ramp(n, torch.float16, offset=-(NEXT + 1))))
    return run


def recv_from_any_source():
    # efccl, like NCCL, names every sender: a receive from any source is an error, at once, and
    # the group stays usable.
    t = torch.zeros(4, device=DEVICE)
    try:
        dist.recv(t)  # src=None: any source
    except Exception as e:  # noqa: BLE001 - any clear error passes; the message is shown
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        if RANK == 0:
            print(f"  (recv from any source: {type(e).__name__}: {message[:200]})", flush=True)
    else:
        return "recv without a source returned instead of raising"
    after = torch.ones(3, device=DEVICE)
    dist.all_reduce(after)
    return compare(after, torch.full((3,), float(WORLD), device=DEVICE))


def barrier():
    # The last rank arrives late; no rank may leave before it arrived (one clock per host;
    # under torchrun on several hosts the clocks differ, hence the 50 ms slack).
    if RANK == WORLD - 1:
        time.sleep(0.5)
    arrived = time.time()
    dist.barrier(device_ids=[DEVICE_INDEX])
    left = time.time()
    arrivals = torch.zeros(WORLD, dtype=torch.float64, device=DEVICE)
    arrivals[RANK] = arrived
    dist.all_reduce(arrivals)  # each rank filled its own slot
    last = arrivals.max().item()
    if left + 0.05 < last:
        return f"left the barrier at {left:.3f}, before the last arrival at {last:.3f}"
    return None


# ---- groups -----------------------------------------------------------------------------------

def parity_ranks():
    return [[r for r in range(WORLD) if r % 2 == p] for p in (0, 1) if p < WORLD]


def check_group_sum(group, members):
    """SUM of (world rank + 1) over `group`, whose members are `members` (world ranks)."""
    t = torch.full((N,), float(RANK + 1), device=DEVICE)
    dist.all_reduce(t, group=group)
    expected = torch.full((N,), float(sum(r + 1 for r in members)), device=DEVICE)
    problem = compare(t, expected)
    if problem:
        return problem
    if dist.get_world_size(group) != len(members) or dist.get_rank(group) != members.index(RANK):
        return (f"size {dist.get_world_size(group)}, rank {dist.get_rank(group)}; expected "
                f"{len(members)}, {members.index(RANK)}")
    return None


def new_group():
    # Every rank creates every group (torch's rule), then uses its own: even and odd ranks.
    groups = [(ranks, dist.new_group(ranks=ranks)) for ranks in parity_ranks()]
    ranks, group = next((r, g) for r, g in groups if RANK in r)
    problem = check_group_sum(group, ranks)
    # And a second communicator over all ranks, in a reversed broadcast.
    everyone = dist.new_group(ranks=list(range(WORLD)))
    t = torch.full((N,), float(RANK), device=DEVICE)
    dist.broadcast(t, src=WORLD - 1, group=everyone)
    problem = problem or compare(t, torch.full((N,), float(WORLD - 1), device=DEVICE))
    for _, g in groups:
        dist.destroy_process_group(g)
    dist.destroy_process_group(everyone)
    return problem


def split_group():
    if not hasattr(dist, "split_group"):
        return f"torch.distributed.split_group is not available in torch {torch.__version__}"
    # ncclCommSplit under the hood: the parent is the default group, eagerly initialised
    # (device_id given to init_process_group).
    splits = parity_ranks()
    group = dist.split_group(split_ranks=splits)
    if group is None:
        return "split_group returned None for a rank listed in split_ranks"
    problem = check_group_sum(group, next(r for r in splits if RANK in r))
    dist.destroy_process_group(group)
    return problem


# ---- CUDA graphs ------------------------------------------------------------------------------

def all_reduce_in_cuda_graph():
    x = torch.zeros(N, device=DEVICE)
    side = torch.cuda.Stream(device=DEVICE)
    side.wait_stream(torch.cuda.current_stream(DEVICE))
    with torch.cuda.stream(side):  # warm up outside the capture, as torch recommends
        for _ in range(3):
            dist.all_reduce(x)
    torch.cuda.current_stream(DEVICE).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dist.all_reduce(x)
    for step in range(5):
        x.copy_(ramp(N, torch.float32, scale=RANK + 1, offset=step * 10))
        graph.replay()
        torch.cuda.synchronize(DEVICE)
        expected = sum(ramp(N, torch.float32, scale=r + 1, offset=step * 10) for r in range(WORLD))
        problem = compare(x, expected)
        if problem:
            return f"replay {step}: {problem}"
    return None


def main():
    if WORLD < 2:
        print(f"FAIL setup: [rank {RANK}] needs at least 2 ranks, got WORLD_SIZE={WORLD}")
        return 1
    torch.cuda.set_device(DEVICE)
    dist.init_process_group(BACKEND, device_id=DEVICE, timeout=datetime.timedelta(seconds=300))
    if RANK == 0:
        library = (f"efccl.torch on {efccl.torch.library()['path']}" if BACKEND == "efccl"
                   else f"NCCL reported as {torch.cuda.nccl.version()}")
        print(f"torch {torch.__version__}, {WORLD} ranks, backend {BACKEND}, {library}", flush=True)

    all_reduce_checks()
    for n in SIZES:
        check(f"broadcast from every root x{n}", broadcast(n))
        check(f"reduce to every root x{n}", reduce(n))
        check(f"all_gather_into_tensor x{n}", all_gather_into_tensor(n))
        check(f"reduce_scatter_tensor x{n}", reduce_scatter_tensor(n))
        check(f"all_to_all_single even splits x{n}", all_to_all_even(n))
    check("all_to_all_single uneven splits", all_to_all_uneven)
    check("all_to_all_single skewed uneven splits (a hot pair)", all_to_all_skewed(False))
    check("all_to_all_single skewed uneven splits in a CUDA graph, replayed",
          all_to_all_skewed(True))
    check("all_reduce_coalesced (three tensors, mixed types)", all_reduce_coalesced_check)
    check("coalescing manager: all_reduce, all_gather_into_tensor, reduce_scatter_tensor",
          coalescing_manager_check)
    for n in SIZES:
        check(f"all_gather (list) x{n}", all_gather_list(n))
        check(f"reduce_scatter (list) x{n}", reduce_scatter_list(n))
        check(f"gather to every root x{n}", gather(n))
        check(f"scatter from every root x{n}", scatter(n))
    check("all_to_all (list) uneven blocks", all_to_all_list)
    check("recv from any source is an error", recv_from_any_source)
    check("send/recv ring", send_recv_ring)
    for n in SIZES:
        check(f"batch_isend_irecv ring, both directions x{n}", batch_isend_irecv_ring(n))
    check("barrier", barrier)
    check("new_group", new_group)
    check("split_group", split_group)
    check("all_reduce in a CUDA graph, replayed", all_reduce_in_cuda_graph)

    # Summary over all ranks (if the communicator still works).
    try:
        counts = torch.tensor([len(passed), len(failed)], device=DEVICE, dtype=torch.int64)
        dist.all_reduce(counts)
        total = f"{counts[0].item()} passed, {counts[1].item()} failed over {WORLD} ranks"
    except Exception as e:  # noqa: BLE001
        total = f"(no summary across ranks: {e})"
    if RANK == 0 or failed:
        print(f"SUMMARY rank {RANK}: {len(passed)} passed, {len(failed)} failed, "
              f"{len(skipped)} skipped; {total}", flush=True)
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
