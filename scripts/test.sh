#!/usr/bin/env bash
# The test command (README and CI): the suite, with OpenBLAS preloaded when the machine has it.
set -euo pipefail
cd "$(dirname "$0")/.."
openblas=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3
if [ "$(uname -s)" = Linux ] && [ -e "$openblas" ]; then
  export LD_PRELOAD="$openblas${LD_PRELOAD:+:$LD_PRELOAD}"
fi
exec python3 -m pytest -q "$@"
