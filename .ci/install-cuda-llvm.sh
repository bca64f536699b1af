#!/usr/bin/env bash
# Puts an LLVM 23.1 with the NVPTX target where burn's `cuda` backend looks
# for it, so that `cargo build --features cuda` builds and links offline.
#
# burn 0.22.1's cuda backend (cubecl-cuda -> cubecl-llvm) has a build
# dependency, `tracel-llvm-bundler`, that downloads a prebuilt LLVM unless
# `$XDG_DATA_HOME/tracel/tracel-llvm-<version>/` (default XDG_DATA_HOME:
# ~/.local/share) already holds one with the marker `.tracel-llvm-installed`.
# This script fills that folder from two PyPI wheels: `mlc-llvm-static`
# (a relocatable static LLVM 23.1.1 SDK) and `mlc-llvm-static-extra-targets`
# (adds NVPTX). About 100 MB to download, 400 MB installed. No CUDA toolkit
# is needed to build; at run time a GPU machine needs the driver's libcuda
# and `libdevice.10.bc` (see the README, "CUDA").
#
# It also unpacks CUDA's `libdevice.10.bc` (LLVM bitcode of the math
# functions, from NVIDIA's `nvidia-cuda-nvcc-cu12` wheel) into
# `$SAMPLER_CUDA_PATH` (default ~/.cache/sampler-chain/cuda): compiling a
# kernel that calls exp or log to PTX needs it, with or without a GPU. Point
# `CUDA_PATH` there (the script prints the line) unless a CUDA toolkit is
# installed.
#
# Usage: bash .ci/install-cuda-llvm.sh   (idempotent; any user, no root)
# Env: XDG_DATA_HOME (where the bundle folder goes), SAMPLER_LLVM_WHEELS
# (where the wheels are unpacked; default ~/.cache/sampler-chain/llvm-23.1.1).
set -euo pipefail
cd "$(dirname "$0")/.."

wheel_version=23.1.1.post0
# The bundler's version decides the folder name: read it from Cargo.lock so
# that a burn upgrade that moves it fails here, loudly, not in the build.
bundler=$(awk '/^name = "tracel-llvm-bundler"/ {getline; gsub(/version = |"/, ""); print; exit}' Cargo.lock)
[ -n "$bundler" ] || { echo "install-cuda-llvm: no tracel-llvm-bundler in Cargo.lock" >&2; exit 1; }
case "$bundler" in
  23.1.*) ;;
  *) echo "install-cuda-llvm: tracel-llvm-bundler $bundler wants another LLVM than $wheel_version" >&2; exit 1 ;;
esac

data_home=${XDG_DATA_HOME:-$HOME/.local/share}
bundle="$data_home/tracel/tracel-llvm-$bundler"
wheels=${SAMPLER_LLVM_WHEELS:-$HOME/.cache/sampler-chain/llvm-$wheel_version}
sdk="$wheels/mlc_llvm_static/static"

if [ ! -x "$sdk/bin/llvm-config" ]; then
  if ! python3 -m pip --version >/dev/null 2>&1; then
    # A machine without pip: Debian's (root only).
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-pip >/dev/null
  fi
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps --target "$wheels" \
    "mlc-llvm-static==$wheel_version" "mlc-llvm-static-extra-targets==$wheel_version"
fi
targets=$("$sdk/bin/llvm-config" --targets-built)
case " $targets " in
  *" NVPTX "*) ;;
  *) echo "install-cuda-llvm: $sdk has no NVPTX target (targets: $targets)" >&2; exit 1 ;;
esac

mkdir -p "$bundle"
for d in bin include lib share; do
  ln -sfn "$sdk/$d" "$bundle/$d"
done
touch "$bundle/.tracel-llvm-installed"
echo "LLVM $("$sdk/bin/llvm-config" --version) ($targets) in $bundle"

cuda=${SAMPLER_CUDA_PATH:-$HOME/.cache/sampler-chain/cuda}
libdevice="$cuda/nvvm/libdevice/libdevice.10.bc"
if [ ! -s "$libdevice" ]; then
  tmp=$(mktemp -d)
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --platform manylinux2014_x86_64 -d "$tmp" "nvidia-cuda-nvcc-cu12==12.9.86"
  mkdir -p "$(dirname "$libdevice")"
  python3 - "$tmp" "$libdevice" <<'PY'
import glob, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/nvidia_cuda_nvcc_cu12-*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith("nvvm/libdevice/libdevice.10.bc"))
    open(sys.argv[2], "wb").write(z.read(name))
PY
  rm -rf "$tmp"
fi
echo "libdevice in $libdevice: export CUDA_PATH=$cuda"
