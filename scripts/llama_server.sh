#!/usr/bin/env bash
# llama.cpp's OpenAI-compatible server (`llama-server`), to serve the local judge's GGUF
# quantized as it is (scripts/served_judge.py). PyPI ships llama.cpp's source inside the
# llama-cpp-python source package: that one file is fetched from its pinned address and its
# SHA-256 checked before it is unpacked (no pip, so no build step of the package runs), and
# only llama.cpp's server is built from it, with CMake, for this machine's CPU (about 20
# minutes on 2 cores), without its web UI (whose prebuilt assets would come from elsewhere).
# The binary is static: nothing is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=var/judges/llama-server
VERSION=0.3.36
URL=https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/llama_cpp_python-$VERSION.tar.gz
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
if [ -x "$DEST" ] && "$DEST" --version > /dev/null 2>&1; then echo "$DEST is built"; exit 0; fi
command -v cmake > /dev/null || { echo "llama-server needs cmake and a C++ compiler" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
curl -fsSL --retry 3 -o "$work/src.tar.gz" "$URL"
echo "$SHA256  $work/src.tar.gz" | sha256sum -c --status || { echo "the source's SHA-256 is not $SHA256" >&2; exit 1; }
tar -xzf "$work/src.tar.gz" -C "$work"
cmake -S "$work/llama_cpp_python-$VERSION/vendor/llama.cpp" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF > "$work/cmake.log" 2>&1 || { tail -30 "$work/cmake.log" >&2; exit 1; }
cmake --build "$work/build" --target llama-server -j "$(nproc)" > "$work/build.log" 2>&1 || { tail -30 "$work/build.log" >&2; exit 1; }
# Checked before it takes the place of a working one.
"$work/build/bin/llama-server" --version 2>&1 | head -2
mkdir -p "$(dirname "$DEST")"
cp "$work/build/bin/llama-server" "$DEST.tmp" && mv "$DEST.tmp" "$DEST"
echo "built $DEST"
