#!/usr/bin/env python3
"""Fails (exit 1) when README.md or docs/*.md names something the repository does not have.

Checked, each dangling reference printed as file:line (rules: docs/CONTRIBUTING.md):
- repo paths: `coordinator/jobs/trainer.cc`, `worker/`, `deploy/local/demo.sh`, bare paths that
  start with a top-level folder (in prose and code blocks), link targets, `job_spec.cc`. A path
  resolves against the repo root, against docs/, as a module stem (`client/spec_uploads` for
  spec_uploads.cc) or, when it starts below the top level (`local/cluster.sh`), as the tail of a
  tracked path. `build/<dir>/<name>` is a build output: <dir> must be a source folder and <name>
  a word of some CMakeLists.txt (a target or output name).
- code symbols in backticks: CamelCase (`MakeSetupRequest`, `JobsClient::Submit`), kConstants,
  snake_case and UPPER_CASE names (`worker_registry_test`, `dtrain_jobs`, `DTRAIN_TOKEN`), each
  part of a dotted or qualified name, and flags (`--cpus`, `--trainer.max_epochs=5`): each must
  be a word of a tracked file that is not Markdown.
- ports: a port in an address (`127.0.0.1:29610`) or after "port" must be a word of a tracked
  file that is not Markdown, so a doc cannot claim a port the code and configs never use.
- docs/DECISIONS.md is the index of docs/decisions/<area>.md: every decision's bold title is
  listed there, linked to its file, and nothing else is. The decisions themselves are history
  and are not checked for names (docs/decisions/pending-*.md are ignored).
Deliberate exceptions go in tests/docs_allowlist.txt, one name per line with "# reason"; an entry
no doc needs any more is an error too.

  tests/check_docs.py              check this repository (under a second)
  tests/check_docs.py --self-test  check that the checker finds planted errors
"""
import os
import re
import subprocess
import sys
import tempfile

SOURCE_EXTENSIONS = ('.cc', '.h', '.inc', '.proto', '.py', '.sh', '.cmake', '.md', '.js', '.html',
                     '.css', '.flags', '.service', '.sbatch', '.supp')
# First parts of dotted names that belong to other projects (torch.save, self.log, nn.Module).
EXTERNAL_PREFIXES = {'torch', 'self', 'nn', 'np', 'numpy', 'pickle', 'pl', 'lightning', 'os',
                     'sys', 'std', 'grpc', 'grpcio'}


def tracked_files(root):
    """The repository's files: git's, with new files not yet added (not ignored ones)."""
    try:
        out = subprocess.run(['git', '-C', root, 'ls-files', '-z', '--cached', '--others',
                              '--exclude-standard'], check=True,
                             capture_output=True).stdout.decode()
        files = [f for f in out.split('\0') if f]
        if files:
            return files
    except (OSError, subprocess.CalledProcessError):
        pass
    files = []
    for d, subdirs, names in os.walk(root):
        rel = os.path.relpath(d, root)
        subdirs[:] = [s for s in subdirs if not s.startswith(('.git', 'build'))]
        files += [os.path.normpath(os.path.join(rel, n)) for n in names]
    return files


