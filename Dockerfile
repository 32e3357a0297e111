# drover as a container image: a static binary on an empty base.
#
#   docker build -t drover .
#   docker run -d -p 8080:8080 -v /var/run/docker.sock:/var/run/docker.sock \
#       -v drover-data:/data drover
#
# The image needs the Docker socket of the host whose containers it manages.
#
# tests/api/image.rs builds and runs the last stage as written here, with
# the build stage's outputs (/out/drover, /out/data) made on the test's
# machine: scripts/static_binary.sh builds drover with this file's cargo
# flags, and a test fails when the two differ.

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY src src
COPY migrations migrations
COPY ui ui
COPY benches benches
COPY tests tests
# A static glibc binary needs no libraries from the base image.
RUN RUSTFLAGS="-C target-feature=+crt-static" \
    cargo build --release --locked --target x86_64-unknown-linux-gnu --bin drover \
 && mkdir -p /out/data \
 && cp target/x86_64-unknown-linux-gnu/release/drover /out/drover

FROM scratch
COPY --from=build /out/drover /drover
COPY --from=build /out/data /data
ENV DROVER_LISTEN=0.0.0.0:8080 \
    DROVER_DATA_DIR=/data
EXPOSE 8080
VOLUME /data
ENTRYPOINT ["/drover"]
CMD ["serve"]
