# Sourced by the scripts: Open MPI as root and oversubscribed (this machine has fewer cores than ranks).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export GTEST_COLOR=no
JOBS=$(nproc)
# One-sided through osc ucx (sm for shared windows): Open MPI 4.1's default osc rdma over btl vader
# crashes in MPI_Compare_and_swap (ompi issues 11349, 9146) and fails across TCP nodes.
export OMPI_MCA_osc=${OMPI_MCA_osc:-ucx,sm}
