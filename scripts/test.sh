#!/usr/bin/env bash
# The test command (README and CI): the suite, with OpenBLAS preloaded (the system's, else the
# cmeel-openblas wheel's: macbatch/blas.py),
# in parallel (pytest-xdist).
set -euo pipefail
cd "$(dirname "$0")/.."
# The OpenBLAS the CLI would preload (macbatch/blas.py: the system's, else the wheel's).
if [ "$(uname -s)" = Linux ] && [[ "${LD_PRELOAD:-}" != *openblas* ]]; then
  openblas=$(python3 -m macbatch.blas)
  if [ -n "$openblas" ]; then
    export LD_PRELOAD="$openblas${LD_PRELOAD:+:$LD_PRELOAD}"
  fi
fi
# One worker per core, each test file on one worker (its module fixtures built once);
# MACBATCH_TEST_WORKERS=0, or -n 0 after the command, runs everything in this process.
exec python3 -m pytest -q -n "${MACBATCH_TEST_WORKERS:-auto}" --dist loadfile "$@"
