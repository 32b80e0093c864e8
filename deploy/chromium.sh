#!/usr/bin/env bash
# Debian's Chromium for the console's browser tests (tests/console/test_browser.py, driven by
# Playwright for Python with executable_path=/usr/bin/chromium; Playwright's own browser
# downloads are never used). Nothing happens when /usr/bin/chromium is there. Otherwise, as root:
# Debian's package chromium is installed (apt-get). Not root and no Chromium: an error.
set -euo pipefail

say() { echo "chromium: $*" >&2; }

if [ -x /usr/bin/chromium ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  say "/usr/bin/chromium is missing; install it (Debian: apt-get install chromium) or run as root"
  exit 1
fi
say "installing chromium"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
/usr/bin/chromium --version >&2
