"""Prints what CMake needs to build efccl.torch._backend against the torch of this Python.

One KEY=VALUE line each (lists joined with ';'); exit status 1 with the reason on stderr when
torch cannot be imported or cannot build a CUDA extension (python/torch_backend/CMakeLists.txt).
"""

import glob
import os
import sys
import sysconfig
import warnings


def main():
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - any import failure means: no torch here
        print(f"cannot import torch: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    version = torch.__version__.split("+")[0]
    parts = [int(p) if p.isdigit() else 0 for p in version.split(".")[:2]]
    if parts < [2, 1]:
        print(f"torch {torch.__version__} is older than 2.1", file=sys.stderr)
        return 1
    if torch.version.cuda is None:
        print(f"torch {torch.__version__} is built without CUDA", file=sys.stderr)
        return 1
    root = os.path.dirname(torch.__file__)
    includes = [os.path.join(root, "include"), os.path.join(root, "include", "torch", "csrc", "api", "include")]
    if not os.path.isfile(os.path.join(root, "include", "torch", "csrc", "distributed", "c10d", "Backend.hpp")):
        print(f"torch {torch.__version__} at {root} has no c10d headers", file=sys.stderr)
        return 1
    # pybind11 ABI: torch < 2.9 passed its own build's values to extensions; later versions
    # (pybind11 3) derive them from the compiler, as torch.utils.cpp_extension does.
    defines = []
    flags = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torch.utils import cpp_extension

            if hasattr(cpp_extension, "_get_pybind11_abi_build_flags"):
                flags = cpp_extension._get_pybind11_abi_build_flags()
    except Exception:  # noqa: BLE001 - cpp_extension needs setuptools; decide below
        flags = None
    if flags is None:
        flags = []
        if parts < [2, 9]:
            for name in ("COMPILER_TYPE", "STDLIB", "BUILD_ABI"):
                value = getattr(torch._C, f"_PYBIND11_{name}", None)
                if value is not None:
                    flags.append(f'-DPYBIND11_{name}="{value}"')
    for flag in flags:
        # '-DPYBIND11_COMPILER_TYPE=\"_gcc\"' -> 'PYBIND11_COMPILER_TYPE="_gcc"'
        defines.append(flag[2:].replace('\\"', '"'))
    site = os.path.dirname(root)
    # torch's NCCL wheel ships nccl.h (nvidia/nccl/include; other layouts under nvidia/).
    headers = sorted(glob.glob(os.path.join(site, "nvidia", "nccl", "include", "nccl.h"))
                     + glob.glob(os.path.join(site, "nvidia", "*", "include", "nccl.h")))
    print(f"TORCH_VERSION={torch.__version__}")
    print(f"TORCH_CUDA={torch.version.cuda}")
    print(f"TORCH_INCLUDE_DIRS={';'.join(includes)}")
    print(f"TORCH_LIBRARY_DIR={os.path.join(root, 'lib')}")
    print(f"TORCH_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}")
    print(f"TORCH_PYBIND11_DEFINES={';'.join(defines)}")
    print(f"PYTHON_INCLUDE_DIR={sysconfig.get_paths()['include']}")
    print(f"PYTHON_EXTENSION_SUFFIX={sysconfig.get_config_var('EXT_SUFFIX')}")
    print(f"TORCH_NCCL_INCLUDE_DIR={os.path.dirname(headers[0]) if headers else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
