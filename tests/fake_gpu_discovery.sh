#!/usr/bin/env bash
# A fake Spark GPU discovery script for tests (machines without GPUs), as Spark's own
# tests use: reports the addresses in SPARKDIST_FAKE_GPUS (default "0,1") as the "gpu"
# resource, e.g. {"name": "gpu", "addresses": ["0", "1"]}.
set -euo pipefail
IFS=',' read -r -a addresses <<<"${SPARKDIST_FAKE_GPUS:-0,1}"
out=""
for address in "${addresses[@]}"; do
  out+="${out:+, }\"$address\""
done
printf '{"name": "gpu", "addresses": [%s]}\n' "$out"
