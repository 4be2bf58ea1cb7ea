#!/usr/bin/env bash
# py-solc-x -> solcjs (npm solc) shim.
#
# solcjs prints ">>> Cannot retry compilation with SMT ..." on stdout before the JSON in
# --standard-json mode, which breaks py-solc-x's json.loads; this drops every ">>> " line.
# The compiler's own exit status is kept (pipefail). SOLCJS_DIR overrides where npm solc lives.
set -o pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
solc_dir="${SOLCJS_DIR:-$here/../node_modules/solc}"
if [ ! -f "$solc_dir/solc.js" ]; then
    echo "solcjs-shim: $solc_dir/solc.js not found (run 'npm ci' in the repo root)" >&2
    exit 127
fi
node "$solc_dir/solc.js" "$@" | { grep -v '^>>> ' || true; }
