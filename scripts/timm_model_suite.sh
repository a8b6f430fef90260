#!/usr/bin/env bash
# Run timm's own generic model tests (tests/test_models.py from timm's source distribution, for the
# installed timm version) against the WeightFormer models.
#
#   bash scripts/timm_model_suite.sh [extra pytest args]
#
# Needs network access to the package index once, to fetch timm's sdist; set TIMM_SDIST=/path/to/timm-X.tar.gz
# to use a file you already have.
set -euo pipefail
version=$(python -c "import timm; print(timm.__version__)")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -n "${TIMM_SDIST:-}" ]; then
    cp "$TIMM_SDIST" "$work/"
else
    python -m pip download --quiet --no-deps --no-binary :all: "timm==$version" -d "$work"
fi
tar -xzf "$work"/timm-*.tar.gz -C "$work"
src=$(find "$work" -maxdepth 1 -type d -name "timm-*" | head -n 1)
printf '\nimport weightformer  # registers the WeightFormer models\n' >> "$src/tests/conftest.py"
cd "$src"
HF_HUB_OFFLINE=1 python -m pytest tests/test_models.py -p no:cacheprovider -q -W ignore \
    -k "weightformer and not pretrained and not inference" "$@"
