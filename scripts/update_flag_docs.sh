#!/usr/bin/env bash
# Rewrite the usage block of docs/flags.md (the ```text block after its usage marker line) from the
# trainer's own -h text, so that the flag documentation is the binary's. tests/test_readme.py fails when
# the two differ; run this after changing a flag:
#
#   scripts/update_flag_docs.sh            # builds train_sdc if needed
set -euo pipefail
cd "$(dirname "$0")/.."
make -s train_sdc
MARK='<!-- usage: scripts/update_flag_docs.sh writes the block below from ./train_sdc -h -->'
DOC=docs/flags.md
grep -qxF "$MARK" "$DOC" || { echo "error: $DOC has no line '$MARK'" >&2; exit 1; }
USAGE=$(mktemp)
trap 'rm -f "$USAGE" "$DOC.tmp"' EXIT
./train_sdc -h > "$USAGE"
# keep everything up to the marker, then the new block, then everything after the old block's closing fence
awk -v mark="$MARK" -v usage="$USAGE" '
  state == 0 { print; if ($0 == mark) { state = 1 }; next }
  state == 1 { if ($0 ~ /^```text$/) { state = 2; print; while ((getline l < usage) > 0) print l; next }
               print "error: no ```text block right after the marker" > "/dev/stderr"; exit 1 }
  state == 2 { if ($0 == "```") { state = 3; print }; next }
  state == 3 { print }
  END { if (state != 3) exit 1 }
' "$DOC" > "$DOC.tmp"
mv "$DOC.tmp" "$DOC"
echo "$DOC: usage block rewritten from ./train_sdc -h ($(wc -l < "$USAGE") lines)"
