# Multi-process tests (ctest label mpi): mpirun -np 2 and 4, oversubscribed on 2 cores.
if(FLATPEAK_HAVE_MPI)
  add_executable(dist_case ${CMAKE_CURRENT_SOURCE_DIR}/dist/dist_case.cpp)
  target_compile_options(dist_case PRIVATE ${FLATPEAK_WARNINGS})
  target_link_libraries(dist_case PRIVATE flatpeak_engine)
  foreach(case grads train ckpt failure)
    add_test(NAME mpi_${case}
             COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/dist/dist_check.py --bin-dir ${PROJECT_BINARY_DIR}
                     --configs ${PROJECT_SOURCE_DIR}/configs ${case})
    set_tests_properties(mpi_${case} PROPERTIES LABELS mpi TIMEOUT 900 RUN_SERIAL TRUE)
  endforeach()
endif()
# SCO on 2 ranks: bit-identical to device boundaries (issue 7).
if(FLATPEAK_HAVE_MPI)
  add_test(NAME mpi_sco
           COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/dist/sco_dist.py --bin-dir ${PROJECT_BINARY_DIR}
                   --configs ${PROJECT_SOURCE_DIR}/configs)
  set_tests_properties(mpi_sco PROPERTIES LABELS mpi TIMEOUT 600 RUN_SERIAL TRUE)
endif()