class Repo:
    def __init__(self, root):
        self.root = root
        self.files = [f for f in tracked_files(root) if os.path.exists(os.path.join(root, f))]
        self.paths = set(self.files)
        self.dirs = set()
        for f in self.files:
            parts = f.split('/')
            for i in range(1, len(parts)):
                self.dirs.add('/'.join(parts[:i]))
        self.top = {f.split('/')[0] for f in self.files}
        self.basenames = {f.rsplit('/', 1)[-1] for f in self.files}
        self.words = set()
        self.cmake_words = set()
        self.messages = {}
        for f in self.files:
            # Docs do not vouch for docs, nor this checker and its allowlist for anything.
            if f.endswith('.md') or f in ('tests/check_docs.py', 'tests/docs_allowlist.txt'):
                continue
            with open(os.path.join(root, f), 'rb') as fh:
                text = fh.read().decode('utf-8', 'ignore')
            found = set(re.findall(r'[A-Za-z0-9_]+(?:[-.][A-Za-z0-9_]+)*', text))
            # Every sub-word too: `trainer.max_epochs` yields trainer, max_epochs.
            for w in list(found):
                found.update(re.split(r'[-.]', w))
            self.words |= found
            if f.rsplit('/', 1)[-1] == 'CMakeLists.txt':
                self.cmake_words |= found
            if f.endswith('.proto'):
                self.read_messages(text)

    def read_messages(self, text):
        """Protobuf messages by name: field name -> type name (map<..> for maps)."""
        text = re.sub(r'//[^\n]*', '', text)
        for m in re.finditer(r'\bmessage\s+(\w+)\s*\{', text):
            depth, i, fields = 1, m.end(), {}
            start = i
            while depth and i < len(text):
                depth += {'{': 1, '}': -1}.get(text[i], 0)
                i += 1
            body = text[start:i]
            # Only this message's own fields: blank out nested messages and enums.
            flat = re.sub(r'\b(message|enum|oneof)\s+\w+\s*\{[^{}]*\}', ' ', body)
            for f in re.finditer(r'(?:^|[;{}])\s*(?:optional\s+|repeated\s+)?'
                                 r'(map\s*<[^>]*>|[\w.]+)\s+(\w+)\s*=\s*\d+', flat):
                fields[f.group(2)] = f.group(1)
            # Fields of a oneof belong to the message too.
            for o in re.finditer(r'\boneof\s+\w+\s*\{([^{}]*)\}', body):
                for f in re.finditer(r'([\w.]+)\s+(\w+)\s*=\s*\d+', o.group(1)):
                    fields[f.group(2)] = f.group(1)
            self.messages.setdefault(m.group(1), {}).update(fields)

    def spec_key_error(self, key):
        """Why `key` (trainer.max_epochs) is no job spec key, or None. Only for keys whose first
        part is a section of JobSpec; a key the code itself names (a renamed key it refuses with
        a hint) passes."""
        parts = key.split('.')
        spec = self.messages.get('JobSpec', {})
        if len(parts) < 2 or spec.get(parts[0]) not in self.messages or key in self.words:
            return None
        message = 'JobSpec'
        for i, part in enumerate(parts):
            fields = self.messages.get(message, {})
            if part not in fields:
                return f'{message} has no field `{part}`'
            kind = fields[part].split('.')[-1]
            if kind.startswith('map'):
                return None
            if kind not in self.messages:
                return None if i == len(parts) - 1 else f'`{part}` is not a section'
            message = kind
        return None

    def has_path(self, p):
        p = p.rstrip('/')
        return p == '' or p in self.paths or p in self.dirs

    def has_stem(self, p):
        return any(f.startswith(p + '.') and '/' not in f[len(p):] for f in self.files)

    def has_tail(self, p):
        p = p.rstrip('/')
        return any(x == p or x.endswith('/' + p) for x in self.paths | self.dirs)


