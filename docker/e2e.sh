#!/usr/bin/env bash
# End-to-end check of the Docker cluster (not part of the test suite): write two node data
# folders (`headway split mnist`, Dirichlet), build the image, start a SuperLink and two
# SuperNodes (docker/compose.yml; each node mounts only its own folder, read-only), submit a
# 2-round FedLog run with dataset='local' and two bodies (mnist-cnn, mlp) through `flwr run`
# from the host venv, check the results folder, and tear everything down (`compose down -v`
# of this run's own compose project), also on failure or Ctrl-C.
#
#   docker/e2e.sh [--tls] [--state] [--gpu] [--server-data] [--no-build]
#     --tls          add compose.tls.yml (certificates made in a temporary folder)
#     --state        add compose.state.yml (SuperLink database, SuperNode state on volumes)
#     --gpu          add compose.gpu.yml (needs the NVIDIA Container Toolkit)
#     --server-data  add compose.server-data.yml: a third split folder is the server's own
#                    data (server-data='/server-data'); no server_data note is then expected
#     --no-build     use the existing $HEADWAY_IMAGE instead of building it
# Environment: HEADWAY_BASE_IMAGE (build base; offline: headway-base:bookworm, see
# docs/docker.md, "Offline"), HEADWAY_IMAGE (headway:latest), HEADWAY_DATA_DIR (../shared/data beside
# the checkout: MNIST for the host-side split), PYTHON (the host venv's python, .venv/bin/python), E2E_KEEP=1 (keep the
# temporary folder with results and logs), E2E_TIMEOUT (seconds for the run, 900).
# Exit codes: 0 passed, 1 failed, 2 usage or missing tools, 3 no Docker engine.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

overlays=() build=1 tls=0 state=0 server_data=0
for arg in "$@"; do
    case $arg in
        --tls) tls=1; overlays+=(-f docker/compose.tls.yml) ;;
        --state) state=1; overlays+=(-f docker/compose.state.yml) ;;
        --gpu) overlays+=(-f docker/compose.gpu.yml) ;;
        --server-data) server_data=1; overlays+=(-f docker/compose.server-data.yml) ;;
        --no-build) build=0 ;;
        -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
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
    echo "error: no docker command. Install Docker (docs/docker.md), e.g. on Debian: apt-get install -y docker.io docker-compose" >&2
    exit 3
fi
if ! docker info >/dev/null 2>&1; then
    cat >&2 <<EOF
error: no Docker engine is reachable (docker info failed${DOCKER_HOST:+ for DOCKER_HOST=$DOCKER_HOST}).
Start one and run this again, e.g. (as root; see docs/docker.md, "Offline"):
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
export HEADWAY_NODE0_DATA=$WORK/nodes/node-0 HEADWAY_NODE1_DATA=$WORK/nodes/node-1
export HEADWAY_SERVER_DATA=$WORK/nodes/node-2  # used by compose.server-data.yml only (--server-data)
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
# each SuperNode's own data: 2 % of MNIST's training set cut by label (Dirichlet), and the test set
# (with --server-data a third folder, node-2, is the server's)
say "writing node data folders under $WORK/nodes (headway split mnist)"
"$PYTHON" -m headway split mnist --partition dirichlet --num-clients $((2 + server_data)) --out "$WORK/nodes" --set train-fraction=0.02 \
    >"$WORK/split.log" 2>&1 || { cat "$WORK/split.log"; exit 1; }
if [[ $tls -eq 1 ]]; then
    "$PYTHON" -m headway certs "$HEADWAY_CERTS_DIR" --host superlink --host superlink-control >/dev/null
    connect=(--root-cert "$HEADWAY_CERTS_DIR/ca.crt")
else
    connect=(--insecure)
fi
# the containers run unprivileged (compose's HEADWAY_USER, default 10001:10001): as root, hand
# them the results folder and server.key; otherwise run them as the caller
if [[ $(id -u) -eq 0 ]]; then
    chown 10001:10001 "$WORK/results"
    [[ $tls -eq 1 ]] && chown 10001:10001 "$HEADWAY_CERTS_DIR/server.key"
else
    export HEADWAY_USER=${HEADWAY_USER:-$(id -u):$(id -g)}
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
# from inside a SuperNode container: the Fleet API opens, the Control/runtime API (by either
# name, and the SuperLink's Flower ports 9091/9093) does not; and nothing runs as root
compose exec -T supernode-0 python - <<'PY'
import os, socket
def opens(host, port):
    try:
        socket.create_connection((host, port), timeout=3).close()
        return True
    except OSError:
        return False
assert os.getuid() != 0, "the SuperNode runs as root"
assert opens("superlink", 9092), "the Fleet API is out of reach from a SuperNode"
reached = [f"{h}:{p}" for h in ("superlink", "superlink-control") for p in (8000, 9091, 9093) if opens(h, p)]
assert not reached, f"a SuperNode reaches {reached}"
print("[e2e] supernode-0: Fleet reachable; Control/runtime API not; uid", os.getuid())
PY

