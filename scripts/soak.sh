#!/usr/bin/env bash
# The long soak: drover SIGKILLed at random moments during rollouts and
# scale changes of a 10-machine pool, then every invariant checked after
# each restart (tests/api/soak.rs says which). CI runs 3 iterations with the
# rest of the tests; this runs as many as you ask:
#
#   bash scripts/soak.sh 100
set -euo pipefail
cd "$(dirname "$0")/.."
export DROVER_SOAK_ITERATIONS="${1:-100}"
exec cargo test -j2 --test api -- --exact soak::sigkill_at_random_moments_of_rollouts_and_scaling_always_converges_exactly --nocapture
