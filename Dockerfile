# wfjail in a container: a static wfjail next to Debian's Python and a worker's code.
#
#   docker build -t wfjail .
#   docker run --rm wfjail wfjail check -p temporal-python
#
# What a runtime's default profile takes away, and the flags that give it back, are in
# docs/containers.md (`wfjail check` inside the container says the same for that host).

FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
# The target is pinned in .cargo/config.toml (a static binary, no dynamic loader).
RUN cargo build --release --locked \
 && cp target/x86_64-unknown-linux-gnu/release/wfjail /wfjail

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /wfjail /usr/local/bin/wfjail
COPY python /opt/wfjail/python
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir /opt/wfjail/python
ENV PATH=/opt/venv/bin:$PATH
# Run the worker as a user of its own: wfjail needs no privilege (see docs/containers.md).
RUN useradd --create-home worker
USER worker
WORKDIR /home/worker
CMD ["wfjail", "check", "-p", "temporal-python"]
