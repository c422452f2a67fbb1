#!/usr/bin/env bash
# clang's thread-safety analysis (-Wthread-safety, -Werror) over every translation unit of
# common/, coordinator/, client/ and worker/, so the Abseil lock annotations (ABSL_GUARDED_BY,
# ABSL_EXCLUSIVE_LOCKS_REQUIRED, ...) are checked: GCC ignores them. Syntax only (no code is
# generated), reading the compile commands and generated headers of an existing build. Most
# libraries are unity builds, so their compile commands name the build's unity_*.cxx files;
# those are checked as they are (libtorch's and gRPC's headers parsed once per batch, not once
# per file), and every .cc of those four folders must be in one of them or in a command of its
# own, so nothing is missed. A unit none of whose files (nor their own headers) names a mutex or
# a lock annotation has nothing for the analysis to check and is not parsed again: a function
# that requires a lock is its class's own (private), and calling one from elsewhere means
# naming the mutex. That leaves out half of the units, libtorch's heaviest among them.
#   tests/run_clang_checks.sh [BUILD_DIR]     (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
db="$build/compile_commands.json"
[ -f "$db" ] || { echo "run_clang_checks: no $db; build first (tests/run.sh)" >&2; exit 1; }
command -v clang++ >/dev/null || { echo "run_clang_checks: clang++ is not installed (deploy/install-deps.sh --test)" >&2; exit 1; }
python3 - "$db" <<'PY'
import json, os, re, shlex, subprocess, sys
from concurrent.futures import ThreadPoolExecutor
db = json.load(open(sys.argv[1]))
root = os.getcwd()
units = []
checked = ("common/", "coordinator/", "client/", "worker/")
covered = set()  # the .cc files the units check
lockless = 0  # units left out: no mutex or annotation in their files or their own headers
locks = re.compile(r"Mutex|CondVar|ABSL_[A-Z_]*(GUARDED|LOCK|ACQUIRE|RELEASE|THREAD_SAFETY)")
def uses_locks(sources):
    for f in sources:
        for name in (f, f[:-3] + ".h"):
            if os.path.exists(name) and locks.search(open(name).read()):
                return True
    return False
for entry in db:
    path = os.path.relpath(entry["file"], root)
    if os.path.basename(path).startswith("unity_") and path.endswith(".cxx"):
        # CMake's unity source: one '#include "<absolute path>"' per file of the batch.
        sources = [os.path.relpath(f, root) for f in
                   re.findall(r'#include "([^"]+)"', open(entry["file"]).read())]
        if not sources or not all(f.startswith(checked) for f in sources):
            continue
        covered.update(sources)
    elif path.startswith(checked) and path.endswith(".cc"):
        covered.add(path)
        sources = [path]
    else:
        continue
    if not uses_locks(sources):
        lockless += 1
        continue
    args = shlex.split(entry["command"])[1:]
    # Keep includes, defines and the language level; drop output, optimization and GCC's flags.
    fixed = []
    it = iter(args)
    for a in it:
        if a == "-isystem":
            fixed += [a, next(it)]
        elif a.startswith(("-I", "-D", "-std=")):
            fixed.append(a)
    units.append((path, entry["directory"], fixed))
every = sorted(os.path.relpath(os.path.join(d, f), root)
               for folder in checked for d, _, files in os.walk(os.path.join(root, folder))
               for f in files if f.endswith(".cc"))
missing = [f for f in every if f not in covered]
if missing:
    sys.stderr.write("run_clang_checks: files in no compile command (reconfigure?): "
                     + " ".join(missing) + "\n")
    sys.exit(1)
flags = ["-fsyntax-only", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wthread-safety",
         "-Wthread-safety-beta", "-Werror"]
def check(unit):
    path, directory, args = unit
    r = subprocess.run(["clang++"] + flags + args + [os.path.join(root, path)], cwd=directory,
                       capture_output=True, text=True)
    return path, r.returncode, r.stderr
failed = 0
with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
    for path, code, err in pool.map(check, units):
        if code != 0:
            failed += 1
            sys.stderr.write(err)
print(f"run_clang_checks: {len(units)} translation units with locks of the {len(every)} .cc "
      f"files of {', '.join(checked)} (unity batches among them; {lockless} units without "
      f"locks left out), {failed} with findings")
sys.exit(1 if failed else 0)
PY
