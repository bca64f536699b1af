#!/usr/bin/env bash
# Runs the packed GPU check on an NVIDIA machine (repository root there,
# `.gpu-check/pack.tar.xz` from `scripts/gpu-check/build.sh`): the device
# conformance tests on NVIDIA Vulkan (wgpu and vulkan features) and CUDA,
# then the `gpu_check` benchmark (B = 1, 32, 256; V = 32000, 128256,
# 151936). Everything goes to stdout and, when $OUT is set, to $OUT/log.
# Each part has its own time limit so that the whole stays within 8 min.
set -uo pipefail
cd "$(dirname "$0")/../.."
work=/tmp/gpu-check && rm -rf "$work" && mkdir -p "$work"
tar -C "$work" -xJf .gpu-check/pack.tar.xz
log=${OUT:-$work}/log
exec > >(tee "$log") 2>&1

# The Vulkan loader, unless the machine has one.
if ! ldconfig -p | grep -q libvulkan.so.1; then
  for f in "$work"/deb/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if [ -f "$icd" ] && [ -z "${VK_DRIVER_FILES:-}" ]; then export VK_DRIVER_FILES=$icd; fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true

run() { # seconds, command...
  local limit=$1; shift
  echo "=== $* (limit ${limit}s)"
  timeout "$limit" "$@"; echo "=== exit $?"
}
# CUDA's LLVM path needs libdevice for exp/log: the packed copy unless
# the machine has a toolkit.
if [ -z "${CUDA_PATH:-}" ] && [ ! -f /usr/local/cuda/nvvm/libdevice/libdevice.10.bc ] && [ -d "$work/cuda" ]; then
  export CUDA_PATH=$work/cuda
fi
cd "$work/bin"
# The kernel tests take their device from SAMPLER_TEST_DEVICE; the others
# run one module per compiled-in device, picked by its name.
for t in device_select_kernels device_kernels; do
  for dev in wgpu vulkan; do
    [ -x "./$t" ] && SAMPLER_TEST_DEVICE=$dev run 60 "./$t" --nocapture
  done
  [ -x "./${t}_cuda" ] && SAMPLER_TEST_DEVICE=cuda run 60 "./${t}_cuda" --nocapture
done
for t in device_golden device_bugs device_equivalence device_large_vocab; do
  for dev in wgpu vulkan; do
    [ -x "./$t" ] && run 60 "./$t" "$dev::"
  done
  [ -x "./${t}_cuda" ] && run 60 "./${t}_cuda" "cuda::"
done
# The benchmark: NVIDIA Vulkan through wgpu, then CUDA.
[ -x ./gpu_check ] && BENCH_DEVICES=wgpu run 150 ./gpu_check --bench
[ -x ./gpu_check_cuda ] && BENCH_DEVICES=cuda run 150 ./gpu_check_cuda --bench
echo "=== gpu-check done"
