#!/usr/bin/env bash
# Create .venv and install parsearch with its dev/CI dependencies, once.
# torch is pinned through constraints/dev.txt (a CPU build on the development machines);
# the package itself only asks for a torch range. Re-running is cheap: a stamp records what
# was installed and the install is skipped while pyproject.toml and the constraints match.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
stamp=".venv/.parsearch-installed"
want="$(cat pyproject.toml constraints/dev.txt | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -c constraints/dev.txt -e ".[dev]"
    # DeepSpeed compiles its CPU collective op on first use (under ~/.cache/torch_extensions);
    # once here, so no trial of a test pays minutes for it inside its timeout.
    .venv/bin/python -c "from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder as B; B().load()" >/dev/null 2>&1 || echo "bootstrap: DeepSpeed's CPU op did not build now; its first trial will build it" >&2
    echo "$want" > "$stamp"
fi
