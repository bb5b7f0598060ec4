#!/usr/bin/env bash
# Spark GPU discovery script (spark.{driver,executor,worker}.resource.gpu.discoveryScript):
# prints the GPUs of this machine as a Spark resource, e.g.
#   {"name": "gpu", "addresses": ["0", "1"]}
# Like Spark's examples/src/main/scripts/getGpusResources.sh (nvidia-smi indices), with
# one difference: when CUDA_VISIBLE_DEVICES is set (a container or cluster manager
# restricted the GPUs), it reports indices into that list, 0..n-1, which is how
# sparkdist (and pyspark's TorchDistributor) read Spark's addresses then; set but empty
# means no GPU is visible.
set -euo pipefail

emit() {
  local out="" address
  for address in "$@"; do
    out+="${out:+, }\"$address\""
  done
  printf '{"name": "gpu", "addresses": [%s]}\n' "$out"
}

if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then  # set, even empty (= no GPU visible)
  IFS=',' read -r -a visible <<<"${CUDA_VISIBLE_DEVICES// /}"
  indices=()
  for i in "${!visible[@]}"; do
    [ -n "${visible[$i]}" ] && indices+=("$i")
  done
  emit "${indices[@]}"
  exit 0
fi

if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "gpu_discovery.sh: nvidia-smi not found; this host has no NVIDIA driver" >&2
  exit 1
fi
mapfile -t indices < <(nvidia-smi --query-gpu=index --format=csv,noheader | tr -d ' ')
emit "${indices[@]}"
