#!/usr/bin/env bash
# Download the pure-Python wheels the GPU suite needs beside the lent machine's own packages (it has PyTorch, CUDA,
# transformers, matplotlib, tqdm, tensorboard, but not gymnasium or tyro, and reaches no package registry).
# Run once on a machine with PyPI, in the repository root; the wheels land in .whl/ (ignored by git), which the
# device call carries. Versions: the ones CI tests with (pyproject.toml floors admit them); Python 3.12 there.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${1:-.whl}
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$DEST" gymnasium==1.4.0 farama-notifications==0.0.6 tyro==1.0.17 docstring_parser==0.18.0 typeguard==4.6.1
ls "$DEST"
