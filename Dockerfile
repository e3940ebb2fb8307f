# tiergate container image: the binary, the bundled model, policies and configs, and the ONNX
# Runtime library baked in, so the running container downloads nothing.
#
#   docker build -t tiergate:0.1.0 .
#   docker run --rm -p 8080:8080 tiergate:0.1.0
#
# Needs BuildKit (the default builder since Docker 23) for the cache mounts. The build stages
# reach crates.io (cargo), PyPI (pip) and the Debian/Docker Hub base images; nothing else.
# Layout in the image (relative paths in the configs resolve against /opt/tiergate/config):
#   /usr/local/bin/tiergate
#   /usr/local/lib/tiergate/libonnxruntime.so.<ORT_VERSION>   (ORT_DYLIB_PATH)
#   /opt/tiergate/{config,models,policies}
# See docs/deploy.md.

ARG RUST_VERSION=1.95
# Must match src/ort_lib.rs (ORT_VERSION): the `ort` crate is built against this release's API.
ARG ORT_VERSION=1.32.0

# --- ONNX Runtime: the shared library from the PyPI wheel ------------------------------------
FROM python:3.11-slim-bookworm AS ort
ARG ORT_VERSION
ARG TARGETARCH
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# sha256 of libonnxruntime.so.1.32.0 in the manylinux x86_64 wheel (checked on amd64 builds;
# update it with ORT_VERSION). Other architectures are extracted unchecked.
ARG ORT_LIB_SHA256_AMD64=6c1585d1bbf45b0712ea4a21b705c5fcb4ba04ff2e30f1fbf81a49faf658638f
RUN python3 -m pip download --no-cache-dir --no-deps --only-binary=:all: \
        "onnxruntime==${ORT_VERSION}" -d /tmp/wheel \
 && mkdir /out \
 && python3 -c "import glob, zipfile; \
z = zipfile.ZipFile(glob.glob('/tmp/wheel/onnxruntime-*.whl')[0]); \
open('/out/libonnxruntime.so.${ORT_VERSION}', 'wb').write(z.read('onnxruntime/capi/libonnxruntime.so.${ORT_VERSION}'))" \
 && if [ "${TARGETARCH}" = "amd64" ] && [ "${ORT_VERSION}" = "1.32.0" ]; then \
        echo "${ORT_LIB_SHA256_AMD64}  /out/libonnxruntime.so.${ORT_VERSION}" | sha256sum -c -; \
    fi \
 && rm -rf /tmp/wheel

# --- the tiergate binary ---------------------------------------------------------------------
FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
# benches/ holds targets declared in Cargo.toml ([[bench]]): copied so every declared target exists.
COPY benches ./benches
COPY src ./src
# The release profile keeps line tables for panic backtraces; compressing them takes the binary
# from about 85 MB to 33 MB and backtraces still show file:line.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin tiergate \
 && objcopy --compress-debug-sections=zlib target/release/tiergate /usr/local/bin/tiergate

# --- runtime ---------------------------------------------------------------------------------
# Same Debian release as the builder (glibc); libstdc++ (needed by ONNX Runtime) is in the slim
# image already. No CA certificates: tiergate talks plain http to its upstreams.
FROM debian:bookworm-slim
ARG ORT_VERSION
COPY --from=ort /out/libonnxruntime.so.${ORT_VERSION} /usr/local/lib/tiergate/
COPY --from=build /usr/local/bin/tiergate /usr/local/bin/tiergate
COPY models /opt/tiergate/models
COPY policies /opt/tiergate/policies
COPY config /opt/tiergate/config
ENV ORT_DYLIB_PATH=/usr/local/lib/tiergate/libonnxruntime.so.${ORT_VERSION} \
    TIERGATE_LISTEN=0.0.0.0:8080 \
    RUST_LOG=info
WORKDIR /opt/tiergate
# tiergate writes nothing at run time (unless [shadow] log is set): any non-root user and a
# read-only root filesystem will do.
USER 65532:65532
# 8080: public (proxy, /v1/classify, /healthz, /readyz, /metrics). 9090: admin, on 127.0.0.1
# unless TIERGATE_ADMIN_LISTEN says otherwise (set a token with TIERGATE_ADMIN_TOKEN then).
EXPOSE 8080 9090
# SIGTERM (docker stop's default) drains in-flight requests for server.shutdown_grace_ms (10 s):
# give `docker stop` a longer timeout (-t 15) than that.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/tiergate"]
CMD ["serve", "--config", "/opt/tiergate/config/tiergate.toml"]
