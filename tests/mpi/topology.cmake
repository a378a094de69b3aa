# Topology discovery and exchange (included from tests/mpi/CMakeLists.txt). The test binds ranks
# itself where it needs bound ranks, so it runs under the default mpirun binding.
ubep_add_mpi_test(topology_test SOURCES topology_test.cpp NP 2 3 4 ROUTES default ENV UBEP_TOPOLOGY_PROBE=0)