"$PYTHON" -m headway connect e2e --address "127.0.0.1:$HEADWAY_CONTROL_PORT" "${connect[@]}"
RUN_CONFIG="algorithm='fedlog' dataset='local' num-clients=2 num-server-rounds=2 local-epochs=1 batch-size=10 \
feature-dim=50 sample-timeout=120.0 round-timeout=300.0 results-dir='/app/results'"
[[ $server_data -eq 1 ]] && RUN_CONFIG+=" server-data='/server-data'"
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

"$PYTHON" - "$WORK/results" "$server_data" "$WORK/nodes" <<'EOF'
import json, sys
import numpy as np
from pathlib import Path
summaries = sorted(Path(sys.argv[1]).glob("*/summary.json"))
assert len(summaries) == 1, f"expected one run folder with summary.json in {sys.argv[1]}, found {summaries}"
folder = summaries[0].parent
summary = json.loads(summaries[0].read_text())
rounds = [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines() if line.strip()]
config = json.loads((folder / "config.json").read_text())
print(f"[e2e] {folder.name}: status={summary.get('status')} rounds={len(rounds)} failures={summary.get('failures')} "
      f"accuracy per round={[round(r.get('accuracy', float('nan')), 3) for r in rounds]} clients={[r.get('clients') for r in rounds]}")
print(f"[e2e] final accuracy {summary.get('final_accuracy')}, total bytes {summary.get('total_bytes')}, wall {summary.get('wall_seconds')} s")
assert summary.get("status") == "complete", summary
assert len(rounds) == 2 and summary.get("rounds") == 2, (summary, rounds)
assert summary.get("failures") == 0 and all(r.get("failures", 0) == 0 and r.get("clients") == 2 for r in rounds), rounds
assert config.get("algorithm") == "fedlog", config.get("algorithm")
# each SuperNode ran the body its compose service names (--body), not the run config's default;
# with dataset=local the server numbers clients in the order they register, so either order
participants = summary.get("participants", {})
assert sorted(participants) == ["0", "1"] and sorted(participants.values()) == ["mlp", "mnist-cnn"], participants
print(f"[e2e] bodies by client: {participants}")
# dataset=local: each node described only its own folder (supernode-0: mnist-cnn, node-0;
# supernode-1: mlp, node-1); the server merged the two and holds no data
def counts(folder):
    z = np.load(f"{sys.argv[3]}/{folder}/data.npz")
    tr, te = (dict(zip(*(a.tolist() for a in np.unique(z[k], return_counts=True)))) for k in ("y_train", "y_test"))
    return {c: [tr.get(c, 0), te.get(c, 0)] for c in sorted(set(tr) | set(te))}
folder_of = {"mnist-cnn": "node-0", "mlp": "node-1"}
declared = summary.get("declared_data", {})
assert sorted(declared) == ["0", "1"], f"declared_data should list clients 0 and 1: {declared}"
for k, d in sorted(declared.items()):
    print(f"[e2e] client {k} ({participants[k]}) declared {d['train_examples']} train / {d['test_examples']} test examples, "
          f"classes {{class: [train, test]}} {d['classes']}")
    assert d["classes"] == counts(folder_of[participants[k]]), f"client {k} ({participants[k]}) declared other counts than {folder_of[participants[k]]} holds"
assert declared["0"]["classes"] != declared["1"]["classes"], "the two nodes declared the same class counts: not their own folders?"
discovery = summary.get("discovery", {})
print(f"[e2e] discovery: classes {discovery.get('classes')}, input_shape {discovery.get('input_shape')}, nodes {discovery.get('nodes')}")
assert discovery.get("input_shape") == [1, 28, 28], discovery  # from the npz arrays: no image-size/channels given
assert sorted(discovery.get("classes", [])) == sorted(set(declared["0"]["classes"]) | set(declared["1"]["classes"])), discovery
if sys.argv[2] == "1":  # the server read its own data (compose.server-data.yml): no "none" note (FedLog has no
    # single global model, so no global_* score; algorithms with one score it on this data)
    assert "server_data" not in summary, f"the server holds /server-data, yet summary.json says {summary['server_data']!r}"
    print("[e2e] server_data: the server read its own data from /server-data (no 'none' note)")
else:
    assert summary.get("server_data", "").startswith("none"), f"server_data note missing: {summary.get('server_data')!r}"
    print(f"[e2e] server_data: {summary['server_data']}")
EOF

compose logs --no-color >"$WORK/cluster.log" 2>&1 || true
if [[ $state -eq 1 ]]; then
    compose exec -T superlink test -s /state/state.db && say "SuperLink database /state/state.db written"
    compose exec -T supernode-0 sh -c 'ls -A /state | grep -q .' && say "SuperNode state written to /state"
fi
status=0
