#!/usr/bin/env bash
# Installs what servesweep needs on a Debian machine: system packages, the Python package, and (once per machine)
# llama.cpp's llama-server for the embedded default. `./setup.sh --test` also installs the test dependencies
# (pytest, and Chromium for the HTML-report test).
set -euo pipefail
cd "$(dirname "$0")"

need=()
command -v aria2c >/dev/null || need+=(aria2)
command -v cmake >/dev/null || need+=(cmake)
command -v g++ >/dev/null || need+=(g++)
command -v git >/dev/null || need+=(git)
command -v bwrap >/dev/null || need+=(bubblewrap)  # the sandbox for model-written code
python3 -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
  || need+=(python3-dev)
# The HTML-report test opens the report in headless Chromium (tests/report_browser.py looks for these names).
browser_missing=""
if [ "${1:-}" = "--test" ] && ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null \
    && ! command -v google-chrome >/dev/null; then
  browser_missing=1
  if command -v apt-get >/dev/null; then
    need+=(chromium)
  else
    echo "setup.sh: no apt-get here: install Chromium yourself, or the HTML-report test will be skipped" >&2
  fi
fi
if [ "${#need[@]}" -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" || {
    echo "setup.sh: apt-get install ${need[*]} failed" >&2
    exit 1
  }
fi
if [ -n "$browser_missing" ] && command -v apt-get >/dev/null && ! command -v chromium >/dev/null; then
  echo "setup.sh: apt-get installed chromium but there is no chromium on PATH" >&2
  exit 1
fi

extras=""
[ "${1:-}" = "--test" ] && extras="[test]"
python3 -m pip install -q --disable-pip-version-check -e ".${extras}"

# The embedded default's engine: built from the llama-cpp-python sdist's vendored llama.cpp, cached per machine.
python3 -m servesweep.engines.llamacpp_build
