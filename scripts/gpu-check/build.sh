#!/usr/bin/env bash
# Builds and packs the GPU check: release binaries of the device
# conformance tests and of the `gpu_check` benchmark for NVIDIA Vulkan
# (burn's `wgpu` and `vulkan` features) and, where they fit, CUDA, plus the
# Vulkan loader, into `.gpu-check/` (at most 64 MiB; nothing needs to be
# downloaded on the GPU machine). `scripts/gpu-check/run.sh` runs it there.
#
# Usage (repository root, on this machine):
#   bash scripts/gpu-check/build.sh            # wgpu + vulkan, the cuda benchmark
#   GPU_CHECK_CUDA=0 bash scripts/gpu-check/build.sh   # without cuda
#   GPU_CHECK_CUDA_TESTS=1 ...   # also the cuda test binaries, if they fit:
#     each carries LLVM; with them the pack measured 76-97 MiB, so by
#     default only the cuda benchmark goes in (one xz pass, not two)
#   GPU_CHECK_FEATURES=wgpu ...  # Vulkan binaries without the vulkan feature:
#     with it compiled in, wgpu takes cubecl's SPIR-V path, which crashes
#     Mesa's lavapipe (fine on NVIDIA); build so to try the pack on lavapipe
# Needs: the Rust toolchain, apt-get (for the loader .deb), and for cuda
# the LLVM of `.ci/install-cuda-llvm.sh` (run first when GPU_CHECK_CUDA=1).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.gpu-check
limit=$((64 * 1024 * 1024))
t0=$(date +%s)
took() { echo "gpu-check: $1 in $(($(date +%s) - t0))s"; t0=$(date +%s); }
rm -rf "$out" && mkdir -p "$out/bin"
grep -qx '/.gpu-check/' .git/info/exclude 2>/dev/null || echo '/.gpu-check/' >> .git/info/exclude

# The device conformance tests that take a cubecl device, one binary each.
tests=(device_select_kernels device_kernels device_golden device_bugs device_equivalence device_large_vocab)

# Release test binaries and the benchmark, path of each from cargo's JSON.
# One cargo call per feature set, so that both packages share one feature
# resolution (two calls with different package sets compile burn twice).
build() { # features (flex and nothing else by default), suffix
  local features=$1 suffix=$2 t
  local args=(--release -p conformance -p sampler-backend --no-default-features --features "flex,$features"
    --no-run --message-format json --bench gpu_check)
  for t in "${tests[@]}"; do args+=(--test "$t"); done
  cargo test "${args[@]}" | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["target"]["name"], m["executable"])
    elif m.get("reason") == "compiler-message" and m["message"].get("level") == "error":
        sys.stderr.write(m["message"].get("rendered", "") + "\n")
' | while read -r name exe; do cp "$exe" "$out/bin/$name$suffix"; done
}

build "${GPU_CHECK_FEATURES:-wgpu,vulkan}" ""
took "release build (${GPU_CHECK_FEATURES:-wgpu,vulkan})"
if [ "${GPU_CHECK_CUDA:-1}" = 1 ]; then
  bash .ci/install-cuda-llvm.sh
  export CUDA_PATH=${SAMPLER_CUDA_PATH:-$HOME/.cache/sampler-chain/cuda}
  build cuda _cuda
  took "release build (cuda)"
  [ "${GPU_CHECK_CUDA_TESTS:-0}" = 1 ] || find "$out/bin" -name '*_cuda' ! -name 'gpu_check_cuda' -delete
fi
strip "$out"/bin/* 2>/dev/null || true

# The Vulkan loader (the GPU machine's driver brings its ICD, not always
# the loader), as Debian packages unpacked there when it has none.
mkdir -p "$out/deb" /tmp/gpu-check-apt/partial
o=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/gpu-check-apt)
apt-get "${o[@]}" update -qq
# The loader and the GL vendor-neutral libraries NVIDIA's Vulkan driver
# (libGLX_nvidia) loads beside it.
(cd "$out/deb" && apt-get "${o[@]}" download -qq libvulkan1 libglvnd0 libglx0 libegl1 libgl1 libopengl0 libgles2)
cp scripts/gpu-check/run.sh "$out/"
# libdevice (CUDA's math library as LLVM bitcode, for cubecl's LLVM path),
# as `.ci/install-cuda-llvm.sh` unpacked it, in case the GPU machine has no
# CUDA toolkit.
if ls "$out"/bin/*_cuda >/dev/null 2>&1; then
  mkdir -p "$out/cuda/nvvm/libdevice"
  cp "${SAMPLER_CUDA_PATH:-$HOME/.cache/sampler-chain/cuda}/nvvm/libdevice/libdevice.10.bc" "$out/cuda/nvvm/libdevice/"
fi

# Compressed, what travels must stay under the limit: drop the cuda
# binaries (largest) first when it does not.
# One xz stream with a 384 MiB window: it spans several stripped binaries,
# which share most of their code (burn, wgpu, cubecl, LLVM), so each next one
# packs to a fraction (unpacking needs 384 MiB of memory).
pack() {
  (cd "$out" && { find bin -type f ! -name '*_cuda' | sort; find bin -type f -name '*_cuda' | sort
    printf '%s\n' deb run.sh; [ -d cuda ] && echo cuda; true; } > files)
  XZ_OPT='-T1 --lzma2=preset=6,dict=384MiB' tar -C "$out" -cJf "$out.tar.xz" -T "$out/files"
  stat -c %s "$out.tar.xz"
}
size=$(pack)
if [ "$size" -gt "$limit" ] && ls "$out"/bin/*_cuda >/dev/null 2>&1; then
  echo "gpu-check: $((size >> 20)) MiB with cuda, over 64 MiB: cuda test binaries left out"
  find "$out/bin" -name '*_cuda' ! -name 'gpu_check_cuda' -delete
  size=$(pack)
fi
if [ "$size" -gt "$limit" ]; then
  echo "gpu-check: $((size >> 20)) MiB, over 64 MiB: cuda left out" && rm -f "$out"/bin/*_cuda && size=$(pack)
fi
took "packing"
mv "$out.tar.xz" "$out/pack.tar.xz"
rm -rf "$out/bin" "$out/deb" "$out/cuda" "$out/files"
echo "gpu-check: $out/pack.tar.xz, $((size >> 20)) MiB"
