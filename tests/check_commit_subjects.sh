#!/usr/bin/env bash
# Commit subjects are at most 72 characters; the why, numbers and details go in the body
# (docs/CONTRIBUTING.md). A subject is what git shows for a commit: its message's first
# paragraph, lines joined.
#   tests/check_commit_subjects.sh                 fails (exit 1) listing every commit after
#                                                  1d47da7 (where the rule was filed; earlier
#                                                  history stays as it is) with a longer subject
#   tests/check_commit_subjects.sh --message FILE  checks one message: the commit-msg hook
#                                                  (.githooks/commit-msg)
# In a shallow clone without 1d47da7 every commit present is newer than it, and all of them are
# checked; the output says so.
set -euo pipefail
export LC_ALL=C.UTF-8  # count characters, not bytes
readonly max=72 since=1d47da7

if [ "${1:-}" = "--message" ]; then
  [ $# -eq 2 ] || { echo "usage: $0 [--message FILE]" >&2; exit 2; }
  # Comment lines are git's, not the message's; the first paragraph is the subject.
  paragraph=$(sed -e '/^#/d' -e 's/[[:space:]]*$//' "$2" | awk 'NF {print; seen = 1; next} seen {exit}')
  subject=$(printf '%s' "$paragraph" | tr '\n' ' ')
  lines=$(printf '%s\n' "$paragraph" | grep -c . || true)
  if [ "${#subject}" -gt "$max" ]; then
    echo "commit-msg: the subject is ${#subject} characters; at most $max (docs/CONTRIBUTING.md)." >&2
    if [ "$lines" -gt 1 ]; then
      echo "  Its first paragraph has $lines lines, and git shows them joined as one subject:" >&2
      echo "  end the first line with a blank line." >&2
    fi
    echo "  Say what changed in the first line; put the why, numbers and details in the body," >&2
    echo "  after a blank line. The message is kept in $2 (git commit -e -F it)." >&2
    exit 1
  fi
  exit 0
fi
[ $# -eq 0 ] || { echo "usage: $0 [--message FILE]" >&2; exit 2; }

cd "$(dirname "$0")/.."
if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1 || ! git rev-parse -q --verify HEAD >/dev/null; then
  echo "check_commit_subjects: no git history here, so no commit to check"
  exit 0
fi
if git cat-file -e "$since^{commit}" 2>/dev/null; then
  range="$since..HEAD"
  what="after $since"
else
  range=HEAD
  what="in this clone"
  echo "check_commit_subjects: $since (where the rule was filed) is not in this clone" \
    "(shallow: $(git rev-parse --is-shallow-repository)); every commit present is newer, so all are checked"
fi
count=0
long=()
while IFS= read -r -d '' line; do
  count=$((count + 1))
  subject=${line#* }
  if [ "${#subject}" -gt "$max" ]; then long+=("  ${line%% *} (${#subject} characters) ${subject:0:60}..."); fi
done < <(git log -z --format='%h %s' "$range")
if [ ${#long[@]} -gt 0 ]; then
  echo "check_commit_subjects: ${#long[@]} of the $count commit(s) $what have a subject over $max characters:" >&2
  printf '%s\n' "${long[@]}" >&2
  echo "reword them (git rebase -i, 'reword') before they are merged: subject at most $max characters, details in the body" >&2
  exit 1
fi
echo "check_commit_subjects: the $count commit(s) $what have subjects of at most $max characters"
