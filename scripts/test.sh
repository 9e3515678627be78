#!/usr/bin/env bash
# The whole test suite: builds the binaries the end-to-end tests run, then
# runs every unit and end-to-end test (with the real Envoy). Each phase's
# seconds are printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/phase.sh
phase setup scripts/setup.sh
phase build cargo build --workspace --bins --locked
phase test cargo test --workspace --locked --no-fail-fast
