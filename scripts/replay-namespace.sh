#!/usr/bin/env bash
# Replay the namespace move on a branch written against the old imports, so that it merges
# into a main that already has h22's move (a repo tool, for the lead):
#
#   scripts/replay-namespace.sh BRANCH MECHANICAL
#
# MECHANICAL is the commit "mechanical: scripts/namespace.py" of the move itself (its tree
# is scripts/namespace.py's output on its parent). This makes BRANCH-ns: BRANCH, then the
# script's output on it (commit "mechanical: scripts/namespace.py"), then a merge `-s ours`
# of MECHANICAL, which changes no file but records that BRANCH-ns already contains the
# move. `git merge BRANCH-ns` into main then diffs both sides against MECHANICAL: only the
# branch's own changes and main's hand-made ones meet, never two copies of the rewrite.
# The script's output is the same whichever branch it runs on (it reads only the files).
set -euo pipefail
branch=${1:?usage: scripts/replay-namespace.sh BRANCH MECHANICAL}
mechanical=${2:?usage: scripts/replay-namespace.sh BRANCH MECHANICAL}
subject=$(git log -1 --format=%s "$mechanical")
if [ "$subject" != "mechanical: scripts/namespace.py" ]; then
  echo "$mechanical is \"$subject\", not the mechanical commit" >&2
  exit 2
fi
if [ -n "$(git status --porcelain)" ]; then
  echo "the working tree has changes: commit them first" >&2
  exit 2
fi
tool=$(mktemp --suffix=.py)
trap 'rm -f "$tool"' EXIT
# This checkout's script (main's, once the move is merged): on MECHANICAL's parent it
# makes MECHANICAL's tree exactly (tests/test_namespace_script.py pins its forms).
cp scripts/namespace.py "$tool"
python=${PYTHON:-.venv/bin/python}
[ -x "$python" ] || python=python3
git checkout -q -b "$branch-ns" "$branch"
"$python" "$tool" .
# MECHANICAL's tree has the script itself; without it here, the merge would delete it.
git checkout "$mechanical" -- scripts/namespace.py
git add -A
git commit -q -m "mechanical: scripts/namespace.py" || echo "nothing to rewrite on $branch"
git merge -q -s ours --no-edit -m "record the namespace move ($mechanical) as merged" "$mechanical"
echo "ready: git checkout main && git merge $branch-ns"
