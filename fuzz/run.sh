#!/usr/bin/env bash
# Fuzz clipserve's image decoding and preprocessing: fuzz/run.sh [RUNS] (default 50000).
# Needs the fuzz extra: .venv/bin/pip install -c constraints.txt -e '.[fuzz]'
set -euo pipefail
cd "$(dirname "$0")"
python=${PYTHON:-../.venv/bin/python}
"$python" seeds.py corpus
mkdir -p findings
"$python" fuzz_images.py corpus -runs="${1:-50000}" -max_len=65536 -artifact_prefix=findings/ -timeout=20 -rss_limit_mb=4096
