#!/usr/bin/env python3
"""efccl's torch.distributed backend: what torch_collectives.py (exact results of every
operation) does not cover.

    PYTHONPATH=build-torch/python torchrun --nproc_per_node 2 tests/torch/efccl_backend_checks.py
    PYTHONPATH=build-torch/python torchrun --nproc_per_node 2 tests/torch/efccl_backend_checks.py --part mixed
    PYTHONPATH=build-torch/python torchrun --nproc_per_node 2 tests/torch/efccl_backend_checks.py \
        --checks graph_async,new_group_is_split

Parts (`--part`; each is one launch of run_gpu_checks.sh, so that a crash hides nothing else):

* `core` (init_process_group("efccl", device_id=...)): works (stream order, tensors kept alive,
  wait with a timeout, is_completed, get_future and its chains), a CUDA graph of an asynchronous
  all_reduce, efccl.torch.stats of the default group, DDP (20 steps) and FSDP2 (fully_shard, 10
  steps) against a single-process reference.
* `groups` (the same init): new_group and split_group through ncclCommSplit (the default
  group's split count), efccl.torch.stats of a new group, an algorithm file chosen for one group
  from Python, abort and shutdown of a group.
* `timeouts` (the same init): a group creation whose member never comes (init timeout, naming
  it), then a collective a rank never calls (an error within the group's timeout, naming it).
* `bound` (the default): core, groups and timeouts in one process, in that order.
* `mixed` (init "cpu:gloo,cuda:efccl" without device_id): CPU tensors on gloo beside efccl, a
  gloo group, a new group with a communicator of its own, efccl.torch.stats there.
* `nccl` (the same init): one-rank groups of torch's own NCCL beside the efccl default group.
* `nccl-alone` (init "gloo"; efccl is not even imported): the same one-rank NCCL groups without
  efccl: the control for `nccl` (whether torch's NCCL itself works on this machine, e.g. under
  MPS).

`--checks NAME,...` runs the named checks instead of a part's (in the order given; names below,
in CHECKS; all of one init). Same output as torch_collectives.py: PASS/FAIL/SKIP lines, a
SUMMARY line on rank 0, exit status nonzero when a check failed on this rank.
"""

import copy
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

PART = sys.argv[sys.argv.index("--part") + 1] if "--part" in sys.argv else "bound"
ONLY = sys.argv[sys.argv.index("--checks") + 1].split(",") if "--checks" in sys.argv else None

if PART != "nccl-alone":
    import efccl.torch  # registers "efccl" (not in the control, which must not load efccl)
from torch_collectives import (  # the same helpers, ranks and device
    DEVICE,
    DEVICE_INDEX,
    N,
    RANK,
    WORLD,
    Skip,
    check,
    compare,
    expected_reduction,
    failed,
    passed,
    ramp,
    skipped,
    value,
)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def note(text):
    if RANK == 0:
        print(f"  ({text})", flush=True)


def first_line(e):
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


# ---- works ------------------------------------------------------------------------------------

def work_semantics():
    t = value(RANK, torch.float32, N)
    work = dist.all_reduce(t, async_op=True)
    if not work.wait():
        return "wait() returned False"
    problem = compare(t, expected_reduction(dist.ReduceOp.SUM, torch.float32, N))
    if problem:
        return f"after wait(): {problem}"
    if len(work.result()) != 1 or work.result()[0].data_ptr() != t.data_ptr():
        return "result() is not the tensor reduced"
    torch.cuda.synchronize(DEVICE)
    deadline = time.monotonic() + 10
    while not work.is_completed():
        if time.monotonic() > deadline:
            return "is_completed() still False 10 s after the stream finished"
        time.sleep(0.01)
    # A blocking wait with a timeout of its own.
    t2 = value(RANK, torch.int64, N)
    if not dist.all_reduce(t2, async_op=True).wait(timeout=datetime.timedelta(seconds=60)):
        return "wait(timeout) returned False"
    return compare(t2, expected_reduction(dist.ReduceOp.SUM, torch.int64, N))


