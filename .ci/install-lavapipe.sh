#!/usr/bin/env bash
# Installs Mesa's software Vulkan driver (lavapipe) from Debian
# bookworm-backports: the stock bookworm Mesa 22.3.6 computes wrong results
# silently for burn's wgpu kernels; 25.0.x from backports is correct.
# Idempotent. Run as root.
set -euo pipefail
want_suite=bookworm-backports
src=/etc/apt/sources.list.d/debian.sources
list=/etc/apt/sources.list.d/sampler-chain-backports.sources
if [ ! -f "$list" ]; then
  uris=$(awk '/^URIs:/ && !done {print $2; done=1}' "$src")
  keyring=$(awk '/^Signed-By:/ && !done {print $2; done=1}' "$src")
  cat > "$list" <<EOT
Types: deb
URIs: ${uris}
Suites: ${want_suite}
Components: main
Signed-By: ${keyring}
EOT
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq -t "$want_suite" mesa-vulkan-drivers libvulkan1 >/dev/null
dpkg-query -W -f='${Package} ${Version}\n' mesa-vulkan-drivers libvulkan1
