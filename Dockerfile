# Two stages: build a static-enough binary, ship it on a distroless base with no shell.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock rustfmt.toml ./
COPY api ./api
COPY cel ./cel
COPY engine ./engine
COPY operator ./operator
COPY cni ./cni
COPY tests ./tests
COPY crds ./crds
# A container build has no .git: pass the revision for `gatehouse --version`.
ARG GATEHOUSE_REVISION=unknown
ENV GATEHOUSE_REVISION=${GATEHOUSE_REVISION}
RUN cargo build --release --locked -p gatehouse --bin gatehouse -p gatehouse-ipam --bin gatehouse-ipam

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/gatehouse /usr/local/bin/gatehouse
# The node's CNI plugin, which config/cni's DaemonSet copies onto each node.
COPY --from=build /src/target/release/gatehouse-ipam /usr/local/bin/gatehouse-ipam
USER 65532:65532
EXPOSE 8443 8080
ENTRYPOINT ["/usr/local/bin/gatehouse"]
CMD ["run"]
