"""Builds efccl._efccl with the project's CMake (target _efccl only) and packages python/efccl.

Build products go to build-pip/ (never build/, which is the developers' CMake tree).
Environment: CMAKE_BUILD_PARALLEL_LEVEL (default 2), EFCCL_CMAKE_ARGS (extra -D options).
"""

import glob
import os
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = os.path.join(ROOT, "build-pip", "cmake")
        os.makedirs(build_dir, exist_ok=True)
        args = [
            f"-DCMAKE_BUILD_TYPE={'Debug' if self.debug else 'Release'}",
            f"-DPython3_EXECUTABLE={sys.executable}",
            "-DEFCCL_BUILD_TESTS=OFF",
            "-DEFCCL_ENABLE_CUDA=OFF",
        ]
        try:
            import pybind11

            args.append(f"-Dpybind11_DIR={pybind11.get_cmake_dir()}")
        except ImportError:
            pass  # pybind11's CMake config from the system (e.g. Debian's pybind11-dev)
        args += shlex.split(os.environ.get("EFCCL_CMAKE_ARGS", ""))
        subprocess.check_call(["cmake", ROOT, *args], cwd=build_dir)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2")
        subprocess.check_call(["cmake", "--build", ".", "--target", "_efccl", "-j", jobs],
                              cwd=build_dir)
        built = glob.glob(os.path.join(build_dir, "python", "efccl", "_efccl*"))
        built = [b for b in built if b.endswith((".so", ".pyd"))]
        if len(built) != 1:
            raise RuntimeError(f"expected one built _efccl module, found {built}")
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(built[0], target)
        shutil.copymode(built[0], target)


setup(
    package_dir={"": "python"},
    packages=find_packages("python"),
    ext_modules=[CMakeExtension("efccl._efccl")],
    cmdclass={"build_ext": CMakeBuild},
    options={"build": {"build_base": "build-pip"}, "egg_info": {"egg_base": "build-pip"}},
    zip_safe=False,
)
