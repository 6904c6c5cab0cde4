#!/usr/bin/env bash
# Headless Chromium for the dashboard test (Debian's chromium package), installed quietly
# when missing. Without root or apt the dashboard browser test skips and says why.
set -uo pipefail
command -v chromium >/dev/null 2>&1 && exit 0
command -v apt-get >/dev/null 2>&1 || exit 0
sudo=""
if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || exit 0
    sudo="sudo -n"
fi
{ $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
    $sudo apt-get install -y -qq --no-install-recommends chromium; } >/dev/null 2>&1 \
    || echo "scripts/browser.sh: could not install chromium; the dashboard browser test will skip" >&2
exit 0
