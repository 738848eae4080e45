"""PyTorch's NCCL process group on efccl: exact results of every collective torch issues.

Run on a GPU machine (torch >= 2.4), one process per GPU:

    LD_PRELOAD=build/lib/libefccl.so torchrun --nproc_per_node 2 tests/torch/torch_collectives.py

(also under `build/bin/efccl-mprun -n 2 -- python3 ...`: it reads RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT). Inputs are small integers so that every result is exact in every
dtype. Prints `PASS name` / `FAIL name: why` per check and exits nonzero on any failure. Without
the preload it checks torch's own NCCL, which is how the script itself is validated.
"""
import os
import sys
import traceback

import torch
import torch.distributed as dist

RESULTS = []


def check(name):
    def wrap(fn):
        try:
            fn()
            RESULTS.append((name, None))
            print(f"[rank {RANK}] PASS {name}", flush=True)
        except Exception as e:  # noqa: BLE001 - every failure is reported, none stops the run
            detail = f"{type(e).__name__}: {e}"
            RESULTS.append((name, detail))
            print(f"[rank {RANK}] FAIL {name}: {detail}", flush=True)
            traceback.print_exc()
        return fn
    return wrap


def expect_equal(got, want, what):
    if not torch.equal(got.cpu(), want.cpu()):
        diff = (got.cpu().double() - want.cpu().double()).abs()
        raise AssertionError(f"{what}: max |diff| {diff.max().item()} at {int(diff.argmax())}; "
                             f"got {got.flatten()[:4].tolist()} want {want.flatten()[:4].tolist()}")


RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
LOCAL = int(os.environ.get("LOCAL_RANK", str(RANK)))
DEV = torch.device("cuda", LOCAL)
torch.cuda.set_device(DEV)
dist.init_process_group("nccl", device_id=DEV)
N = 4099  # odd: no program can assume a multiple of the rank count
FLOATS = [torch.float32, torch.bfloat16, torch.float16]


def ramp(dtype, scale=1, offset=0, n=N):
    return (torch.arange(n, device=DEV, dtype=torch.int64) % 13 * scale + offset).to(dtype)


