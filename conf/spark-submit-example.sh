#!/usr/bin/env bash
# A training script on N ranks through spark-submit, with this directory's configuration
# (spark-defaults.conf and the quiet log4j2.properties, through SPARK_CONF_DIR).
#
#   conf/spark-submit-example.sh SCRIPT [NP [-- SCRIPT ARGS...]]   (NP defaults to 2)
#
# e.g. conf/spark-submit-example.sh train.py 2 -- --epochs 3. Environment:
#   MASTER        Spark master URL (default local-cluster[2,1,1024]: two executors here)
#   PYTHON        the Python that has sparkdist installed (default: python3 on PATH)
#   SPARK_SUBMIT  spark-submit to use (default: the one beside $PYTHON, else on PATH)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
script=${1:?usage: $0 SCRIPT [NP [-- SCRIPT ARGS...]]}
np=${2:-2}
shift $(($# > 2 ? 2 : $#))
[ "${1:-}" = "--" ] && shift
PYTHON=${PYTHON:-$(command -v python3)}
bin=$(dirname "$PYTHON")
SPARK_SUBMIT=${SPARK_SUBMIT:-$([ -x "$bin/spark-submit" ] && echo "$bin/spark-submit" || command -v spark-submit || true)}
[ -n "$SPARK_SUBMIT" ] || { echo "spark-submit not found: set SPARK_SUBMIT or install pyspark" >&2; exit 1; }
[ -f "$script" ] || { echo "no such training script: $script" >&2; exit 1; }
entrypoint=$("$PYTHON" -m sparkdist entrypoint) \
  || { echo "sparkdist is not installed in $PYTHON: pip install it or set PYTHON" >&2; exit 1; }

# The driver and the executors run the Python that has sparkdist; mpirun is found on PATH.
export PYSPARK_PYTHON=$PYTHON PYSPARK_DRIVER_PYTHON=$PYTHON
export SPARK_CONF_DIR=$here
export PATH="$bin:$PATH"

set -x
exec "$SPARK_SUBMIT" --master "${MASTER:-local-cluster[2,1,1024]}" \
  --conf spark.executor.memory=1g \
  "$entrypoint" run --np "$np" "$script" -- "$@"
