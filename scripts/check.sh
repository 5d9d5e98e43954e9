#!/usr/bin/env bash
# The code checks (CI runs them before the tests): lint, formatting, and the type checker on the
# package. Each must report nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
ruff check .
ruff format --check .
mypy
