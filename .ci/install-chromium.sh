#!/usr/bin/env bash
# Installs Debian's Chromium and ChromeDriver (packages chromium and
# chromium-driver: /usr/bin/chromium, /usr/bin/chromedriver) for the
# `/inspect` page's browser test (examples/tests/inspect_page.rs).
# Idempotent. Run as root, after an `apt-get update`.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
  # Waits for the lock where another install (a fallback pip) holds it.
  apt-get install -y -qq -o DPkg::Lock::Timeout=600 chromium chromium-driver >/dev/null
fi
chromium --version 2>/dev/null
chromedriver --version
