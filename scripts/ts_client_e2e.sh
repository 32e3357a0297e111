#!/usr/bin/env bash
# A web frontend's client: TypeScript generated from the committed OpenAPI
# document by openapi-generator (typescript-fetch, the generator most
# frontends use), type-checked with tsc together with
# scripts/ts_client_e2e.ts, then run by node against a live drover
# (simulated runtime, fresh store, admin token).
#
#   bash scripts/ts_client_e2e.sh            (after `cargo build`)
#
# Tools, installed when missing, none from the npm registry:
# - openapi-generator-cli from PyPI, pinned, in the CI venv: the wheel holds
#   the generator's jar (nothing is downloaded when it runs); it needs a
#   Java runtime (Debian's openjdk-17-jre-headless);
# - tsc from Debian's node-typescript (4.8), and node (Debian's nodejs; its
#   built-in fetch is all the generated client needs).
# Everything it writes is in a temporary directory, removed at exit
# (scripts/live_drover.sh).
#
# DROVER (path to drover) and VENV (the Python environment) may be set.
set -euo pipefail
cd "$(dirname "$0")/.."

DROVER="${DROVER:-target/debug/drover}"
VENV="${VENV:-.ci/.venv}"
# The version whose output this script and the document were checked with
# (the document avoids what its typescript-fetch templates drop; see
# src/domain/pool/patch.rs).
GENERATOR=openapi-generator-cli==7.26.0

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
        echo "ts_client_e2e: need root (or sudo) to run: $*" >&2
        return 1
    fi
}

missing=()
command -v java >/dev/null || missing+=(openjdk-17-jre-headless)
command -v tsc >/dev/null || missing+=(node-typescript)
command -v node >/dev/null || missing+=(nodejs)
if [ ${#missing[@]} -gt 0 ]; then
    echo "==> installing ${missing[*]} (Debian packages) for the TypeScript client"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if ! "$VENV/bin/pip" show -q "${GENERATOR%%==*}" 2>/dev/null \
    || [ "$("$VENV/bin/pip" show "${GENERATOR%%==*}" | sed -n 's/^Version: //p')" != "${GENERATOR##*==}" ]; then
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check "$GENERATOR"
fi

# $work (removed at exit) and start_drover.
source scripts/live_drover.sh

"$VENV/bin/openapi-generator-cli" generate -g typescript-fetch -i openapi/openapi.json -o "$work/client" \
    > "$work/generate.log" 2>&1 || {
    cat "$work/generate.log"; echo "ts_client_e2e: the generator failed" >&2; exit 1; }
# Two warnings are known: the beta notice it gives any OpenAPI 3.1 document,
# and "Failed to get the schema name: null", which names no schema (it came
# with the document before these checks, and went away only with the path
# parameters). Any other names a part of the document the client may have
# lost.
if grep 'WARN' "$work/generate.log" | grep -v 'OpenAPI 3.1 support is still in beta' \
    | grep -v 'Failed to get the schema name: null' > "$work/warnings.log"; then
    cat "$work/warnings.log"
    echo "ts_client_e2e: the generator warned about the document (above)" >&2
    exit 1
fi

cp scripts/ts_client_e2e.ts "$work/e2e.ts"
# strict, as a frontend builds; the generated `instanceOf*` functions index
# `object` with a checked key, which only TypeScript 4.9 and later accept
# under noImplicitAny, and Debian's tsc is 4.8.
cat > "$work/tsconfig.json" <<'JSON'
{
  "compilerOptions": {
    "target": "ES2020",
    "module": "commonjs",
    "lib": ["ES2020", "DOM"],
    "strict": true,
    "suppressImplicitAnyIndexErrors": true,
    "noEmitOnError": true,
    "outDir": "out"
  },
  "files": ["e2e.ts"]
}
JSON
echo "==> tsc $(tsc --version)"
tsc -p "$work/tsconfig.json"

# The pool of the program mounts a host path under /srv.
start_drover http --allowed-mount-paths /srv

timeout 300 node "$work/out/e2e.js" "http://127.0.0.1:$port" "$(cat "$data/admin.token")"
