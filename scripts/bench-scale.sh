#!/usr/bin/env bash
# istiod at Istio's reference scale (BENCHMARKS.md, "istiod at Istio's
# reference scale"): the real istiod binary in its own process serves a mesh
# that pilot-load writes into a config directory (1000 services, 2000 pods by
# default), and pilot-load connects simulated proxies to its plaintext port,
# applies the changes one at a time and reports each push (time from the
# file write to every proxy's ACK, bytes, istiod's CPU and RSS from /proc).
#
# Settings, from the environment:
#   ISTIOD_BIN   the istiod to measure (default: this tree's release build)
#   SERVICES     services (1000); PODS_PER_SERVICE (2); NAMESPACES (10)
#   PROXIES      simulated proxies (2000), each one of the mesh's pods
#   DELTA_EVERY  every n-th proxy speaks delta xDS (2: half; 0: none)
#   SIDECARS     1: a Sidecar per namespace (each proxy sees its namespace
#                and istio-system)
#   CHANGES      label,vs,endpoint,reconnect (pilot-load run --changes)
#   ISTIOD_ENV   extra environment for istiod, e.g. "PILOT_MAX_REQUESTS_PER_SECOND=1000"
#   OUT          where the phases go as JSON lines (default: a temporary file)
# Needs ports 15010, 15014 and 18080 on 127.0.0.1 free. Takes minutes.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release --locked -p istiod -p pilot-load
istiod_bin="${ISTIOD_BIN:-$PWD/target/release/istiod}"
load="$PWD/target/release/pilot-load"
work="$(mktemp -d)"
out="${OUT:-$work/phases.json}"
pid=""
cleanup() {
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill "$pid"
        wait "$pid" 2>/dev/null || true
    fi
    rm -rf "$work/mesh"
}
trap cleanup EXIT

sidecars=()
if [ "${SIDECARS:-0}" = 1 ]; then sidecars=(--sidecars); fi
"$load" mesh --dir "$work/mesh" \
    --services "${SERVICES:-1000}" \
    --namespaces "${NAMESPACES:-10}" \
    --pods-per-service "${PODS_PER_SERVICE:-2}" \
    "${sidecars[@]}"

# One connection per proxy: raise the open-file limit as far as allowed.
ulimit -n "$(ulimit -Hn)"
read -r -a extra_env <<<"${ISTIOD_ENV:-}"
(cd "$work" && exec env "${extra_env[@]}" "$istiod_bin" discovery \
    --configDir "$work/mesh" \
    --grpcAddr 127.0.0.1:15010 --secureGRPCAddr "" \
    --httpAddr 127.0.0.1:18080 --monitoringAddr 127.0.0.1:15014 --httpsAddr "" \
    >"$work/istiod.log" 2>&1) &
pid=$!
for _ in $(seq 1 300); do
    if curl -fsS -o /dev/null http://127.0.0.1:18080/ready 2>/dev/null; then break; fi
    kill -0 "$pid" 2>/dev/null || { cat "$work/istiod.log"; exit 1; }
    sleep 0.1
done
curl -fsS -o /dev/null http://127.0.0.1:18080/ready

echo "istiod: $istiod_bin (pid $pid); commit $(git rev-parse --short HEAD); load: $(cut -d' ' -f1-3 /proc/loadavg)"
"$load" run --dir "$work/mesh" \
    --addr http://127.0.0.1:15010 \
    --proxies "${PROXIES:-2000}" \
    --delta-every "${DELTA_EVERY:-2}" \
    --istiod-pid "$pid" \
    --changes "${CHANGES:-label,vs,endpoint,reconnect}" \
    --json "$out"
echo "phases: $out; load after: $(cut -d' ' -f1-3 /proc/loadavg)"
