#!/usr/bin/env bash
# Installs every Debian package that troupe's build, tests and `make run` need.
# Non-interactive and idempotent: packages already present are left as they are.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  ccache                     # the Python package's build reuses the main build's objects (tests)
  libcaf-dev                 # CAF 0.17.6: actors, deterministic scheduler, middleman
  libssl-dev                 # TLS between processes (CAF's OpenSSL module) and `troupe certs`
  capnproto libcapnp-dev     # wire schemas
  libtomlplusplus-dev        # topology files
  libcli11-dev               # the troupe CLI
  libspdlog-dev libfmt-dev   # logging
  nlohmann-json3-dev         # JSON reports
  libxxhash-dev              # block hashes
  zlib1g-dev                 # tokenizer: tokenizer.json.gz
  libopenblas-dev            # kernels: the CPU model's GEMMs
  libboost-dev               # the HTTP entrypoint: Boost.Beast and Boost.Asio (headers)
  libfabric-dev libfabric1   # the fabric link between processes (shm / tcp providers)
  libnl-route-3-dev          # troupe launch's link slowdowns (traffic control over rtnetlink)
  doctest-dev                # tests
  libboost-context-dev       # tests: the SIMT emulator's fibers (tests/cuda_host/simt.hpp)
  iproute2 curl              # tests: troupe launch across network-namespace hosts
  python3 python3-venv       # tests/python: the official OpenAI / Anthropic SDKs in a venv
  python3-dev                # the Python package's extension module (pip install ., docs/python.md)
  chromium fonts-liberation  # the browser test renders report.html headless (fonts: its text)
  slurmctld slurmd slurm-client munge  # tests/cluster/slurm: `troupe slurm`'s job on a real Slurm
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
