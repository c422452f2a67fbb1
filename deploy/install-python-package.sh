#!/usr/bin/env bash
# Makes `import dtrain` work in Debian's python3 for this user: a .pth file in the user's
# site-packages pointing at build/python (the package with its generated stubs). Idempotent;
# needs no root. Run after the build (deploy/local/demo.sh and tests/run.sh do).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
package="$root/build/python"
[ -f "$package/dtrain/v1/jobs_pb2.py" ] || { echo "build first: $package has no stubs" >&2; exit 1; }
site=$(/usr/bin/python3 -c 'import site; print(site.getusersitepackages())')
mkdir -p "$site"
echo "$package" > "$site/dtrain.pth"
/usr/bin/python3 -c 'import dtrain' || { echo "python3 cannot import dtrain from $package" >&2; exit 1; }
