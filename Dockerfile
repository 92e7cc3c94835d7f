# wfjail in a container: the wfjail wheel (the static binary, the Python package and its
# Temporal runner) in a venv of Debian's Python, next to a worker's code.
#
#   docker build -t wfjail .
#   docker run --rm wfjail wfjail check -p temporal-python
#
# What a runtime's default profile takes away, and the flags that give it back, are in
# docs/containers.md (`wfjail check` inside the container says the same for that host).

FROM rust:1-bookworm AS build
# The build's target (.cargo/config.toml): a static musl binary; the image has only glibc's.
RUN rustup target add x86_64-unknown-linux-musl
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3-venv \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/maturin \
 && /opt/maturin/bin/pip install --no-cache-dir maturin==1.16.0
WORKDIR /src
COPY . .
# pyproject.toml: maturin's bin bindings put the release binary (a static one: the target is
# pinned in .cargo/config.toml) and python/wfjail into one wheel.
RUN /opt/maturin/bin/maturin build --release --locked --out /wheels

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /wheels /wheels
# The binary lands in /opt/venv/bin next to the venv's python, where the runner finds it.
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir "$(echo /wheels/wfjail-*.whl)[temporal]" \
 && rm -rf /wheels
ENV PATH=/opt/venv/bin:$PATH
# Run the worker as a user of its own: wfjail needs no privilege (see docs/containers.md).
RUN useradd --create-home worker
USER worker
WORKDIR /home/worker
CMD ["wfjail", "check", "-p", "temporal-python"]
