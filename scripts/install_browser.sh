#!/usr/bin/env bash
# Install headless Chromium and its WebDriver (Debian packages) for tests/view/test_view_browser.py.
# Idempotent: does nothing when both binaries are already there. Needs root (or sudo) and apt.
#
# Usage: scripts/install_browser.sh
set -euo pipefail

if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
    echo "[install_browser] already installed: $(/usr/bin/chromium --version 2>/dev/null | head -n1)"
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "[install_browser] needs root or sudo" >&2; exit 1; }
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q chromium chromium-driver
echo "[install_browser] $(/usr/bin/chromium --version 2>/dev/null | head -n1); $(/usr/bin/chromedriver --version | head -n1)"
