#!/usr/bin/env bash
# A CI run must leave the work tree as it found it: no tool's cache, venv,
# generated client or test output in files git would show. .ci/run takes a
# snapshot of `git status --porcelain` when it starts and checks it again
# at its end; anything new fails the run, listed.
#
#   bash scripts/left_behind.sh snapshot FILE   (at the start)
#   bash scripts/left_behind.sh check FILE      (at the end)
#
# In CI the tree starts clean, so the check is "git status is clean"; run by
# hand on a tree with changes of one's own, it names only what the run added
# or changed. A file the run should keep belongs in .gitignore, with a line
# saying which tool writes it.
set -euo pipefail
export LC_ALL=C
cd "$(dirname "$0")/.."

what="${1:-}"
file="${2:-}"
if [ -z "$file" ] || { [ "$what" != snapshot ] && [ "$what" != check ]; }; then
    echo "usage: $0 snapshot|check FILE" >&2
    exit 2
fi
if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    echo "left_behind: $PWD is not a git work tree, so what a run leaves behind cannot be seen" >&2
    exit 1
fi

# Each changed path with its status and, for a file, a hash of its content:
# a file already changed before the run and changed again by it counts too.
state() {
    git status --porcelain=v1 -z --untracked-files=all | tr '\0' '\n' | while IFS= read -r line; do
        [ -z "$line" ] && continue
        path="${line:3}"
        hash=-
        [ -f "$path" ] && hash="$(git hash-object -- "$path")"
        printf '%s %s\n' "$line" "$hash"
    done | sort
}

if [ "$what" = snapshot ]; then
    state > "$file"
    exit 0
fi

left="$(comm -13 "$file" <(state))"
if [ -n "$left" ]; then
    echo "left_behind: this run left files in the work tree (git status --porcelain; each with its content's hash):" >&2
    printf '%s\n' "$left" | sed 's/^/    /' >&2
    echo "left_behind: write them outside the tree (mktemp), remove them, or ignore them in .gitignore" >&2
    exit 1
fi
echo "left_behind: the work tree is as the run found it"
