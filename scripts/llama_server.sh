#!/usr/bin/env bash
# llama.cpp's OpenAI-compatible server (`llama-server`), to serve the local judge's GGUF
# quantized as it is (scripts/served_judge.py). PyPI ships llama.cpp's source inside the
# llama-cpp-python source package: it is downloaded (pinned, its SHA-256 checked before
# anything in it runs), and only llama.cpp's server is built from it, with CMake, for this
# machine's CPU (about 15-25 minutes on 2 cores). The binary is static: nothing is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=var/judges/llama-server
VERSION=0.3.36
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
if [ -x "$DEST" ]; then echo "$DEST is built"; exit 0; fi
command -v cmake > /dev/null || { echo "llama-server needs cmake and a C++ compiler" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "llama-cpp-python==$VERSION --hash=sha256:$SHA256" > "$work/requirements.txt"
# --require-hashes: pip checks the archive before it reads anything in it.
.venv/bin/pip download -q --no-deps --no-binary=:all: --require-hashes -r "$work/requirements.txt" -d "$work/src"
tar -xzf "$work/src/llama_cpp_python-$VERSION.tar.gz" -C "$work"
cmake -S "$work/llama_cpp_python-$VERSION/vendor/llama.cpp" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON > "$work/cmake.log"
cmake --build "$work/build" --target llama-server -j "$(nproc)" > "$work/build.log" || { tail -30 "$work/build.log" >&2; exit 1; }
mkdir -p "$(dirname "$DEST")"
cp "$work/build/bin/llama-server" "$DEST.tmp" && mv "$DEST.tmp" "$DEST"
"$DEST" --version 2>&1 | head -2
echo "built $DEST"
