#!/usr/bin/env bash
# Installs what servesweep needs on a Debian machine: system packages, the Python package, and (once per machine)
# llama.cpp's llama-server for the embedded default. `./setup.sh --test` also installs the test dependencies.
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
if [ "${#need[@]}" -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"
fi

extras=""
[ "${1:-}" = "--test" ] && extras="[test]"
python3 -m pip install -q --disable-pip-version-check -e ".${extras}"

# The embedded default's engine: built from the llama-cpp-python sdist's vendored llama.cpp, cached per machine.
python3 -m servesweep.engines.llamacpp_build
