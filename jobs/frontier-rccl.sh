# shellcheck shell=bash
# RCCL over Frontier's Slingshot network (sourced by the Frontier job scripts, after
# `module load rocm rccl-net-plugin` and inside a Slurm job).
#
# RCCL and libfabric on Frontier: the settings OLCF lists as "strongly recommended by HPE and
# AMD on Frontier for both correctness and best performance at scale" (rccl-net-plugin sets
# them too; repeated here so the script says what runs), and the interfaces to bind:
# https://docs.olcf.ornl.gov/software/analytics/pytorch_frontier.html#manual-rccl-network-plugin-configuration-not-recommended
export NCCL_SOCKET_IFNAME=hsn0,hsn1,hsn2,hsn3   # "if you see hangs, try using only hsn0"
export NCCL_CROSS_NIC=1
export NCCL_NET_GDR_LEVEL=PHB
export HSA_FORCE_FINE_GRAIN_PCIE=1
export FI_MR_CACHE_MONITOR=kdreg2
export FI_CXI_DISABLE_HOST_REGISTER=1
export FI_CXI_DEFAULT_CQ_SIZE=131072
export FI_CXI_RDZV_PROTO=alt_read               # needs #SBATCH --network=disable_rdzv_get
export FI_CXI_RDZV_EAGER_SIZE=0
export FI_CXI_RDZV_THRESHOLD=0
export FI_CXI_RDZV_GET_MIN=0
export FI_CXI_DEFAULT_TX_SIZE=2048
export FI_CXI_RX_MATCH_MODE=hybrid
# Fail rather than fall back to TCP sockets when the plugin does not load (a single node has
# no configured network, so it uses sockets): same page, same section.
if ((${SLURM_NNODES:-1} == 1)); then export NCCL_NET=Socket; else export NCCL_NET=OFI; fi
