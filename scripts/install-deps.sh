#!/usr/bin/env bash
# Installs what efccl's build and tests need from Debian/Ubuntu packages. Idempotent: packages
# already present are not reinstalled, and apt is not touched when nothing is missing.
set -euo pipefail

# python3-venv, -setuptools, -wheel: `pip install --no-build-isolation .` in a venv made with
# --system-site-packages (README, "Python"); nothing else needs them.
packages=(build-essential cmake g++ python3 python3-dev pybind11-dev googletest libgtest-dev nlohmann-json3-dev
          clang libclang-rt-14-dev python3-venv python3-setuptools python3-wheel iproute2)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
