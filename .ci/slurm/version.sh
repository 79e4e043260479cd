# Sourced by up.sh and down.sh: where the Slurm of SLURM_CI_VERSION lives and keeps its state.
#   22.05 (default): Debian 12's packages: daemons in /usr/sbin, config in /etc/slurm, where Debian's tools look.
#   24.11: built from source by build.sh into /opt/slurm-24.11.5, its config in its own etc/; its clients are found
#          with PATH=/opt/slurm-24.11.5/bin:$PATH (22.05's clients cannot talk to a 24.11 controller).
# Each version has its own controller state, slurmd spool and accounting database: a newer slurmctld or slurmdbd
# converts an older one's, which the older one could then no longer read.
case "${SLURM_CI_VERSION:-22.05}" in
    22.05) SLURM_PREFIX=/usr; SLURM_CONF_DIR=/etc/slurm; SLURM_TAG="" ;;
    24.11) SLURM_PREFIX=/opt/slurm-24.11.5; SLURM_CONF_DIR=$SLURM_PREFIX/etc; SLURM_TAG=-24.11 ;;
    *) echo "SLURM_CI_VERSION=${SLURM_CI_VERSION}: expected 22.05 (Debian 12's packages, the default) or 24.11" \
            "(built from the source Debian 13 packages)" >&2; exit 2 ;;
esac
SLURM_STATE_DIR=/var/spool/slurmctld$SLURM_TAG
SLURMD_SPOOL_DIR=/var/spool/slurmd$SLURM_TAG
SLURM_DB=slurm_acct_db${SLURM_TAG//[.-]/_}
[ "$SLURM_PREFIX" = /usr ] || PATH=$SLURM_PREFIX/bin:$SLURM_PREFIX/sbin:$PATH
