#!/usr/bin/env bash
# py-solc-x -> solcjs (npm solc) shim.
#
# 1. solcjs prints ">>> Cannot retry compilation with SMT ..." on stdout before the JSON in
#    --standard-json mode, which breaks py-solc-x's json.loads: drop every ">>> " line.
# 2. solcjs ends with `console.log(output); process.exit(0)`, which cuts its output at 64 KiB
#    when stdout is a pipe (the write is still pending at exit). Writes to a regular file are
#    synchronous, so stdin and stdout go through temp files.
# The compiler's exit status is kept. SOLCJS_DIR overrides where npm solc lives.
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
solc_dir="${SOLCJS_DIR:-$here/../node_modules/solc}"
if [ ! -f "$solc_dir/solc.js" ]; then
    echo "solcjs-shim: $solc_dir/solc.js not found (run 'npm ci' in the repo root)" >&2
    exit 127
fi
tmp="$(mktemp -d "${TMPDIR:-/tmp}/solcjs-shim.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
if [ -t 0 ]; then : >"$tmp/in"; else cat >"$tmp/in"; fi
node "$solc_dir/solc.js" "$@" <"$tmp/in" >"$tmp/out"
status=$?
grep -v '^>>> ' "$tmp/out"
exit "$status"
