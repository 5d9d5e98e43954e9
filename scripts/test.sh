#!/usr/bin/env bash
# The test command (README and CI): the suite, with OpenBLAS preloaded when the machine has it,
# in parallel (pytest-xdist).
set -euo pipefail
cd "$(dirname "$0")/.."
openblas=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3
if [ "$(uname -s)" = Linux ] && [ -e "$openblas" ]; then
  export LD_PRELOAD="$openblas${LD_PRELOAD:+:$LD_PRELOAD}"
fi
# One worker per core, each test file on one worker (its module fixtures built once);
# MACBATCH_TEST_WORKERS=0, or -n 0 after the command, runs everything in this process.
exec python3 -m pytest -q -n "${MACBATCH_TEST_WORKERS:-auto}" --dist loadfile "$@"
