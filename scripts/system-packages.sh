#!/usr/bin/env bash
# The Debian packages the test tiers use, installed quietly when missing: Chromium for the
# dashboard's browser tests; Slurm and munge for the real-scheduler tier (the cluster of
# namespaced nodes scripts/slurm-cluster.sh starts; iproute2 and util-linux give it `ip`,
# `nsenter` and `unshare`); PostgreSQL for the store's server tier (tests/postgres_server.py
# starts its own server; Debian keeps initdb off PATH); shellcheck for the job and setup
# scripts (tests/test_shellcheck.py). Without root or apt, those tests skip and say why (on
# CI the Slurm, PostgreSQL and shellcheck tests fail instead: they must run there).
set -uo pipefail
wanted=()
command -v chromium >/dev/null 2>&1 || wanted+=(chromium)
command -v slurmctld >/dev/null 2>&1 || wanted+=(slurm-wlm)
command -v munged >/dev/null 2>&1 || wanted+=(munge)
command -v ip >/dev/null 2>&1 || wanted+=(iproute2)
command -v nsenter >/dev/null 2>&1 || wanted+=(util-linux)
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || wanted+=(postgresql)
command -v shellcheck >/dev/null 2>&1 || wanted+=(shellcheck)
((${#wanted[@]})) || exit 0
command -v apt-get >/dev/null 2>&1 || exit 0
sudo=""
if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || exit 0
    sudo="sudo -n"
fi
{ $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
    $sudo apt-get install -y -qq --no-install-recommends "${wanted[@]}"; } >/dev/null 2>&1 \
    || echo "scripts/system-packages.sh: could not install ${wanted[*]}; their tests will skip" >&2
exit 0
