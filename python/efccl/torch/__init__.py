"""efccl's torch.distributed backend: ``import efccl.torch`` registers ``"efccl"``.

    import torch.distributed as dist
    import efccl.torch

    dist.init_process_group("efccl", device_id=torch.device("cuda", local_rank))
    # or backend="cpu:gloo,cuda:efccl" for CPU tensors on gloo beside it

Every collective and point-to-point operation of torch.distributed runs on efccl (loaded
privately, so torch's own NCCL stays usable in the same process); see docs/torch.md.

* :func:`Options` — per-group options (``pg_options=`` of init_process_group / new_group):
  algorithm files (EF JSON or MSCCL XML) for that group's collectives, blocking waits.
* :func:`stats` — what efccl did for a group: calls and bytes per collective, bytes per peer,
  the program chosen for each collective and why.
* :func:`library` — which libefccl.so is in use.

libefccl.so is found through ``EFCCL_LIBRARY`` (a path), else the one this package was built
beside, else the dynamic loader's search (``LD_LIBRARY_PATH``).
"""

import json
import os

import torch
import torch.distributed as dist

__all__ = ["Options", "ProcessGroupEfccl", "library", "stats"]


def _library_candidates():
    env = os.environ.get("EFCCL_LIBRARY")
    if env:
        return [env], "EFCCL_LIBRARY"
    found = []
    try:
        from efccl.torch._build_paths import LIBRARY

        found.append(LIBRARY)
    except ImportError:
        pass
    here = os.path.dirname(os.path.abspath(__file__))
    # An installed layout: <prefix>/lib/libefccl.so beside <prefix>/python/efccl/torch.
    found.append(os.path.normpath(os.path.join(here, "..", "..", "..", "lib", "libefccl.so")))
    return found, "the build"


def _load():
    from efccl.torch import _backend

    candidates, origin = _library_candidates()
    existing = [c for c in candidates if os.path.isfile(c)]
    if origin == "EFCCL_LIBRARY" and not existing:
        raise ImportError(f"efccl.torch: EFCCL_LIBRARY={candidates[0]} does not exist")
    # Last resort: the loader's search path (a bare name: LD_LIBRARY_PATH, ldconfig).
    path = existing[0] if existing else "libefccl.so"
    try:
        info = _backend.load_library(path)
    except RuntimeError as e:
        raise ImportError(
            f"{e}\n(efccl.torch looked at: {', '.join(candidates)}; set EFCCL_LIBRARY)"
        ) from e
    return _backend, info


_backend, _library_info = _load()
ProcessGroupEfccl = _backend.ProcessGroupEfccl


def library():
    """Which libefccl.so efccl.torch uses: ``{"path", "version", "reports_selections"}``."""
    path, version, reports = _library_info
    return {"path": path, "version": version, "reports_selections": bool(reports)}


def Options(algorithm_files=None, blocking_wait=None, high_priority_stream=False):
    """Options of an efccl process group, for ``pg_options=``.

    algorithm_files: EF JSON / MSCCL XML files (a list, or a dict collective -> file) whose
        programs this group's collectives use where they apply, before the built-in ones
        (besides the process-wide EFCCL_ALGO_DIR / EFCCL_ALGO_FILES).
    blocking_wait: Work.wait() blocks the CPU until the work finished (default: the
        environment's EFCCL_TORCH_BLOCKING_WAIT=1, else False, as ProcessGroupNCCL).
    high_priority_stream: the group's internal CUDA stream has high priority.
    """
    files = []
    if algorithm_files:
        items = algorithm_files.values() if isinstance(algorithm_files, dict) else algorithm_files
        for f in items:
            f = os.fspath(f)
            if "," in f or ":" in f:
                raise ValueError(f"efccl algorithm file {f!r}: paths with ',' or ':' cannot be given to efccl")
            if not os.path.isfile(f):
                raise FileNotFoundError(f"efccl algorithm file {f!r} does not exist")
            files.append(os.path.abspath(f))
    if blocking_wait is None:
        blocking_wait = os.environ.get("EFCCL_TORCH_BLOCKING_WAIT", "0") == "1"
    return _backend.Options(
        algorithm_files=files, blocking_wait=bool(blocking_wait), high_priority_stream=bool(high_priority_stream)
    )


def _split_parent(global_ranks, group_name):
    """The default group's efccl backend when torch splits new groups from it (else None).

    torch makes the ranks outside a new group call perform_nocolor_split on the default
    group's backend when that group is bound to a device (init_process_group(device_id=...));
    the members then split the same communicator. A group created with
    use_local_synchronization=True (a hashed, non-numeric name) is created by its members only,
    so it gets a communicator of its own instead.
    """
    if not global_ranks or not dist.is_initialized() or not str(group_name).isdigit():
        return None
    default = dist.distributed_c10d._get_default_group()
    device = default.bound_device_id
    if device is None:
        return None
    try:
        parent = default._get_backend(device)
    except RuntimeError:
        return None
    return parent if isinstance(parent, ProcessGroupEfccl) else None


def _create_backend(dist_backend_opts, backend_options):
    if backend_options is None:
        options = Options()
    elif isinstance(backend_options, _backend.Options):
        options = backend_options.__copy__()
    else:
        raise TypeError(
            f"efccl: pg_options must be efccl.torch.Options(...), got {type(backend_options).__name__}"
        )
    timeout = dist_backend_opts.timeout  # a timedelta (seconds as a float in some versions)
    seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else float(timeout)
    options.timeout_ms = max(1, int(seconds * 1000))
    global_ranks = list(dist_backend_opts.global_ranks_in_group)
    group_name = dist_backend_opts.group_id
    return ProcessGroupEfccl(
        dist_backend_opts.store,
        dist_backend_opts.group_rank,
        dist_backend_opts.group_size,
        global_ranks,
        group_name,
        options,
        _split_parent(global_ranks, group_name),
    )


def _efccl_backend_of(group):
    if group is None:
        group = dist.distributed_c10d._get_default_group()
    if isinstance(group, ProcessGroupEfccl):
        return group
    try:
        backend = group._get_backend(torch.device("cuda"))
    except RuntimeError as e:
        raise ValueError(f"efccl.torch: the group has no CUDA backend: {e}") from e
    if not isinstance(backend, ProcessGroupEfccl):
        raise ValueError(
            f"efccl.torch: the group's CUDA backend is {backend.name()!r}, not efccl"
        )
    return backend


def stats(group=None):
    """What efccl did for ``group`` (default: the default group) on this rank.

    A dict: ``group``, ``rank``, ``size``, ``global_ranks``, ``device``, ``communicator`` ("init"
    or "split of ..."), ``pending_works``, ``failed`` (None or why), ``collectives`` (per
    collective: calls, bytes of this rank's payload, calls captured into CUDA graphs), ``peers``
    (bytes sent to / received from each group rank by send/recv and all_to_all), and
    ``programs``: each program efccl ran for the group's collectives, with its source ("builtin",
    "runtime" or the user file), the reason it was chosen and how often (empty when the loaded
    libefccl.so predates efcclSetSelectionCallback: see library()).
    """
    return json.loads(_efccl_backend_of(group)._stats_json())


if "EFCCL" not in dist.Backend._plugins:
    dist.Backend.register_backend("efccl", _create_backend, extended_api=True, devices=["cuda"])
