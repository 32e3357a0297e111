#!/usr/bin/env bash
# A client generated from the committed OpenAPI document, driven end to end
# against a live drover (simulated runtime, fresh database, admin token).
#
#   bash scripts/client_e2e.sh            (after `cargo build`)
#
# The generator is openapi-python-client from PyPI, installed in .ci/.venv;
# any warning it prints fails the run (a warning means part of the document
# could not be turned into client code). scripts/client_e2e.py then uses
# only the generated client: no hand-written request anywhere.
#
# DROVER (path to drover) and VENV (the Python environment) may be set.
set -euo pipefail
cd "$(dirname "$0")/.."

DROVER="${DROVER:-target/debug/drover}"
VENV="${VENV:-.ci/.venv}"
if [ ! -x "$VENV/bin/openapi-python-client" ]; then
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check openapi-python-client
fi

work="$(mktemp -d)"
data="$work/data"
mkdir -p "$data"
pid=""
cleanup() {
    if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

# No post hooks: formatting the generated code (ruff) is not what is tested.
printf 'post_hooks: []\n' > "$work/generator.yml"
"$VENV/bin/openapi-python-client" generate --path openapi/openapi.json --meta none \
    --output-path "$work/client/drover_client" --config "$work/generator.yml" > "$work/generate.log" 2>&1 || {
    cat "$work/generate.log"; echo "client_e2e: the generator failed" >&2; exit 1; }
cat "$work/generate.log"
if grep -qi 'warning' "$work/generate.log"; then
    echo "client_e2e: the generator warned about the document (above)" >&2
    exit 1
fi

port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
"$DROVER" serve --runtime simulated --listen "127.0.0.1:$port" --data-dir "$data" --log-level warn &
pid=$!
for _ in $(seq 1 100); do
    "$VENV/bin/python" -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$port/healthz')" \
        >/dev/null 2>&1 && break
    sleep 0.1
done

PYTHONPATH="$work/client" timeout 600 "$VENV/bin/python" scripts/client_e2e.py \
    "http://127.0.0.1:$port" "$(cat "$data/admin.token")"
