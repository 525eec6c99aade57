#!/usr/bin/env bash
# Installs Slurm for tests/scripts/srun_netns.sh and srun_preempt.sh (idempotent): slurmctld, slurmd, the client
# commands (srun, sinfo) and munge, all from Debian. The PMIx plugin srun --mpi=pmix loads
# (mpi_pmix.so) comes with slurm-wlm-basic-plugins, a dependency; it opens the libpmix that
# Open MPI uses (libpmix-dev, from scripts/setup.sh's libopenmpi-dev). Test-only: ctrain needs
# none of it, and the packages enable Slurm's and munge's system services, so CI (.ci/run)
# runs this rather than scripts/setup.sh. The test starts its own private daemons.
set -euo pipefail
pkgs=(slurmctld slurmd slurm-client munge libpmix-dev)
. "$(dirname "$0")/apt-missing.sh"
apt_missing setup-slurm "${pkgs[@]}"
