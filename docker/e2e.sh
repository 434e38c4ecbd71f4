#!/usr/bin/env bash
# End-to-end check of the Docker cluster (not part of the test suite): build the image, start
# a SuperLink and two SuperNodes (docker/compose.yml), submit a 2-round FedLog run with two
# bodies (mnist-cnn, mlp) through `flwr run` from the host venv, check the results folder,
# and tear everything down (`compose down -v` of this run's own compose project), also on
# failure or Ctrl-C.
#
#   docker/e2e.sh [--tls] [--state] [--gpu] [--no-build]
#     --tls       add compose.tls.yml (certificates made in a temporary folder)
#     --state     add compose.state.yml (SuperLink database, SuperNode state on volumes)
#     --gpu       add compose.gpu.yml (needs the NVIDIA Container Toolkit)
#     --no-build  use the existing $HEADWAY_IMAGE instead of building it
# Environment: HEADWAY_BASE_IMAGE (build base; offline: headway-base:bookworm, see
# docker/README.md), HEADWAY_IMAGE (headway:latest), HEADWAY_DATA_DIR (../shared/data beside
# the checkout), PYTHON (the host venv's python, .venv/bin/python), E2E_KEEP=1 (keep the
# temporary folder with results and logs), E2E_TIMEOUT (seconds for the run, 900).
# Exit codes: 0 passed, 1 failed, 2 usage or missing tools, 3 no Docker engine.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

overlays=() build=1 tls=0 state=0
for arg in "$@"; do
    case $arg in
        --tls) tls=1; overlays+=(-f docker/compose.tls.yml) ;;
        --state) state=1; overlays+=(-f docker/compose.state.yml) ;;
        --gpu) overlays+=(-f docker/compose.gpu.yml) ;;
        --no-build) build=0 ;;
        -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: unknown argument $arg (see --help)" >&2; exit 2 ;;
    esac
done

say() { printf '[e2e %(%H:%M:%S)T] %s\n' -1 "$*"; }

PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
FLWR=$(dirname "$PYTHON")/flwr
if [[ ! -x $PYTHON || ! -x $FLWR ]]; then
    echo "error: no host venv with flwr at $PYTHON: python3.11 -m venv .venv && .venv/bin/pip install -e . (or set PYTHON)" >&2
    exit 2
fi
if ! command -v docker >/dev/null; then
    echo "error: no docker command. Install Docker (docker/README.md), e.g. on Debian: apt-get install -y docker.io docker-compose" >&2
    exit 3
fi
if ! docker info >/dev/null 2>&1; then
    cat >&2 <<EOF
error: no Docker engine is reachable (docker info failed${DOCKER_HOST:+ for DOCKER_HOST=$DOCKER_HOST}).
Start one and run this again, e.g. (as root; see docker/README.md, "Offline"):
  setsid nohup dockerd >/var/log/dockerd.log 2>&1 &                        # overlay2 storage
  setsid nohup dockerd --storage-driver=vfs >/var/log/dockerd.log 2>&1 &   # where overlay is refused
or: systemctl start docker. Without Docker Hub, make a base image first:
  docker/base-image.sh && HEADWAY_BASE_IMAGE=headway-base:bookworm docker/e2e.sh
EOF
    exit 3
fi
if docker compose version >/dev/null 2>&1; then
    COMPOSE=(docker compose)
elif command -v docker-compose >/dev/null; then
    COMPOSE=(docker-compose)
else
    echo "error: neither 'docker compose' nor 'docker-compose' found (apt-get install docker-compose, or the compose plugin)" >&2
    exit 2
fi

free_port() { "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/headway-e2e.XXXXXX")
PROJECT=headway-e2e-$$
mkdir -p "$WORK/results"
export HEADWAY_RESULTS_DIR=$WORK/results
export HEADWAY_DATA_DIR=${HEADWAY_DATA_DIR:-$(cd "$ROOT/.." && pwd)/shared/data}
export HEADWAY_CONTROL_PORT=${HEADWAY_CONTROL_PORT:-$(free_port)}
export HEADWAY_FLEET_ADDR=127.0.0.1:$(free_port)
export HEADWAY_CERTS_DIR=$WORK/certs
export FLWR_HOME=$WORK/flwr-home
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
[[ -d $HEADWAY_DATA_DIR ]] || { echo "error: no data folder $HEADWAY_DATA_DIR (set HEADWAY_DATA_DIR)" >&2; exit 2; }
compose() { "${COMPOSE[@]}" -p "$PROJECT" -f docker/compose.yml "${overlays[@]}" "$@"; }

