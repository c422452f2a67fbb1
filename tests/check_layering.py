#!/usr/bin/env python3
"""The worker's layering, checked: each folder of worker/ states in its CMakeLists.txt what its
library must not depend on, and this reads those rules and every #include of the folder's files.

Rules, as comment paragraphs of worker/<folder>/CMakeLists.txt (a paragraph continues on lines
that start with '#   '):
  # Must not depend on: worker/strategies/, worker/runtime/, libtorch
      no file of the folder includes a header of those folders (or, for libtorch, any torch,
      ATen, c10 or caffe2 header, directly or through the project's headers), and the folder's
      CMakeLists.txt links none of their libraries;
  # Must not call: PluginRegistry::Global
      no file of the folder calls it;
  # Without libtorch: idx_file.h idx_file.cc
      these files reach no libtorch header, directly or through the project's headers.
Every folder must state the first rule, every worker file must live in a folder (main.cc and
CMakeLists.txt aside), and the folders' includes must form no cycle. Exit status 1 names each
breach: the file, the line, what it includes or calls and the rule it breaks.

  tests/check_layering.py [REPO_ROOT]      (default: this script's repository)
"""
import os
import re
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                       os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
WORKER = os.path.join(ROOT, "worker")
SOURCES = (".h", ".cc", ".inc")
TORCH = re.compile(r"#\s*include\s*<(torch|ATen|c10|caffe2)/")
LOCAL = re.compile(r'#\s*include\s*"([^"]+)"')
LIBRARY = re.compile(r"\b(?:add_library|dtrain_worker_library)\(\s*([A-Za-z0-9_]+)")

errors = []


def rel(path):
    return os.path.relpath(path, ROOT)


def paragraphs(cmake):
    """{rule name: text} from a CMakeLists.txt's comment paragraphs."""
    rules, current = {}, None
    for line in open(cmake, encoding="utf-8"):
        line = line.rstrip("\n")
        m = re.match(r"#\s*(Must not depend on|Must not call|Without libtorch):(.*)", line)
        if m:
            current = m.group(1)
            rules[current] = rules.get(current, "") + " " + m.group(2)
        elif current and line.startswith("#   "):
            rules[current] += " " + line[1:]
        else:
            current = None
    return rules


def includes(path):
    """(line number, text of the #include line) of a file."""
    out = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if re.match(r"\s*#\s*include", line):
                out.append((number, line.strip()))
    return out


torch_cache = {}


def torch_chain(path, seen=None):
    """The include chain from `path` to a libtorch header, or None."""
    if path in torch_cache:
        return torch_cache[path]
    seen = seen if seen is not None else set()
    if path in seen:
        return None
    seen.add(path)
    found = None
    for number, line in includes(path):
        if TORCH.search(line):
            found = [f"{rel(path)}:{number} {line}"]
            break
        m = LOCAL.search(line)
        if m:
            target = os.path.join(ROOT, m.group(1))
            if not os.path.isfile(target):
                target = os.path.join(os.path.dirname(path), m.group(1))
            if os.path.isfile(target):
                chain = torch_chain(target, seen)
                if chain:
                    found = [f"{rel(path)}:{number} {line}"] + chain
                    break
    torch_cache[path] = found
    return found


folders = sorted(d for d in os.listdir(WORKER) if os.path.isdir(os.path.join(WORKER, d)))
for name in os.listdir(WORKER):
    if os.path.isfile(os.path.join(WORKER, name)) and name not in ("main.cc", "CMakeLists.txt"):
        errors.append(f"worker/{name}: a worker file belongs in the folder of its concern "
                      f"({', '.join(folders)})")

rules, libraries, files = {}, {}, {}
for folder in folders:
    cmake = os.path.join(WORKER, folder, "CMakeLists.txt")
    if not os.path.isfile(cmake):
        errors.append(f"worker/{folder}/: no CMakeLists.txt saying what it must not depend on")
        continue
    rules[folder] = paragraphs(cmake)
    if "Must not depend on" not in rules[folder]:
        errors.append(f"{rel(cmake)}: no '# Must not depend on:' line")
    libraries[folder] = LIBRARY.findall(open(cmake, encoding="utf-8").read())
    files[folder] = sorted(os.path.join(WORKER, folder, f)
                           for f in os.listdir(os.path.join(WORKER, folder)) if f.endswith(SOURCES))

