#!/usr/bin/env bash
# Runs the packed GPU check (repository root, `.gpu-check/pack.tar.xz` from
# `scripts/gpu-check/build.sh`): the `gpu_check` benchmark (B = 1, 32, 256;
# V = 32000, 128256, 151936), then every packed device conformance test
# binary on NVIDIA Vulkan (wgpu and vulkan features) and CUDA.
# Everything goes to stdout and, when $OUT is set, to $OUT/log. Each part
# has its own time limit so that the whole stays within 8 min on a GPU; a
# table of the parts (exit status, seconds) ends the output, and the script
# exits 1 when a part failed.
#
# Environment (all optional):
#   GPU_CHECK_VK_ICD   a Vulkan driver manifest to use instead of NVIDIA's,
#                      e.g. /usr/share/vulkan/icd.d/lvp_icd.json to try the
#                      pack on Mesa's software driver (lavapipe; a pack built
#                      with GPU_CHECK_FEATURES=wgpu: with the vulkan feature
#                      in, wgpu takes the SPIR-V path that lavapipe crashes on)
#   GPU_CHECK_DEVICES  the devices to run, default "wgpu vulkan cuda"
#                      (lavapipe crashes on the vulkan feature's SPIR-V:
#                      "wgpu cuda" there; cuda skips itself without a GPU)
#   GPU_CHECK_SCALE    multiplies every time limit (default 1; a software
#                      driver needs about 10)
#   BENCH_BATCH, BENCH_VOCAB, ...  passed to the benchmark (see its doc)
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -f .gpu-check/pack.tar.xz ] || { echo "no .gpu-check/pack.tar.xz: run scripts/gpu-check/build.sh first" >&2; exit 2; }
work=/tmp/gpu-check && rm -rf "$work" && mkdir -p "$work"
log=${OUT:-$work}/log
exec > >(tee "$log") 2>&1
t0=$(date +%s)
tar -C "$work" -xJf .gpu-check/pack.tar.xz
echo "=== unpacked in $(($(date +%s) - t0))s"

# The Vulkan loader, unless the machine has one.
if ! ldconfig -p | grep -q libvulkan.so.1; then
  for f in "$work"/deb/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
nvidia_icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if [ -n "${GPU_CHECK_VK_ICD:-}" ]; then
  export VK_DRIVER_FILES=$GPU_CHECK_VK_ICD
elif [ -f "$nvidia_icd" ] && [ -z "${VK_DRIVER_FILES:-}" ]; then
  export VK_DRIVER_FILES=$nvidia_icd
fi
echo "VK_DRIVER_FILES=${VK_DRIVER_FILES:-unset, the loader default}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null || echo "(no nvidia-smi)"
devices=${GPU_CHECK_DEVICES:-wgpu vulkan cuda}
scale=${GPU_CHECK_SCALE:-1}
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp/xdg-runtime}
mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"

parts=() failed=0
run() { # seconds, label, command...
  local limit=$(($1 * scale)) label=$2 s rc
  shift 2
  echo "=== $label: $* (limit ${limit}s)"
  s=$(date +%s)
  timeout "$limit" "$@"
  rc=$?
  echo "=== $label: exit $rc"
  parts+=("$(printf '%-44s exit %3s %5ss' "$label" "$rc" "$(($(date +%s) - s))")")
  [ "$rc" = 0 ] || failed=1
}
has() { case " $devices " in *" $1 "*) return 0 ;; esac; return 1; }

# CUDA's LLVM path needs libdevice for exp/log: the packed copy unless
# the machine has a toolkit.
if [ -z "${CUDA_PATH:-}" ] && [ ! -f /usr/local/cuda/nvvm/libdevice/libdevice.10.bc ] && [ -d "$work/cuda" ]; then
  export CUDA_PATH=$work/cuda
fi
cd "$work/bin"
ls -l
# The benchmark first (the figures a short lease must not lose): Vulkan
# through wgpu, then CUDA.
has wgpu && [ -x ./gpu_check ] && BENCH_DEVICES=wgpu run 150 "gpu_check on wgpu" ./gpu_check --bench
has cuda && [ -x ./gpu_check_cuda ] && BENCH_DEVICES=cuda run 150 "gpu_check on cuda" ./gpu_check_cuda --bench
# The kernel tests take their device from SAMPLER_TEST_DEVICE; the others
# run one module per compiled-in device, picked by its name.
for t in device_select_kernels device_kernels; do
  for dev in wgpu vulkan; do
    has "$dev" && [ -x "./$t" ] && SAMPLER_TEST_DEVICE=$dev run 45 "$t on $dev" "./$t" --nocapture
  done
  has cuda && [ -x "./${t}_cuda" ] && SAMPLER_TEST_DEVICE=cuda run 45 "$t on cuda" "./${t}_cuda" --nocapture
done
for t in device_golden device_bugs device_equivalence device_large_vocab; do
  for dev in wgpu vulkan; do
    has "$dev" && [ -x "./$t" ] && run 45 "$t on $dev" "./$t" "$dev::"
  done
  has cuda && [ -x "./${t}_cuda" ] && run 45 "$t on cuda" "./${t}_cuda" "cuda::"
done
echo
echo "=== gpu-check parts"
printf '%s\n' "${parts[@]}"
echo "=== gpu-check done in $(($(date +%s) - t0))s: $([ "$failed" = 0 ] && echo passed || echo FAILED)"
exit "$failed"