status=1
cleanup() {
    trap - EXIT INT TERM
    if [[ $status -ne 0 ]]; then
        say "FAILED; the cluster's last log lines:"
        compose logs --no-color --tail 60 2>&1 | tail -n 200 || true
    fi
    say "tearing down compose project $PROJECT"
    compose down -v --remove-orphans --timeout 30 >"$WORK/down.log" 2>&1 || { cat "$WORK/down.log"; status=1; }
    if [[ $status -eq 0 && -z ${E2E_KEEP:-} ]]; then
        rm -rf "$WORK"
    else
        say "kept $WORK (results, logs)"
    fi
    if [[ $status -eq 0 ]]; then say "PASSED"; else say "FAILED"; fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "compose: ${COMPOSE[*]}; project $PROJECT; data $HEADWAY_DATA_DIR; work $WORK"
if [[ $tls -eq 1 ]]; then
    "$PYTHON" -m server.launch certs "$HEADWAY_CERTS_DIR" --host superlink >/dev/null
    connect=(--root-cert "$HEADWAY_CERTS_DIR/ca.crt")
else
    connect=(--insecure)
fi

if [[ $build -eq 1 ]]; then
    say "building ${HEADWAY_IMAGE:-headway:latest} from ${HEADWAY_BASE_IMAGE:-python:3.11-slim}"
    t0=$SECONDS
    compose build >"$WORK/build.log" 2>&1 || { tail -n 40 "$WORK/build.log"; exit 1; }
    say "built in $((SECONDS - t0)) s"
fi
docker images "${HEADWAY_IMAGE:-headway:latest}" --format '[e2e] image {{.Repository}}:{{.Tag}} {{.ID}} {{.Size}}'

say "starting the SuperLink and two SuperNodes"
compose up -d --no-build
# Docker's port proxy accepts connections before the SuperLink listens: wait for an HTTP answer
# (any status) from the Control API, not just an open port.
control_up() {
    "$PYTHON" - "$1" "$2" <<'PY' 2>/dev/null
import ssl, sys, urllib.error, urllib.request
url, ca = sys.argv[1], sys.argv[2]
try:
    urllib.request.urlopen(url, timeout=3, context=ssl.create_default_context(cafile=ca) if ca else None)
except urllib.error.HTTPError:
    pass  # an HTTP answer: the server is up
PY
}
if [[ $tls -eq 1 ]]; then url=https://127.0.0.1:$HEADWAY_CONTROL_PORT/ ca=$HEADWAY_CERTS_DIR/ca.crt; else url=http://127.0.0.1:$HEADWAY_CONTROL_PORT/ ca=; fi
deadline=$((SECONDS + 180))
until control_up "$url" "$ca"; do
    if ((SECONDS > deadline)); then say "the Control API did not answer on $url in 180 s"; exit 1; fi
    sleep 2
done
say "Control API answers on $url"
compose ps

"$PYTHON" -m server.launch connect e2e --address "127.0.0.1:$HEADWAY_CONTROL_PORT" "${connect[@]}"
RUN_CONFIG="algorithm='fedlog' dataset='mnist' num-clients=2 num-server-rounds=2 train-fraction=0.01 local-epochs=1 batch-size=10 \
partition='pathological' feature-dim=50 sample-timeout=120.0 round-timeout=300.0 results-dir='/app/results'"
say "flwr run . e2e --stream --run-config \"$RUN_CONFIG\""
t0=$SECONDS
set +e
timeout "${E2E_TIMEOUT:-900}" "$FLWR" run . e2e --stream --run-config "$RUN_CONFIG" 2>&1 | tee "$WORK/flwr-run.log" \
    | { grep -v -e 'httpx: HTTP Request' || true; } | tail -n 25
rc=${PIPESTATUS[0]}
set -e
if [[ $rc -ne 0 ]]; then
    say "flwr run failed after $((SECONDS - t0)) s (exit $rc$( ((rc == 124)) && echo ": timed out, E2E_TIMEOUT=${E2E_TIMEOUT:-900}"))"
    exit 1
fi
say "flwr run finished in $((SECONDS - t0)) s"

"$PYTHON" - "$WORK/results" <<'EOF'
import json, sys
from pathlib import Path
summaries = sorted(Path(sys.argv[1]).glob("*/summary.json"))
assert len(summaries) == 1, f"expected one run folder with summary.json in {sys.argv[1]}, found {summaries}"
folder = summaries[0].parent
summary = json.loads(summaries[0].read_text())
rounds = [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines() if line.strip()]
config = json.loads((folder / "config.json").read_text())
print(f"[e2e] {folder.name}: status={summary.get('status')} rounds={len(rounds)} failures={summary.get('failures')} "
      f"accuracy per round={[round(r.get('accuracy', float('nan')), 3) for r in rounds]} clients={[r.get('clients') for r in rounds]}")
assert summary.get("status") == "complete", summary
assert len(rounds) == 2 and summary.get("rounds") == 2, (summary, rounds)
assert summary.get("failures") == 0 and all(r.get("failures", 0) == 0 and r.get("clients") == 2 for r in rounds), rounds
assert config.get("algorithm") == "fedlog", config.get("algorithm")
# each SuperNode ran the body its compose service names (--body), not the run config's default
assert summary.get("participants", {}) == {"0": "mnist-cnn", "1": "mlp"}, summary.get("participants")
print(f"[e2e] bodies by partition: {summary['participants']}")
EOF

compose logs --no-color >"$WORK/cluster.log" 2>&1 || true
if [[ $state -eq 1 ]]; then
    compose exec -T superlink test -s /state/state.db && say "SuperLink database /state/state.db written"
    compose exec -T supernode-0 sh -c 'ls -A /state | grep -q .' && say "SuperNode state written to /state"
fi
status=0
