#!/usr/bin/env bash
# A client generated from the committed OpenAPI document, driven end to end
# against a live drover (simulated runtime, fresh database, admin token).
#
#   bash scripts/client_e2e.sh            (after `cargo build`)
#   bash scripts/client_e2e.sh --tls      the same over HTTPS, with a CA made
#                                         here (openssl) that the client trusts
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
tls=""
[ "${1:-}" = "--tls" ] && tls=1
VENV="${VENV:-.ci/.venv}"
if [ ! -x "$VENV/bin/openapi-python-client" ]; then
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check openapi-python-client
fi

# $work (removed at exit) and start_drover.
source scripts/live_drover.sh

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

scheme=http
serve_tls=()
ca_arg=()
if [ -n "$tls" ]; then
    # A private CA and a certificate for 127.0.0.1 that it signed.
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj "/CN=client_e2e CA" \
        -keyout "$work/ca.key" -out "$work/ca.pem" 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=127.0.0.1" \
        -keyout "$work/server.key" -out "$work/server.csr" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1\n' > "$work/san.ext"
    openssl x509 -req -in "$work/server.csr" -CA "$work/ca.pem" -CAkey "$work/ca.key" -CAcreateserial -days 1 \
        -extfile "$work/san.ext" -out "$work/server.crt" 2>/dev/null
    scheme=https
    serve_tls=(--tls-cert "$work/server.crt" --tls-key "$work/server.key")
    ca_arg=("$work/ca.pem")
fi

start_drover "$scheme" "${serve_tls[@]}"

PYTHONPATH="$work/client" timeout 600 "$VENV/bin/python" scripts/client_e2e.py \
    "$scheme://127.0.0.1:$port" "$(cat "$data/admin.token")" "${ca_arg[@]}"
