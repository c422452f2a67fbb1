#!/usr/bin/env bash
# Fails (exit 1) when a tracked C++ file differs from what clang-format makes of it
# (.clang-format: Google style, 100 columns), or a Go file from gofmt's, listing each such file.
# Fix with:
#   clang-format -i $(git ls-files '*.cc' '*.h'); gofmt -w $(git ls-files '*.go')
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "check_format: clang-format is not installed (deploy/install-deps.sh --checks)" >&2; exit 1; }
mapfile -t files < <(git ls-files '*.cc' '*.h' 2>/dev/null || find . -path ./build -prune -o \( -name '*.cc' -o -name '*.h' \) -print)
bad=()
for f in "${files[@]}"; do
  if ! clang-format --dry-run --Werror "$f" >/dev/null 2>&1; then bad+=("$f"); fi
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "check_format: ${#bad[@]} file(s) not formatted with clang-format $(clang-format --version | grep -o '[0-9][0-9.]*' | head -1):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  echo "fix with: clang-format -i ${bad[*]}" >&2
  exit 1
fi
# Go: tests/go_client. gofmt comes with golang-go, which --checks installs.
mapfile -t go_files < <(git ls-files '*.go' 2>/dev/null || find . -path ./build -prune -o -name '*.go' -print)
if [ ${#go_files[@]} -gt 0 ]; then
  command -v gofmt >/dev/null || { echo "check_format: gofmt is not installed (deploy/install-deps.sh --checks)" >&2; exit 1; }
  mapfile -t bad_go < <(gofmt -l "${go_files[@]}")
  if [ ${#bad_go[@]} -gt 0 ]; then
    echo "check_format: not formatted with gofmt: ${bad_go[*]}" >&2
    echo "fix with: gofmt -w ${bad_go[*]}" >&2
    exit 1
  fi
fi
echo "check_format: ${#files[@]} C++ and ${#go_files[@]} Go files formatted"
