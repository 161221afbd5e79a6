#!/usr/bin/env bash
# `make gpu-wheels`: what `make gpu-check` carries to an offline GPU machine whose Python lacks
# gpufeed's small dependencies, into .whl/ (ignored by git; about 1 MB):
#   - lmdb, cachetools and zlib-ng wheels for CPython 3.12 manylinux x86_64 (the device's Python);
#   - a PyTurboJPEG 1.8 wheel, built here from its sdist (PyPI has no 1.8 wheel; it is pure Python);
#   - Debian's libturbojpeg0 .deb, the library PyTurboJPEG loads (gpu_check.sh unpacks it into a
#     private folder; without it the device decodes with OpenCV).
# Needs pip that reaches PyPI and, for the .deb, apt-get on an amd64 Debian/Ubuntu.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
DEST=.whl
# One version of each (two would stop the install); pyproject.toml's ranges allow these.
BINARY_WHEELS=("lmdb==3.0.0" "cachetools==8.0.2" "zlib-ng==1.1.0")
SDIST_WHEELS=("PyTurboJPEG==1.8.3")
DEB=libturbojpeg0

mkdir -p "$DEST"
rm -f "$DEST"/lmdb-*.whl "$DEST"/cachetools-*.whl "$DEST"/zlib_ng-*.whl "$DEST"/[Pp]y[Tt]urbo[Jj][Pp][Ee][Gg]-*.whl "$DEST"/libturbojpeg0*.deb
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d "$DEST" "${BINARY_WHEELS[@]}"
"$PYTHON" -m pip wheel -q --no-deps --no-binary=PyTurboJPEG -w "$DEST" "${SDIST_WHEELS[@]}"

if ! command -v apt-get >/dev/null || [ "$(dpkg --print-architecture 2>/dev/null)" != amd64 ]; then
  echo "note: no apt-get for amd64 here: $DEB not fetched; the GPU machine will decode with OpenCV"
else
  # apt-get download writes as the _apt user where it can; a root-owned folder makes it warn.
  (cd "$DEST" && apt-get download -q "$DEB" 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
  for f in "$DEST"/"$DEB"_*.deb; do  # '1%3a2.1.5-2' -> '2.1.5-2': a plain file name
    [ -e "$f" ] && mv "$f" "$DEST/${DEB}_$(dpkg-deb -f "$f" Version | sed 's/^[0-9]*://')_amd64.deb"
  done
  ls "$DEST"/"$DEB"_*.deb >/dev/null 2>&1 \
    || echo "note: apt-get download $DEB failed (run apt-get update?); the GPU machine will decode with OpenCV"
fi
echo "gpu-wheels: $DEST/ holds $(ls "$DEST" | tr '\n' ' ')($(du -sh "$DEST" | cut -f1)); carry it: run(carry=[\"$DEST\"])"