class Checker:
    def __init__(self, repo, allowlist):
        self.repo = repo
        self.allow = allowlist  # name -> [line, used]
        self.errors = []

    def error(self, where, message, name=None):
        if name is not None and name in self.allow:
            self.allow[name][1] = True
            return
        self.errors.append(f'{where}: {message}')

    # --- paths ---------------------------------------------------------------------------------
    def check_path(self, where, p, doc_dir, relative_ok=False):
        p = re.sub(r'[.,;:)]+$', '', p) if not p.endswith('/') else p
        p = p.split('#', 1)[0]
        if not p or p.startswith('/'):
            return
        repo = self.repo
        first = p.split('/')[0]
        if first == 'build' or (first.startswith('build-') and first in repo.words):
            self.check_build_path(where, p)
            return
        candidates = [p, os.path.normpath(os.path.join(doc_dir, p))]
        if any(repo.has_path(c) or repo.has_stem(c) for c in candidates):
            return
        if (relative_ok or first not in repo.top) and repo.has_tail(p):
            return
        self.error(where, f'`{p}`: no such path in the repository', p)

    def check_build_path(self, where, p):
        parts = [x for x in p.rstrip('/').split('/')[1:] if x]
        if not parts:
            return
        repo = self.repo
        src = '/'.join(parts)
        if repo.has_path(src):  # build/python, build/worker
            return
        src_dir, name = '/'.join(parts[:-1]), parts[-1]
        if (not src_dir or repo.has_path(src_dir)) and name in repo.cmake_words:
            return
        self.error(where, f'`{p}`: not a build output (no source folder {src_dir or "."}/ with a '
                   f'CMake target or output named {name})', p)

    # --- symbols -------------------------------------------------------------------------------
    @staticmethod
    def is_symbol_part(part):
        return bool(re.fullmatch(r'[A-Z][a-z0-9]+[A-Z]\w*|[A-Z][A-Z0-9]*[a-z]\w*[A-Z]\w*'
                                 r'|k[A-Z]\w+|[A-Za-z]\w*_\w*[A-Za-z0-9]', part))

    def check_word(self, where, name, whole):
        if name in self.repo.words:
            return
        self.error(where, f'`{whole}`: `{name}` is not a word of any tracked source file',
                   whole if whole in self.allow else name)

    def check_spec_key(self, where, key, whole):
        """Checks a job spec key such as trainer.max_epochs; False if `key` is no spec key."""
        parts = key.split('.')
        if self.repo.messages.get('JobSpec', {}).get(parts[0]) not in self.repo.messages:
            for part in parts:
                if '_' in part:
                    self.check_word(where, part, whole)
            return False
        why = self.repo.spec_key_error(key)
        if why:
            self.error(where, f'`{whole}`: not a job spec key ({why})', whole)
        return True

    def check_flag(self, where, flag):
        name = flag[2:].split('=', 1)[0]
        if not re.fullmatch(r'[A-Za-z][\w.-]*', name):
            return
        if '.' in name:  # a dotted override: --trainer.max_epochs=5
            self.check_spec_key(where, name, flag)
            return
        if name in self.repo.words or name.replace('-', '_') in self.repo.words:
            return
        self.error(where, f'`{flag}`: flag `--{name}` is not in any tracked source file',
                   flag if flag in self.allow else '--' + name)

    def check_span(self, where, span, doc_dir):
        s = span.strip()
        if not s or '://' in s:
            return
        # One {a,b} group is two names: `dtrain_worker_artifact_cache_{hits,misses}_total`.
        m = re.fullmatch(r'(\w+)\{(\w+(?:,\w+)+)\}(\w+)', s)
        if m:
            for alternative in m.group(2).split(','):
                self.check_span(where, m.group(1) + alternative + m.group(3), doc_dir)
            return
        # A call with arguments: `ProcessGroup::Join(address, options)`, `pg->Reduce(t, op, dst)`.
        m = re.fullmatch(r'([A-Za-z_][\w:.>-]*)\(.*\)', s)
        if m and ' ' in s:
            s = m.group(1)
        words = s.split()
        if len(words) > 1:
            # A command: its program, the repo paths and, for our programs, the flags in it.
            program = words[0]
            if re.fullmatch(r'(build/\S+/)?dtrain(-[\w-]+)?|(deploy|tests|bench)/\S+|--.*', program):
                for w in words:
                    w = w.strip('[]')
                    if w.startswith('--'):
                        self.check_flag(where, w)
            for w in words:
                if re.match(r'[\w.-]+/', w) and self.looks_like_repo_path(w):
                    self.check_path(where, w, doc_dir)
            return
        if s.startswith('--'):
            for flag in s.split('/'):
                if flag.startswith('--'):
                    self.check_flag(where, flag)
            return
        if s.startswith(('-', '/', '~', '.', '<', '#', '@', '"', "'")):
            return
        if '/' in s:
            if self.looks_like_repo_path(s):
                self.check_path(where, s, doc_dir)
            return
        if s.endswith(SOURCE_EXTENSIONS) and re.fullmatch(r'[\w.-]+', s):
            if s not in self.repo.basenames and not self.repo.has_path('docs/' + s):
                self.error(where, f'`{s}`: no tracked file has this name', s)
            return
        # Drop a call's arguments, a metric's labels, a key's value: `Tick(now)`, `x{kind}`, `k=v`.
        name = re.sub(r'(\(.*\)|\{[^{}]*\}|=.*|\.\*|\[\])$', '', s)
        if not re.fullmatch(r'[A-Za-z_]\w*(?:(?:::|\.|->)[A-Za-z_]\w*)*', name):
            return
        parts = re.split(r'::|\.|->', name)
        if parts[0] in EXTERNAL_PREFIXES:
            return
        if re.fullmatch(r'[a-z]\w*(\.[a-z]\w*)+', s) and self.check_spec_key(where, s, s):
            return
        qualified = len(parts) > 1
        for part in parts:
            # In a qualified or dotted name every part counts (`Accelerator::Make`,
            # `trainer.max_epochs`); alone, a plain word (`Strategy`, `auto`) is too common to say
            # anything.
            if self.is_symbol_part(part) or (qualified and len(part) > 1):
                self.check_word(where, part, name)

    def looks_like_repo_path(self, s):
        if re.search(r'[<>*{}$|\[\]=:,()]', s):
            return False
        first = s.split('/')[0]
        return (first in self.repo.top or first == 'build' or first.startswith('build-')
                or s.rstrip('/').endswith(SOURCE_EXTENSIONS + ('.yaml', '.txt')))

    # --- ports ---------------------------------------------------------------------------------
    def check_ports(self, where, text):
        for m in re.finditer(r'(?:(?<![\w.])(?:\d{1,3}(?:\.\d{1,3}){3}|localhost|[A-Za-z][\w.-]*)'
                             r':|\b[Pp]ort\s+)(\d{2,5})\b(?![:\d])', text):
            port = m.group(1)
            if int(port) >= 1024 and port not in self.repo.words:
                self.error(where, f'port {port}: no tracked source or config uses it', port)

    # --- Markdown ------------------------------------------------------------------------------
    def check_markdown(self, rel):
        doc_dir = os.path.dirname(rel)
        with open(os.path.join(self.repo.root, rel), encoding='utf-8') as fh:
            lines = fh.read().split('\n')
        if rel == 'docs/DECISIONS.md':
            # The index's decision titles are history, as the decisions are: blank them here;
            # check_decisions_index holds them to the area files.
            lines = ['' if re.fullmatch(r'- \[.+\]\(decisions/[^)]+\)', x.strip()) else x
                     for x in lines]
        prose = []  # (line number, text) with code blocks blanked
        fence = None
        previous_blank_or_code = True
        for n, line in enumerate(lines, 1):
            where = f'{rel}:{n}'
            stripped = line.lstrip()
            if fence:
                if stripped.startswith(fence):
                    fence = None
                else:
                    self.check_code_line(where, line, doc_dir)
                prose.append('')
                continue
            m = re.match(r'(```+|~~~+)', stripped)
            if m:
                fence = m.group(1)
                prose.append('')
                continue
            if line.startswith(('    ', '\t')) and previous_blank_or_code and stripped:
                self.check_code_line(where, line, doc_dir)
                prose.append('')
                continue
            previous_blank_or_code = not stripped
            prose.append(line)
        text = '\n'.join(prose)
        offsets = [0]
        for line in prose:
            offsets.append(offsets[-1] + len(line) + 1)

        def where_at(pos):
            lo, hi = 0, len(offsets) - 1
            while lo < hi - 1:
                mid = (lo + hi) // 2
                if offsets[mid] <= pos:
                    lo = mid
                else:
                    hi = mid
            return f'{rel}:{lo + 1}'

        # Inline code spans, never across a blank line.
        spans = list(re.finditer(r'(`+)((?:(?!\n\s*\n).)+?)\1', text, re.S))
        for m in spans:
            self.check_span(where_at(m.start()), ' '.join(m.group(2).split()), doc_dir)
        outside = re.sub(r'(`+)((?:(?!\n\s*\n).)+?)\1', lambda m: ' ' * len(m.group(0)), text,
                         flags=re.S)
        for m in re.finditer(r'\]\(([^()\s]+)\)', outside):
            target = m.group(1)
            if not re.match(r'[a-z]+:|#', target):
                self.check_path(where_at(m.start()), target, doc_dir, relative_ok=True)
        outside = re.sub(r'\]\([^()\s]+\)', lambda m: ' ' * len(m.group(0)), outside)
        for m in self.bare_paths(outside):
            self.check_path(where_at(m.start(1)), m.group(1), doc_dir)
        for m in re.finditer(r'(?<![\w/.-])([\w-]+\.(?:cc|h|inc|proto|py|sh))\b(?![/-])', outside):
            if m.group(1) not in self.repo.basenames:
                self.error(where_at(m.start(1)), f'{m.group(1)}: no tracked file has this name',
                           m.group(1))
        # Test names in prose: Suite.Case, Suite.Prefix… (or ...), Suite.*, Suite/Param.
        for m in re.finditer(r'(?<![\w.*])([A-Z]\w*)\.([A-Z]\w*(?:…|\.\.\.)?(?![\w.(])|\*(?!\*))',
                             outside):
            self.check_test_name(where_at(m.start()), m.group(1), m.group(2).replace('...', '…'))
        for m in re.finditer(r'(?<![\w./*])([A-Z]\w*Test)/(?:\w+|\*)', outside):
            self.check_test_name(where_at(m.start()), m.group(1), '*')
        for n, line in enumerate(prose, 1):
            self.check_ports(f'{rel}:{n}', line)

    def bare_paths(self, text):
        tops = '|'.join(re.escape(t) for t in sorted(self.repo.top | {'build'}, key=len,
                                                      reverse=True)
                        if os.path.isdir(os.path.join(self.repo.root, t)) or t == 'build')
        return re.finditer(r'(?<![\w./`:-])((?:%s)/[\w./-]*[\w/])' % tops, text)

    def check_test_name(self, where, suite, case):
        whole = f'{suite}.{case}'
        if suite not in self.repo.words:
            self.error(where, f'{whole}: no test suite `{suite}`', whole)
        elif case.endswith('…'):
            prefix = case[:-1]
            if not any(w.startswith(prefix) for w in self.repo.words):
                self.error(where, f'{whole}: no test of `{suite}` starts with `{prefix}`', whole)
        elif case != '*' and case not in self.repo.words:
            self.error(where, f'{whole}: no test `{case}`', whole)

    def check_code_line(self, where, line, doc_dir):
        for m in self.bare_paths(line):
            self.check_path(where, m.group(1), doc_dir)
        self.check_ports(where, line)

    # --- the decisions index -------------------------------------------------------------------
    def check_decisions_index(self):
        repo = self.repo
        index_rel = 'docs/DECISIONS.md'
        if not repo.has_path(index_rel):
            return
        areas = sorted(f for f in repo.files if re.fullmatch(r'docs/decisions/[^/]+\.md', f)
                       and not os.path.basename(f).startswith('pending-'))
        in_files = {}
        for rel in areas:
            with open(os.path.join(repo.root, rel), encoding='utf-8') as fh:
                lines = fh.read().split('\n')
            n = 0
            while n < len(lines):
                if lines[n].startswith('**') and (n == 0 or not lines[n - 1].strip()):
                    para = []
                    start = n
                    while n < len(lines) and lines[n].strip():
                        para.append(lines[n])
                        n += 1
                    m = re.match(r'\*\*(.+?)\*\*', '\n'.join(para), re.S)
                    if not m:
                        self.error(f'{rel}:{start + 1}', 'a decision starts with a **bold title**')
                        continue
                    title = ' '.join(m.group(1).split())
                    in_files[(title, rel)] = f'{rel}:{start + 1}'
                n += 1
        listed = {}
        with open(os.path.join(repo.root, index_rel), encoding='utf-8') as fh:
            for n, line in enumerate(fh.read().split('\n'), 1):
                m = re.fullmatch(r'- \[(.+)\]\((decisions/[^)#]+\.md)\)', line.strip())
                if m:
                    listed[(m.group(1), 'docs/' + m.group(2))] = f'{index_rel}:{n}'
        for key, where in in_files.items():
            if key not in listed:
                self.error(where, f'decision "{key[0]}" is not listed in {index_rel} as '
                           f'"- [{key[0]}](decisions/{os.path.basename(key[1])})"')
        for key, where in listed.items():
            if key not in in_files:
                self.error(where, f'no decision titled "{key[0]}" in {key[1]}')
        with open(os.path.join(repo.root, index_rel), encoding='utf-8') as fh:
            index = fh.read()
        for rel in areas:
            if f'(decisions/{os.path.basename(rel)})' not in index:
                self.error(f'{rel}:1', f'area file not linked from {index_rel}')