def stream_order():
    # The producer runs late on a side stream; the collective, issued from that stream, must
    # see its values (it runs on the group's own stream, ordered after the caller's).
    if not hasattr(torch.cuda, "_sleep"):
        raise Skip("torch.cuda._sleep is not available")
    side = torch.cuda.Stream(device=DEVICE)
    x = torch.zeros(N, device=DEVICE)
    side.wait_stream(torch.cuda.current_stream(DEVICE))
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # some tens of ms on the GPU
        x.fill_(RANK + 1)
        work = dist.all_reduce(x, async_op=True)
        work.wait()  # the side stream waits for the collective
        y = x * 1
    torch.cuda.synchronize(DEVICE)
    return compare(y, torch.full((N,), float(WORLD * (WORLD + 1) // 2), device=DEVICE))


def tensors_kept_alive():
    # The input is dropped while a large collective may still run on the group's stream; memory
    # allocated right after must not be that tensor's (record_stream / held references).
    n = 16 << 20  # 64 MiB of float32
    x = torch.ones(n, device=DEVICE)
    work = dist.all_reduce(x, async_op=True)
    del x
    y = torch.full((n,), -7.0, device=DEVICE)
    work.wait()
    torch.cuda.synchronize(DEVICE)
    if bool((y != -7.0).any()):
        return "a tensor allocated after dropping the input was overwritten by the collective"
    return compare(work.result()[0], torch.full((n,), float(WORLD), device=DEVICE))


def futures():
    t = value(RANK, torch.float32, N)
    fut = dist.all_reduce(t, async_op=True).get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2)
    got = fut.wait()
    if not isinstance(got, list) or len(got) != 1:
        return f"the future's value is {type(got).__name__} of {len(got) if isinstance(got, list) else '?'}, expected a list of one tensor"
    expected = expected_reduction(dist.ReduceOp.SUM, torch.float32, N)
    return compare(got[0], expected) or compare(doubled.wait(), expected * 2)


def graph_async():
    x = torch.zeros(N, device=DEVICE)
    side = torch.cuda.Stream(device=DEVICE)
    side.wait_stream(torch.cuda.current_stream(DEVICE))
    with torch.cuda.stream(side):
        for _ in range(3):
            dist.all_reduce(x, async_op=True).wait()
    torch.cuda.current_stream(DEVICE).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        work = dist.all_reduce(x, async_op=True)
        work.wait()  # joins the group's stream back into the capture
        x.mul_(3)
    for step in range(3):
        x.copy_(ramp(N, torch.float32, scale=RANK + 1, offset=step))
        graph.replay()
        torch.cuda.synchronize(DEVICE)
        expected = 3 * sum(ramp(N, torch.float32, scale=r + 1, offset=step) for r in range(WORLD))
        problem = compare(x, expected)
        if problem:
            return f"replay {step}: {problem}"
    return None


# ---- groups -----------------------------------------------------------------------------------

def group_sum(group, members):
    t = torch.full((N,), float(RANK + 1), device=DEVICE)
    dist.all_reduce(t, group=group)
    return compare(t, torch.full((N,), float(sum(r + 1 for r in members)), device=DEVICE))


def default_backend():
    """The default group's efccl backend (ProcessGroupEfccl)."""
    backend = dist.distributed_c10d._get_default_group()._get_backend(DEVICE)
    if not isinstance(backend, efccl.torch.ProcessGroupEfccl):
        raise AssertionError(f"the default group's CUDA backend is {type(backend).__name__}")
    return backend


def new_group_is_split():
    # Under a default group bound to a device, torch's new_group makes every rank take part
    # and efccl splits the default communicator (the ranks outside call perform_nocolor_split):
    # the default group's split count grows by one per new group on every rank.
    halves = [list(range(0, WORLD // 2)), list(range(WORLD // 2, WORLD))]
    before = default_backend().comm_split_count()
    groups = [dist.new_group(h) for h in halves]
    mine = next(i for i, h in enumerate(halves) if RANK in h)
    problem = group_sum(groups[mine], halves[mine])
    splits = default_backend().comm_split_count() - before
    for g in groups:
        dist.destroy_process_group(g)
    if problem:
        return problem
    if splits != len(halves):
        return f"{len(halves)} new groups made {splits} splits of the default communicator"
    return None


def split_group_is_split():
    if not hasattr(dist, "split_group"):
        raise Skip(f"torch {torch.__version__} has no split_group")
    parts = [[r for r in range(WORLD) if r % 2 == p] for p in (0, 1)]
    before = default_backend().comm_split_count()
    group = dist.split_group(split_ranks=parts)
    members = next(p for p in parts if RANK in p)
    problem = group_sum(group, members)
    splits = default_backend().comm_split_count() - before
    dist.destroy_process_group(group)
    if problem:
        return problem
    if splits != 1:
        return f"split_group made {splits} splits of the default communicator, expected 1"
    return None


def new_group_stats():
    # efccl.torch.stats of a group new_group split from the default one.
    group = dist.new_group(list(range(WORLD)))
    problem = group_sum(group, list(range(WORLD)))
    s = efccl.torch.stats(group)
    dist.destroy_process_group(group)
    if problem:
        return problem
    if s["rank"] != RANK or s["size"] != WORLD or s["device"] != str(DEVICE):
        return f"identity: rank {s['rank']} size {s['size']} device {s['device']}"
    if s["global_ranks"] != list(range(WORLD)):
        return f"global ranks {s['global_ranks']}"
    if not s["communicator"].startswith("split"):
        return f"the new group's communicator came from {s['communicator']!r}, not ncclCommSplit"
    ar = s["collectives"].get("allreduce")
    if not ar or ar["calls"] != 1 or ar["bytes"] != N * 4:
        return f"allreduce counters of the new group: {ar}"
    if s["failed"] is not None:
        return f"the new group reports a failure: {s['failed']}"
    return None


def algorithm_file_per_group():
    files = {2: os.path.join(REPO, "tests", "torch", "programs", "ring_allreduce_2r.json"),
             4: os.path.join(REPO, "examples", "ef", "ring_allreduce_4r_2ch.json")}
    if WORLD not in files:
        raise Skip(f"no all_reduce program file for {WORLD} ranks in the repository")
    path = files[WORLD]
    group = dist.new_group(list(range(WORLD)), pg_options=efccl.torch.Options(algorithm_files=[path]))
    count = 1024  # a multiple of the programs' chunks per loop
    t = value(RANK, torch.float32, count)
    dist.all_reduce(t, group=group)
    problem = compare(t, expected_reduction(dist.ReduceOp.SUM, torch.float32, count))
    programs = efccl.torch.stats(group)["programs"]
    world_programs = efccl.torch.stats()["programs"]
    dist.destroy_process_group(group)
    if problem:
        return problem
    if not efccl.torch.library()["reports_selections"]:
        return (f"{efccl.torch.library()['path']} does not report program selections "
                "(efcclSetSelectionCallback): rebuild libefccl.so from this branch")
    names = {os.path.abspath(path), os.path.realpath(path)}
    used = [p for p in programs if p["collective"] == "allreduce" and (
        p["source"] in names or os.path.realpath(p["source"]) in names)]
    if not used or used[0]["skipped"]:
        return f"the group's all_reduce did not run {path}: programs {programs}"
    if any(p["source"] in names for p in world_programs):
        return "the default group used the other group's program file"
    note(f"group program: {used[0]['program']} from {path}: {used[0]['reason']}")
    return None


def stats_of_the_world():
    s = efccl.torch.stats()
    if s["rank"] != RANK or s["size"] != WORLD or s["device"] != str(DEVICE):
        return f"identity: rank {s['rank']} size {s['size']} device {s['device']}"
    ar = s["collectives"].get("allreduce")
    if not ar or ar["calls"] < 5 or ar["bytes"] <= 0:
        return f"allreduce counters: {ar}"
    if s["failed"] is not None:
        return f"the world group reports a failure: {s['failed']}"
    if efccl.torch.library()["reports_selections"] and not any(
            p["collective"] == "allreduce" for p in s["programs"]):
        return f"no allreduce program recorded: {s['programs']}"
    if RANK == 0:
        ar_programs = sorted({p["program"] for p in s["programs"] if p["collective"] == "allreduce"})
        note(f"world: {ar['calls']} all_reduce calls, {ar['bytes']} bytes; programs {ar_programs}")
    return None


def abort_and_shutdown():
    results = []
    for how in ("abort", "shutdown"):
        group = dist.new_group(list(range(WORLD)))
        t = torch.ones(8, device=DEVICE)
        dist.all_reduce(t, group=group)
        torch.cuda.synchronize(DEVICE)
        dist.barrier(device_ids=[DEVICE_INDEX])  # every rank is done with the group
        backend = group._get_backend(torch.device("cuda"))
        getattr(backend, how)()
        try:
            dist.all_reduce(t, group=group)
        except Exception as e:  # noqa: BLE001
            results.append(f"{how}: {first_line(e)[:120]}")
        else:
            return f"all_reduce on a group after {how}() did not raise"
        dist.destroy_process_group(group)
    note("; ".join(results))
    return None


# ---- training against a single-process reference ----------------------------------------------

def exact_fp32():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def ddp_training():
    from torch.nn.parallel import DistributedDataParallel as DDP

    exact_fp32()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4)).to(DEVICE)
    reference = copy.deepcopy(model)
    ddp = DDP(model, device_ids=[DEVICE_INDEX])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    opt_ref = torch.optim.SGD(reference.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1234)  # the same batches on every rank
    shard = 8
    worst = 0.0
    for step in range(20):
        x = torch.randn(WORLD * shard, 32, generator=gen).to(DEVICE)
        y = torch.randn(WORLD * shard, 4, generator=gen).to(DEVICE)
        mine = slice(RANK * shard, (RANK + 1) * shard)
        opt.zero_grad()
        loss = F.mse_loss(ddp(x[mine]), y[mine])
        loss.backward()
        opt.step()
        opt_ref.zero_grad()
        ref = F.mse_loss(reference(x), y)
        ref.backward()
        opt_ref.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)  # the full batch's loss
        diff = abs(mean.item() - ref.item())
        worst = max(worst, diff / max(abs(ref.item()), 1e-12))
        if not torch.isclose(mean, ref.detach(), rtol=1e-4, atol=1e-6):
            return f"step {step}: DDP loss {mean.item():.9g}, reference {ref.item():.9g}"
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        if not torch.allclose(p, q, rtol=1e-4, atol=1e-6):
            return f"parameter {name} differs by {(p - q).abs().max().item():.3g} after 20 steps"
    note(f"DDP 20 steps: largest relative loss difference {worst:.2e}")
    return None


def fsdp2_training():
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import fully_shard
        except ImportError as e:
            raise Skip(f"torch {torch.__version__} has no fully_shard ({e})") from e
    exact_fp32()
    torch.manual_seed(0)
    block = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, dropout=0.0,
                                       batch_first=True).to(DEVICE)
    reference = copy.deepcopy(block)
    model = copy.deepcopy(block)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.02)
    opt_ref = torch.optim.SGD(reference.parameters(), lr=0.02)
    gen = torch.Generator().manual_seed(99)
    shard = 4
    worst = 0.0
    for step in range(10):
        x = torch.randn(WORLD * shard, 8, 64, generator=gen).to(DEVICE)
        y = torch.randn(WORLD * shard, 8, 64, generator=gen).to(DEVICE)
        mine = slice(RANK * shard, (RANK + 1) * shard)
        loss = F.mse_loss(model(x[mine]), y[mine])
        loss.backward()
        opt.step()
        opt.zero_grad()
        ref = F.mse_loss(reference(x), y)
        ref.backward()
        opt_ref.step()
        opt_ref.zero_grad()
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        worst = max(worst, abs(mean.item() - ref.item()) / max(abs(ref.item()), 1e-12))
        if not torch.isclose(mean, ref.detach(), rtol=1e-4, atol=1e-6):
            return f"step {step}: FSDP2 loss {mean.item():.9g}, reference {ref.item():.9g}"
    note(f"FSDP2 10 steps: largest relative loss difference {worst:.2e}")
    return None


