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
    # uv installs the ~150 packages in about a minute where pip takes 2.5, most of it
    # compiling their bytecode (without it every import of torch compiles it again). uv
    # reads no pip.conf, so it is handed pip's find-links: where the development machines
    # keep the CPU torch build (without it the pin would fetch a multi-GB CUDA build).
    .venv/bin/python -m pip install --quiet -c constraints/dev.txt uv
    links=()
    for dir in $(.venv/bin/python -m pip config get global.find-links 2>/dev/null) \
        ${PIP_FIND_LINKS:-}; do
        [[ " ${links[*]} " == *" $dir "* ]] || links+=(--find-links "$dir")
    done
    .venv/bin/python -m uv pip install --quiet --python .venv/bin/python "${links[@]}" \
        --compile-bytecode -c constraints/dev.txt -e ".[dev]"
    echo "$want" > "$stamp"
fi
# Bytecode for our own modules too: where PYTHONDONTWRITEBYTECODE is set (these machines set
# it) every process would otherwise compile them again, and the tests start hundreds.
.venv/bin/python -m compileall -q parsearch tests >/dev/null
