#!/usr/bin/env bash
# Installs Slurm for tests/scripts/srun_netns.sh (idempotent): slurmctld, slurmd, the client
# commands (srun, sinfo) and munge, all from Debian. The PMIx plugin srun --mpi=pmix loads
# (mpi_pmix.so) comes with slurm-wlm-basic-plugins, a dependency; it opens the libpmix that
# Open MPI uses (libpmix-dev, from scripts/setup.sh's libopenmpi-dev). Test-only: ctrain needs
# none of it, and the packages enable Slurm's and munge's system services, so CI (.ci/run)
# runs this rather than scripts/setup.sh. The test starts its own private daemons.
set -euo pipefail
pkgs=(slurmctld slurmd slurm-client munge libpmix-dev)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then echo "setup-slurm: all packages present"; exit 0; fi
echo "setup-slurm: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