# ---- a rank that never comes -------------------------------------------------------------------

def init_timeout_names_the_missing_rank():
    # A group created by its members only (use_local_synchronization): rank 0 creates it, the
    # last rank never does; the communicator's creation must fail at the group's timeout,
    # naming that rank.
    missing = WORLD - 1
    timeout = 5
    if RANK != 0:
        return None
    start = time.monotonic()
    try:
        dist.new_group([0, missing], timeout=datetime.timedelta(seconds=timeout),
                       use_local_synchronization=True)
    except Exception as e:  # noqa: BLE001
        elapsed = time.monotonic() - start
        message = str(e)
        summary = first_line(e)
    else:
        return "new_group returned though a member never came"
    if f"rank 1 (global rank {missing})" not in message and f"rank {missing}" not in message:
        return f"the error does not name rank {missing}: {message[:400]}"
    if not timeout - 0.5 <= elapsed <= timeout + 10:
        return f"the error came after {elapsed:.1f} s for a timeout of {timeout} s"
    note(f"after {elapsed:.1f} s: {summary[:300]}")
    return None


def missing_rank_collective():
    # Every rank warms the group up (communicator and program exist); then the last rank does
    # not call the next all_reduce. The others must get an error within the group's timeout
    # naming it; later calls on the group fail at once.
    timeout = 10
    missing = WORLD - 1
    group = dist.new_group(list(range(WORLD)), timeout=datetime.timedelta(seconds=timeout))
    t = torch.ones(N, device=DEVICE)
    dist.all_reduce(t, group=group)
    torch.cuda.synchronize(DEVICE)
    dist.barrier(device_ids=[DEVICE_INDEX])
    problem = None
    if RANK != missing:
        start = time.monotonic()
        work = dist.all_reduce(t, group=group, async_op=True)
        while not work.is_completed():
            if time.monotonic() - start > timeout + 60:
                problem = f"no error {timeout + 60} s after the start (timeout {timeout} s)"
                break
            time.sleep(0.02)
        elapsed = time.monotonic() - start
        if problem is None:
            try:
                work.wait()
            except Exception as e:  # noqa: BLE001
                message = str(e)
                if f"Missing: rank {missing}" not in message:
                    problem = f"the error does not name rank {missing} as missing: {message[:600]}"
                elif elapsed > timeout + 8:
                    problem = f"the error came after {elapsed:.1f} s for a timeout of {timeout} s"
                elif elapsed < timeout - 1:
                    problem = f"the error came early, after {elapsed:.1f} s: {message[:300]}"
                else:
                    note(f"after {elapsed:.1f} s: {message[:500]}")
            else:
                problem = "the work finished without an error though a rank never called"
        if problem is None:
            try:
                dist.all_reduce(t, group=group)
            except Exception:  # noqa: BLE001 - expected: the group failed
                pass
            else:
                problem = "a call on the failed group did not raise"
    dist.barrier(device_ids=[DEVICE_INDEX])
    dist.destroy_process_group(group)
    return problem


