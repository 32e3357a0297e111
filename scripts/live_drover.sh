# Sourced (not run) by the scripts that test a live drover: schemathesis.sh,
# client_e2e.sh and ts_client_e2e.sh. It gives them
# - $work: a temporary directory, removed when the script exits, for
#   everything the script writes (so that nothing lands in the work tree);
# - start_drover SCHEME [serve flags...]: `drover serve` on the simulated
#   runtime, with a fresh store in $work/data, on a free loopback port
#   ($port), once /healthz answers (over https it trusts $work/ca.pem).
#   The admin token it writes is in $work/data/admin.token. It is stopped
#   when the script exits.
# DROVER (path to drover) must be set.

work="$(mktemp -d)"
data="$work/data"
mkdir -p "$data"
pid=""
cleanup() {
    if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

start_drover() {
    local scheme="$1"
    shift
    port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
    "$DROVER" serve --runtime simulated --listen "127.0.0.1:$port" --data-dir "$data" --log-level warn "$@" &
    pid=$!
    local trust=()
    [ "$scheme" = https ] && trust=(--cacert "$work/ca.pem")
    for _ in $(seq 1 100); do
        curl -fsS "${trust[@]}" "$scheme://127.0.0.1:$port/healthz" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "drover did not answer on $scheme://127.0.0.1:$port/healthz within 10 s" >&2
    return 1
}
