#!/usr/bin/env bash
# The test command of the README: sets up what a fresh machine lacks, then
# runs every test.
#
#   bash scripts/test.sh [cargo test arguments...]
#
# - Docker tests: need a running engine (this script starts it when it can);
#   their images are built by the tests themselves from a static program the
#   harness compiles, so nothing is pulled and nothing else is installed.
#   The test of the container image (tests/api/image.rs) runs drover built
#   as the Dockerfile builds it: this script builds that static binary
#   (scripts/static_binary.sh, into target/static) and passes its path in
#   DROVER_STATIC_BINARY.
# - Browser tests: need chromium and chromedriver, installed here from
#   Debian's packages when missing.
# - PostgreSQL: the replica tests, and a second run of the API tests on
#   PostgreSQL (DROVER_TEST_DATABASE=postgres), start private servers of
#   Debian's `postgresql` package, installed here when missing (its own
#   cluster is left stopped: the tests never use it).
# - faketime: the upgrade-job tests with a replica whose clock is off
#   preload Debian's libfaketime, installed here when missing.
# A test whose tool is missing fails with the reason. To opt out on purpose,
# set DROVER_SKIP_DOCKER_TESTS=1 and/or DROVER_SKIP_BROWSER_TESTS=1 (any
# non-empty value): this script then installs or starts nothing for that
# tool, build.rs turns the variable into a cfg, and the tests that need the
# tool are listed as ignored ("ignored, DROVER_SKIP_..._TESTS is set") in
# cargo's summary, never as passed. Changing a variable recompiles the crate.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
        echo "scripts/test.sh: need root (or sudo) to run: $*" >&2
        return 1
    fi
}

if [ -z "${DROVER_SKIP_BROWSER_TESTS:-}" ]; then
    missing=()
    command -v chromium >/dev/null || missing+=(chromium)
    command -v chromedriver >/dev/null || missing+=(chromium-driver)
    if [ ${#missing[@]} -gt 0 ]; then
        echo "==> installing ${missing[*]} (Debian packages) for the dashboard's browser tests"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
    fi
fi

if [ -z "${DROVER_SKIP_DOCKER_TESTS:-}" ] && ! docker info >/dev/null 2>&1; then
    echo "==> the Docker engine does not answer; trying to start it"
    as_root service docker start >/dev/null 2>&1 || true
    for _ in $(seq 1 30); do docker info >/dev/null 2>&1 && break; sleep 1; done
fi

if ! command -v initdb >/dev/null && ! compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then
    echo "==> installing postgresql (Debian package) for the PostgreSQL tests"
    # The package starts a cluster of its own; services stay down while it installs.
    policy=/usr/sbin/policy-rc.d
    if [ ! -e "$policy" ]; then
        as_root sh -c "printf '#!/bin/sh\nexit 101\n' > $policy && chmod +x $policy"
        trap 'as_root rm -f "$policy"' EXIT
    fi
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql
fi

if ! compgen -G '/usr/lib/*/faketime/libfaketime.so.1' >/dev/null; then
    echo "==> installing faketime (Debian package) for the clock-skew tests of upgrade jobs"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends faketime
fi

if [ -z "${DROVER_SKIP_DOCKER_TESTS:-}" ]; then
    echo "==> drover as a static binary, as the Dockerfile builds it, for the container image's test"
    DROVER_STATIC_BINARY="$(bash scripts/static_binary.sh)"
    export DROVER_STATIC_BINARY
fi

echo "==> every test, the API's on SQLite"
cargo test "$@"
echo "==> the API tests again, on PostgreSQL"
# The tests of several replicas use PostgreSQL in both runs; they ran above.
# The container image keeps its store on its volume, whatever the run's.
DROVER_TEST_DATABASE=postgres cargo test --test api "$@" -- \
    --skip replicas:: --skip consistency:: --skip job_leases:: --skip chaos:: --skip image:: \
    --skip traces::a_rolling_update_across_replicas
