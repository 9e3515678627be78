#!/usr/bin/env bash
# The main job: install what is needed, build, and run the local demo.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh >/dev/null
cargo build --workspace --bins --locked --quiet
exec target/debug/demo "$@"
