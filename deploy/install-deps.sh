#!/usr/bin/env bash
# Installs what dtrain needs from Debian's packages; idempotent and non-interactive.
#   deploy/install-deps.sh          build dependencies
#   deploy/install-deps.sh --test   also what the tests use
#   deploy/install-deps.sh --checks build dependencies and clang-format (tests/run.sh installs
#                                   these first, and the rest of --test while it builds)
#   deploy/install-deps.sh --bench  also the benchmark peers (python3-torch, torchvision, TurboJPEG)
#   deploy/install-deps.sh --fuzz   also clang with libFuzzer (tests/fuzz/run.sh)
set -euo pipefail
packages=(cmake ninja-build g++ pkg-config libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev
          protobuf-compiler libabsl-dev libgtest-dev libgmock-dev libtorch-dev libgloo-dev zlib1g-dev libyaml-cpp-dev
          libsqlite3-dev libcpp-httplib-dev libarchive-dev libcurl4-openssl-dev libjpeg62-turbo-dev
          libpng-dev libwebp-dev libdeflate-dev libjs-chart.js libopenblas0-openmp libjemalloc-dev
          dataset-fashion-mnist
          python3 python3-grpcio python3-protobuf python3-yaml python3-numpy)
# libopenblas0-openmp: libtorch's linear layers call whichever BLAS Debian's alternatives pick,
# and without it that is the reference BLAS, which halved the CNN's training speed (the OpenMP
# build follows libtorch's thread count). libjemalloc-dev: the worker's malloc
# (worker/runtime/worker_allocator.h).
# libjpeg62-turbo-dev (jpeglib.h: libjpeg-turbo's crop and skip calls), libpng-dev, libwebp-dev,
# libdeflate-dev (a plain PNG inflated whole):
# worker/data/image_decode. python3-torchvision (--test, --bench): the reference the image
# transforms are checked against, and the bench's comparison; libturbojpeg0-dev (--bench): the
# decode ceiling in bench/data.sh.
# The Python package's own needs are above (python/dtrain: grpcio, protobuf, PyYAML, numpy).
# The test command's checks (formatting, clang's thread-safety analysis), pytest, and Python's
# torch, which writes the data files and checkpoints the interoperability tests read and check;
# torchvision and PIL, which make the ImageFolder that dtrain.data.write_shards is tested with;
# chromium, its driver and selenium for the dashboard's browser test; iproute2 (ip, tc) for the
# network-namespace tests and openssl for the TLS tests' certificates; nginx serves shards over
# HTTP to the HTTP fetcher's test (worker/data/http_shard_fetcher.h). libjs-chart.js (above) is
# the dashboard's chart library, embedded in the coordinator at build time.
# Go, grpc-go and the protoc plugins build tests/go_client, a Go user's client of the public API,
# at build time (so --checks installs them too).
go_client=(golang-go golang-google-grpc-dev golang-google-protobuf-dev
           golang-github-golang-protobuf-1-5-dev protoc-gen-go protoc-gen-go-grpc)
if [ "${1:-}" = "--checks" ]; then packages+=(clang-format "${go_client[@]}"); fi
if [ "${1:-}" = "--test" ]; then
  packages+=(clang-format "${go_client[@]}" clang python3-pytest python3-torch python3-torchvision
             python3-pil
             chromium chromium-driver python3-selenium iproute2 openssl nginx)
fi
if [ "${1:-}" = "--bench" ]; then
  packages+=(python3 python3-torch python3-torchvision libturbojpeg0-dev)
fi
if [ "${1:-}" = "--fuzz" ]; then packages+=(clang); fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
echo "installing: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