for dtype in FLOATS + [torch.int64]:
    @check(f"all_reduce sum {dtype}")
    def _():
        t = ramp(dtype, offset=RANK)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        expect_equal(t, ramp(dtype, scale=WORLD, offset=WORLD * (WORLD - 1) // 2), "sum")

    @check(f"all_reduce max {dtype}")
    def _():
        t = ramp(dtype, offset=RANK)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        expect_equal(t, ramp(dtype, offset=WORLD - 1), "max")

    if dtype in FLOATS:
        @check(f"all_reduce avg {dtype}")
        def _():
            # Every rank holds WORLD * (i % 13) + 2 * RANK: the average is exact in every dtype.
            t = ramp(dtype, scale=WORLD, offset=2 * RANK)
            dist.all_reduce(t, op=dist.ReduceOp.AVG)
            expect_equal(t, ramp(dtype, scale=WORLD, offset=WORLD - 1), "avg")


@check("broadcast")
def _():
    for root in range(WORLD):
        t = ramp(torch.float32, offset=RANK * 100)
        dist.broadcast(t, src=root)
        expect_equal(t, ramp(torch.float32, offset=root * 100), f"root {root}")


@check("reduce")
def _():
    for root in range(WORLD):
        t = ramp(torch.int64, offset=RANK)
        dist.reduce(t, dst=root, op=dist.ReduceOp.SUM)
        if RANK == root:
            expect_equal(t, ramp(torch.int64, scale=WORLD, offset=WORLD * (WORLD - 1) // 2),
                         f"root {root}")


@check("all_gather_into_tensor")
def _():
    mine = ramp(torch.bfloat16, offset=RANK)
    out = torch.empty(WORLD * N, dtype=torch.bfloat16, device=DEV)
    dist.all_gather_into_tensor(out, mine)
    expect_equal(out, torch.cat([ramp(torch.bfloat16, offset=r) for r in range(WORLD)]), "gather")


@check("reduce_scatter_tensor")
def _():
    inp = torch.cat([ramp(torch.float32, offset=r + RANK) for r in range(WORLD)])
    out = torch.empty(N, dtype=torch.float32, device=DEV)
    dist.reduce_scatter_tensor(out, inp, op=dist.ReduceOp.SUM)
    want = ramp(torch.float32, scale=WORLD, offset=WORLD * RANK + WORLD * (WORLD - 1) // 2)
    expect_equal(out, want, "block")


@check("all_to_all_single even")
def _():
    inp = torch.arange(WORLD * N, device=DEV, dtype=torch.float32) + RANK * 1e6
    out = torch.empty_like(inp)
    dist.all_to_all_single(out, inp)
    want = torch.cat([torch.arange(RANK * N, (RANK + 1) * N, device=DEV, dtype=torch.float32)
                      + r * 1e6 for r in range(WORLD)])
    expect_equal(out, want, "even split")


@check("all_to_all_single uneven")
def _():
    # Rank s sends (s + d + 1) * 7 elements to rank d.
    send = [(RANK + d + 1) * 7 for d in range(WORLD)]
    recv = [(s + RANK + 1) * 7 for s in range(WORLD)]
    inp = torch.cat([torch.full((send[d],), float(RANK * 10 + d), device=DEV) for d in range(WORLD)])
    out = torch.empty(sum(recv), device=DEV)
    dist.all_to_all_single(out, inp, output_split_sizes=recv, input_split_sizes=send)
    want = torch.cat([torch.full((recv[s],), float(s * 10 + RANK), device=DEV) for s in range(WORLD)])
    expect_equal(out, want, "uneven split")


@check("send/recv")
def _():
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    t = ramp(torch.float16, offset=RANK)
    r = torch.empty_like(t)
    if RANK % 2 == 0:
        dist.send(t, nxt)
        dist.recv(r, prv)
    else:
        dist.recv(r, prv)
        dist.send(t, nxt)
    expect_equal(r, ramp(torch.float16, offset=prv), "from previous")


@check("batch_isend_irecv")
def _():
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    t = ramp(torch.float32, scale=3, offset=RANK, n=1 << 20)
    r = torch.empty_like(t)
    ops = [dist.P2POp(dist.isend, t, nxt), dist.P2POp(dist.irecv, r, prv)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    expect_equal(r, ramp(torch.float32, scale=3, offset=prv, n=1 << 20), "ring exchange")


@check("barrier")
def _():
    dist.barrier()
    torch.cuda.synchronize()


@check("new_group")
def _():
    members = list(range(0, WORLD, 2)) if WORLD > 2 else [0, 1][:WORLD]
    g = dist.new_group(ranks=members)
    if RANK in members:
        t = torch.full((1000,), float(RANK + 1), device=DEV)
        dist.all_reduce(t, group=g)
        expect_equal(t, torch.full((1000,), float(sum(m + 1 for m in members)), device=DEV), "sum")
    dist.destroy_process_group(g)


@check("split_group")
def _():
    if not hasattr(dist, "split_group"):
        raise AssertionError("torch.distributed.split_group is not available in this torch")
    halves = [list(range(WORLD))[i::2] for i in range(min(2, WORLD))]
    g = dist.split_group(split_ranks=halves)
    mine = next(h for h in halves if RANK in h)
    t = torch.full((777,), float(RANK), device=DEV, dtype=torch.float32)
    dist.all_reduce(t, group=g)
    expect_equal(t, torch.full((777,), float(sum(mine)), device=DEV), "sum in half")
    dist.destroy_process_group(g)


@check("all_reduce in a CUDA graph")
def _():
    t = torch.zeros(65536, device=DEV)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up outside capture (as torch's docs require for NCCL)
        dist.all_reduce(t)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        dist.all_reduce(t)
    for replay in range(4):
        t.copy_(torch.full_like(t, float(RANK + replay)))
        g.replay()
        torch.cuda.synchronize()
        want = float(WORLD * (WORLD - 1) // 2 + WORLD * replay)
        expect_equal(t, torch.full_like(t, want), f"replay {replay}")


torch.cuda.synchronize()
failed = [name for name, why in RESULTS if why is not None]
print(f"[rank {RANK}] SUMMARY {len(RESULTS) - len(failed)} passed, {len(failed)} failed"
      + (": " + ", ".join(failed) if failed else ""), flush=True)
dist.destroy_process_group()
sys.exit(1 if failed else 0)