def read_allowlist(root):
    allow, errors = {}, []
    path = os.path.join(root, 'tests/docs_allowlist.txt')
    if not os.path.exists(path):
        return allow, errors
    with open(path, encoding='utf-8') as fh:
        for n, line in enumerate(fh, 1):
            line = line.rstrip('\n')
            if not line.strip() or line.startswith('#'):
                continue
            name, _, reason = line.partition(' # ')
            if not reason.strip():
                errors.append(f'tests/docs_allowlist.txt:{n}: "{name.strip()}" needs '
                              '"  # reason"')
            allow[name.strip()] = [n, not reason.strip()]  # reported once, for the reason
    return allow, errors


def check(root):
    repo = Repo(root)
    allow, errors = read_allowlist(root)
    checker = Checker(repo, allow)
    docs = sorted(f for f in repo.files
                  if f == 'README.md' or re.fullmatch(r'docs/[^/]+\.md', f))
    for rel in docs:
        checker.check_markdown(rel)
    checker.check_decisions_index()
    for name, (n, used) in sorted(allow.items(), key=lambda kv: kv[1][0]):
        if not used:
            errors.append(f'tests/docs_allowlist.txt:{n}: "{name}" is named by no doc any more; '
                          'remove it')
    return checker.errors + errors, len(docs)


