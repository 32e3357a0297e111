#!/usr/bin/env bash
# Builds drover as the Dockerfile's build stage does (a static glibc binary
# of the release profile), for the test that runs the image's last stage
# (tests/api/image.rs), and prints the binary's path as its last line.
#
#   export DROVER_STATIC_BINARY="$(bash scripts/static_binary.sh)"
#
# It builds into target/static, a target directory of its own: the flags
# differ from a normal build's, and sharing target/ would rebuild one or the
# other every time. Cold, it takes about as long as a release build (some
# 5 minutes on 2 cores); after an edit, about a minute. cargo's output goes
# to standard error.
#
# The flags are the Dockerfile's (its `RUN ... cargo build` line); the test
# compares the two, so change them together.
set -euo pipefail
cd "$(dirname "$0")/.."

RUSTFLAGS="-C target-feature=+crt-static" \
    cargo build --release --locked --target x86_64-unknown-linux-gnu --bin drover --target-dir target/static >&2
echo "$PWD/target/static/x86_64-unknown-linux-gnu/release/drover"