edges = {folder: set() for folder in folders}
checked = 0
for folder in folders:
    text = rules.get(folder, {})
    forbidden = set(re.findall(r"worker/([a-z_0-9]+)/", text.get("Must not depend on", "")))
    for other in forbidden - set(folders):
        errors.append(f"worker/{folder}/CMakeLists.txt: names worker/{other}/, which does not exist")
    no_torch = re.search(r"\blibtorch\b", text.get("Must not depend on", "")) is not None
    calls = text.get("Must not call", "").replace(",", " ").split()
    cmake = os.path.join(WORKER, folder, "CMakeLists.txt")
    for path in files.get(folder, []):
        for number, line in includes(path):
            checked += 1
            m = re.search(r'#\s*include\s*"worker/([^"]+)"', line)
            if not m:
                continue
            target = m.group(1)
            if "/" not in target:
                errors.append(f"{rel(path)}:{number}: {line}: worker/{target} is in no folder")
                continue
            other = target.split("/", 1)[0]
            if other != folder:
                edges[folder].add(other)
            if other in forbidden:
                errors.append(f"{rel(path)}:{number}: {line}: worker/{folder}/ must not depend "
                              f"on worker/{other}/ ({rel(cmake)})")
        if no_torch:
            chain = torch_chain(path)
            if chain:
                errors.append(f"{rel(path)}: reaches libtorch, which worker/{folder}/ must not "
                              f"depend on ({rel(cmake)}): " + " -> ".join(chain))
        if calls:
            with open(path, encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    if line.lstrip().startswith("//"):
                        continue
                    for call in calls:
                        if re.search(re.escape(call) + r"\s*\(", line):
                            errors.append(f"{rel(path)}:{number}: calls {call}, which "
                                          f"worker/{folder}/ must not ({rel(cmake)})")
    # Its libraries link none of a forbidden folder's.
    links = " ".join(re.findall(r"target_link_libraries\(([^)]*)\)",
                                open(cmake, encoding="utf-8").read()) if os.path.isfile(cmake)
                     else [])
    for other in forbidden:
        for library in libraries.get(other, []):
            if re.search(r"\b" + re.escape(library) + r"\b", links):
                errors.append(f"{rel(cmake)}: links {library} (worker/{other}/), which "
                              f"worker/{folder}/ must not depend on")
    for name in text.get("Without libtorch", "").split():
        path = os.path.join(WORKER, folder, name)
        if not os.path.isfile(path):
            errors.append(f"{rel(cmake)}: 'Without libtorch' names {name}, which is not there")
            continue
        chain = torch_chain(path)
        if chain:
            errors.append(f"{rel(path)}: reaches libtorch, and {rel(cmake)} says it is without "
                          "libtorch: " + " -> ".join(chain))

# The top folder's own rule (worker/CMakeLists.txt: main.cc without libtorch).
top = paragraphs(os.path.join(WORKER, "CMakeLists.txt"))
for name in top.get("Without libtorch", "").split():
    chain = torch_chain(os.path.join(WORKER, name))
    if chain:
        errors.append(f"worker/{name}: reaches libtorch, and worker/CMakeLists.txt says it is "
                      "without libtorch: " + " -> ".join(chain))

# No cycle among the folders, whatever the rules allow.
state = {}


def visit(folder, path):
    state[folder] = "open"
    for other in sorted(edges.get(folder, ())):
        if state.get(other) == "open":
            if not any("in a cycle" in e for e in errors):  # the first one says enough
                cycle = path[path.index(other):] + [other]
                errors.append("the worker's folders include each other in a cycle: " +
                              " -> ".join(f"worker/{f}/" for f in cycle))
        elif other not in state:
            visit(other, path + [other])
    state[folder] = "done"


for folder in folders:
    if folder not in state:
        visit(folder, [folder])

if errors:
    for e in errors:
        print("check_layering: " + e, file=sys.stderr)
    sys.exit(1)
print(f"check_layering: {sum(len(f) for f in files.values())} files in {len(folders)} folders of "
      f"worker/, {checked} includes, every rule kept")
