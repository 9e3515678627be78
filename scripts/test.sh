#!/usr/bin/env bash
# The whole test suite: builds the binaries the end-to-end tests run, then
# runs every unit and end-to-end test (with the real Envoy).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --workspace --bins --locked
cargo test --workspace --locked --no-fail-fast