def self_test():
    """Plants one error of each kind in a scratch repository and expects each to be reported."""
    with tempfile.TemporaryDirectory() as root:
        def write(rel, text):
            os.makedirs(os.path.dirname(os.path.join(root, rel)) or root, exist_ok=True)
            with open(os.path.join(root, rel), 'w', encoding='utf-8') as fh:
                fh.write(text)
        write('worker/strategy.cc', 'std::unique_ptr<Strategy> CreateStrategy(int cpus);\n'
              'ABSL_FLAG(int, cpus, 0, "");\nTEST(StrategyTest, Makes_ByName) {}\n')
        write('proto/jobs.proto', 'message JobSpec {\n  TrainerConfig trainer = 1;\n'
              '  string ckpt_path = 2 [(x) = {a: 1}];\n}\n'
              'message TrainerConfig { int32 max_epochs = 1; }\n')
        write('worker/CMakeLists.txt', 'add_executable(dtrain-worker main.cc)\n'
              'add_executable(worker_strategy_test t.cc)\n')
        write('deploy/local/cluster.sh', 'port=29610\n')
        write('docs/decisions/worker.md', '# Decisions: Worker\n\nIntro.\n\n'
              '**Strategies are made by name.** Text.\n\n**Unlisted.** Text.\n')
        write('docs/decisions/pending-x.md', '**Pending.** Ignored.\n')
        write('docs/DECISIONS.md', '# Decisions\n\n- [Strategies are made by name.]'
              '(decisions/worker.md)\n- [Gone.](decisions/worker.md)\n')
        write('tests/docs_allowlist.txt', 'ExternalThing  # a name of another project\n'
              'StaleThing  # no longer named\nNoReason\n')
        good = ('# Good\n\n`worker/strategy.cc`, `CreateStrategy`, `worker_strategy_test`,\n'
                '`local/cluster.sh`, `build/worker/dtrain-worker`, `--cpus`, `ExternalThing`,\n'
                '[the decisions](DECISIONS.md), 127.0.0.1:29610, worker/strategy.cc.\n'
                '`trainer.max_epochs`, `--trainer.max_epochs=5`, `ckpt_path`, strategy.cc,\n'
                'StrategyTest.Makes_ByName, StrategyTest.Makes…, `Strategy::CreateStrategy`.\n\n'
                '    deploy/local/cluster.sh start\n')
        write('README.md', good)
        bad = ('# Bad\n\nSee `MakeStrategy` and `worker_test`\nin `deploy/local-cluster.sh`, '
               '[x](missing.md),\n`build/worker/dtrain-wrker`, `--cores`, `127.0.0.1:50051`, '
               'worker/gone.cc.\n`trainer.ckpt_path`, `--trainer.max_epoch=5`, gone.h,\n'
               'StrategyTest.Gone_Case, `Strategy::Gone`.\n\n```\nbash deploy/gone.sh\n```\n')
        write('docs/bad.md', bad)
        try:  # a git repository when git is there; the checker walks the folder otherwise
            subprocess.run(['git', 'init', '-q', root], capture_output=True)
        except OSError:
            pass
        errors, _ = check(root)
        expected = [
            'docs/bad.md:3: `MakeStrategy`', 'docs/bad.md:3: `worker_test`',
            'docs/bad.md:4: `deploy/local-cluster.sh`', 'docs/bad.md:4: `missing.md`',
            'docs/bad.md:5: `build/worker/dtrain-wrker`', 'docs/bad.md:5: `--cores`',
            'docs/bad.md:5: port 50051', 'docs/bad.md:5: `worker/gone.cc`',
            'docs/bad.md:6: `trainer.ckpt_path`', 'docs/bad.md:6: `--trainer.max_epoch=5`',
            'docs/bad.md:6: gone.h', 'docs/bad.md:7: StrategyTest.Gone_Case',
            'docs/bad.md:7: `Strategy::Gone`', 'docs/bad.md:10: `deploy/gone.sh`',
            'docs/decisions/worker.md:7: decision "Unlisted."',
            'docs/DECISIONS.md:4: no decision titled "Gone."',
            'tests/docs_allowlist.txt:3: "NoReason" needs',
            'tests/docs_allowlist.txt:2: "StaleThing" is named by no doc',
        ]
        missing = [e for e in expected if not any(x.startswith(e) for x in errors)]
        unexpected = [x for x in errors if not any(x.startswith(e) for e in expected)]
        for e in missing:
            print(f'check_docs self-test: not reported: {e}', file=sys.stderr)
        for x in unexpected:
            print(f'check_docs self-test: false positive: {x}', file=sys.stderr)
        if missing or unexpected:
            return 1
        print(f'check_docs self-test: all {len(expected)} planted errors reported, no others')
        return 0


def main():
    if sys.argv[1:] == ['--self-test']:
        return self_test()
    if sys.argv[1:]:
        print(__doc__, file=sys.stderr)
        return 2
    root = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
    errors, count = check(root)
    if errors:
        for e in errors:
            print(e, file=sys.stderr)
        print(f'check_docs: {len(errors)} dangling reference(s) in README.md and docs/ '
              '(rules and allowlist: docs/CONTRIBUTING.md)', file=sys.stderr)
        return 1
    print(f'check_docs: {count} docs name only what exists; the decisions index matches')
    return 0


if __name__ == '__main__':
    sys.exit(main())