# ---- beside gloo and torch's NCCL (a default group not bound to a device) -----------------------

def both_devices():
    cpu = torch.full((5,), float(RANK + 1))
    dist.all_reduce(cpu)
    gpu = value(RANK, torch.float32, N)
    dist.all_reduce(gpu)
    return (compare(cpu, torch.full((5,), float(WORLD * (WORLD + 1) // 2)))
            or compare(gpu, expected_reduction(dist.ReduceOp.SUM, torch.float32, N)))


def gloo_group_beside():
    g = dist.new_group(list(range(WORLD)), backend="gloo")
    t = torch.full((3,), float(RANK))
    dist.all_reduce(t, group=g)
    dist.destroy_process_group(g)
    return compare(t, torch.full((3,), float(WORLD * (WORLD - 1) // 2)))


def fresh_group_not_split():
    # Unbound: torch does not split (no perform_nocolor_split on the other ranks), so the
    # group's communicator is created through the store; the default one was not split.
    g = dist.new_group(list(range(WORLD)))
    problem = group_sum(g, list(range(WORLD)))
    backend = g._get_backend(torch.device("cuda"))
    initialized = backend._is_initialized()
    splits = default_backend().comm_split_count()
    dist.destroy_process_group(g)
    if problem:
        return problem
    if not initialized:
        return "the group has no communicator after its all_reduce"
    return None if splits == 0 else f"the default communicator was split {splits} times"


def mixed_stats():
    # efccl.torch.stats of the unbound default group (its all_reduce of both_devices, if run)
    # and of a new group: a communicator of its own ("init").
    before = efccl.torch.stats()["collectives"].get("allreduce", {"calls": 0})["calls"]
    g = dist.new_group(list(range(WORLD)))
    problem = group_sum(g, list(range(WORLD)))
    t = torch.ones(4, device=DEVICE)
    dist.all_reduce(t)
    s = efccl.torch.stats(g)
    after = efccl.torch.stats()["collectives"]["allreduce"]["calls"]
    dist.destroy_process_group(g)
    if problem:
        return problem
    if s["communicator"] != "init":
        return f"communicator origin {s['communicator']!r}, expected 'init'"
    if s["collectives"].get("allreduce", {}).get("calls") != 1:
        return f"the new group's allreduce counters: {s['collectives']}"
    if after != before + 1:
        return f"the default group's all_reduce count went from {before} to {after}, expected +1"
    return None


def nccl_one_rank_groups(efccl_too):
    # torch's NCCL cannot put two ranks on one GPU, so each rank gets a one-rank NCCL group;
    # its calls go to torch's libnccl.so.2 while the default group (efccl, or gloo in the
    # control) serves the others, in turn.
    if not dist.is_nccl_available():
        raise Skip("this torch has no NCCL")

    def default_all_reduce():
        if efccl_too:
            b = value(RANK, torch.float32, N)
            dist.all_reduce(b)  # efccl
            return compare(b, expected_reduction(dist.ReduceOp.SUM, torch.float32, N))
        b = torch.full((5,), float(RANK + 1))
        dist.all_reduce(b)  # gloo
        return compare(b, torch.full((5,), float(WORLD * (WORLD + 1) // 2)))

    # The default group's communicator first (efccl's exists before torch's NCCL starts).
    problem = default_all_reduce()
    if problem:
        return f"the default group's first all_reduce: {problem}"
    groups = [dist.new_group([r], backend="nccl") for r in range(WORLD)]
    mine = groups[RANK]
    if dist.get_backend(mine) != "nccl":
        return f"the one-rank group's backend is {dist.get_backend(mine)}"
    for round_ in range(3):
        a = torch.full((N,), float(RANK + round_), device=DEVICE)
        dist.all_reduce(a, group=mine)  # torch's NCCL
        problem = (compare(a, torch.full((N,), float(RANK + round_), device=DEVICE))
                   or default_all_reduce())
        if problem:
            return f"round {round_}: {problem}"
    for g in groups:
        dist.destroy_process_group(g)
    return None


def nccl_beside_efccl():
    return nccl_one_rank_groups(efccl_too=True)


def nccl_alone():
    return nccl_one_rank_groups(efccl_too=False)


def efccl_counted_beside_nccl():
    # Run after nccl_beside_efccl: its four all_reduce calls of the default group were efccl's.
    calls = efccl.torch.stats()["collectives"].get("allreduce", {"calls": 0})["calls"]
    return None if calls >= 4 else f"efccl counted {calls} all_reduce calls on the default group"


# ---- what runs ----------------------------------------------------------------------------------

# name: (title, function, init). Inits: "bound" init_process_group("efccl", device_id=...),
# "unbound" init_process_group("cpu:gloo,cuda:efccl"), "gloo" init_process_group("gloo").
CHECKS = {
    "work_semantics": ("work: wait, result, is_completed, wait(timeout)", work_semantics, "bound"),
    "stream_order": ("work: ordered after the caller's stream", stream_order, "bound"),
    "tensors_kept_alive": ("work: a dropped input's memory is not reused while the collective runs",
                           tensors_kept_alive, "bound"),
    "futures": ("work: get_future value and a then() chain", futures, "bound"),
    "graph_async": ("asynchronous all_reduce captured in a CUDA graph, replayed", graph_async, "bound"),
    "stats_of_the_world": ("efccl.torch.stats of the default group", stats_of_the_world, "bound"),
    "ddp_training": ("DDP, 20 steps, losses as a single process", ddp_training, "bound"),
    "fsdp2_training": ("FSDP2 fully_shard, 10 steps, losses as a single process", fsdp2_training,
                       "bound"),
    "new_group_is_split": ("new_group through ncclCommSplit", new_group_is_split, "bound"),
    "split_group_is_split": ("split_group through ncclCommSplit", split_group_is_split, "bound"),
    "new_group_stats": ("efccl.torch.stats of a new group", new_group_stats, "bound"),
    "algorithm_file_per_group": ("an algorithm file for one group (efccl.torch.Options)",
                                 algorithm_file_per_group, "bound"),
    "abort_and_shutdown": ("abort() and shutdown() of a group", abort_and_shutdown, "bound"),
    "init_timeout": ("group creation with a member that never comes: error at the timeout, naming it",
                     init_timeout_names_the_missing_rank, "bound"),
    "missing_rank": ("a rank that never calls: error within the timeout, naming it",
                     missing_rank_collective, "bound"),
    "both_devices": ("cpu:gloo,cuda:efccl: CPU tensors on gloo, CUDA tensors on efccl", both_devices,
                     "unbound"),
    "gloo_group_beside": ("a gloo group beside the efccl default group", gloo_group_beside, "unbound"),
    "fresh_group_not_split": ("new_group under an unbound default group: a communicator of its own",
                              fresh_group_not_split, "unbound"),
    "mixed_stats": ("efccl.torch.stats under an unbound default group", mixed_stats, "unbound"),
    "nccl_beside_efccl": ("torch's NCCL (one-rank groups) beside efccl in one process",
                          nccl_beside_efccl, "unbound"),
    "efccl_counted_beside_nccl": ("efccl counted the default group's calls beside torch's NCCL",
                                  efccl_counted_beside_nccl, "unbound"),
    "nccl_alone": ("control: torch's NCCL (one-rank groups) beside gloo, efccl not loaded",
                   nccl_alone, "gloo"),
}

PARTS = {
    "core": ["work_semantics", "stream_order", "tensors_kept_alive", "futures", "graph_async",
             "stats_of_the_world", "ddp_training", "fsdp2_training"],
    "groups": ["new_group_is_split", "split_group_is_split", "new_group_stats",
               "algorithm_file_per_group", "abort_and_shutdown"],
    "timeouts": ["init_timeout", "missing_rank"],
    "mixed": ["both_devices", "gloo_group_beside", "fresh_group_not_split", "mixed_stats"],
    "nccl": ["nccl_beside_efccl", "efccl_counted_beside_nccl"],
    "nccl-alone": ["nccl_alone"],
}
PARTS["bound"] = PARTS["core"] + PARTS["groups"] + PARTS["timeouts"]


def init(kind):
    timeout = datetime.timedelta(seconds=300)
    if kind == "bound":
        dist.init_process_group("efccl", device_id=DEVICE, timeout=timeout)
    elif kind == "unbound":
        # Not bound to a device: torch would otherwise hand the efccl group to NCCL as its
        # split parent. CPU tensors go to gloo, CUDA tensors to efccl.
        dist.init_process_group("cpu:gloo,cuda:efccl", timeout=timeout)
    else:
        dist.init_process_group("gloo", timeout=timeout)
    if RANK == 0:
        if kind == "gloo":
            library = "efccl not loaded"
        else:
            lib = efccl.torch.library()
            library = f"efccl.torch on {lib['path']} (NCCL ABI {lib['version']})"
        nccl = torch.cuda.nccl.version() if dist.is_nccl_available() else "none"
        print(f"torch {torch.__version__}, {WORLD} ranks, init {kind}, {library}, "
              f"torch's own NCCL {nccl}", flush=True)


def main():
    if WORLD < 2:
        print(f"FAIL setup: [rank {RANK}] needs at least 2 ranks, got WORLD_SIZE={WORLD}")
        return 1
    if PART not in PARTS:
        print(f"FAIL setup: [rank {RANK}] no part {PART!r} (parts: {', '.join(PARTS)})")
        return 1
    names = ONLY if ONLY is not None else PARTS[PART]
    unknown = [n for n in names if n not in CHECKS]
    kinds = sorted({CHECKS[n][2] for n in names if n in CHECKS})
    if unknown or len(kinds) != 1 or (kinds[0] == "gloo") != (PART == "nccl-alone"):
        print(f"FAIL setup: [rank {RANK}] checks {names}: unknown {unknown}, inits {kinds} "
              "(one init per launch; the gloo-only control runs as --part nccl-alone)")
        return 1
    torch.cuda.set_device(DEVICE)
    init(kinds[0])
    for name in names:
        title, fn, _ = CHECKS[name]
        if name == "missing_rank":
            dist.barrier(device_ids=[DEVICE_INDEX])  # after init_timeout, which rank 0 runs alone
        check(title, fn)
    try:
        on = "cpu" if kinds[0] == "gloo" else DEVICE
        counts = torch.tensor([len(passed), len(failed)], device=on, dtype=torch.int64)
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
