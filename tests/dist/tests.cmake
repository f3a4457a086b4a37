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
# Standard expert parallelism at the dispatch level (ep_case.cpp): W ranks against the single-rank
# computation of the same tokens, the dispatch peak against the receive counts, meta against cpu.
if(FLATPEAK_HAVE_MPI)
  add_executable(ep_case ${CMAKE_CURRENT_SOURCE_DIR}/dist/ep_case.cpp)
  target_compile_options(ep_case PRIVATE ${FLATPEAK_WARNINGS})
  target_link_libraries(ep_case PRIVATE flatpeak_engine)
  add_test(NAME mpi_ep_dispatch_w1 COMMAND $<TARGET_FILE:ep_case>)
  foreach(w 2 4)
    add_test(NAME mpi_ep_dispatch_w${w}
             COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np ${w} $<TARGET_FILE:ep_case>)
  endforeach()
  set_tests_properties(mpi_ep_dispatch_w1 mpi_ep_dispatch_w2 mpi_ep_dispatch_w4 PROPERTIES LABELS mpi TIMEOUT 300
                       RUN_SERIAL TRUE ENVIRONMENT "OMP_NUM_THREADS=1;OMPI_MCA_btl_vader_single_copy_mechanism=none")
endif()
# Ring-DTP on W ranks (ring_dtp_case.cpp): the head against the full head of one process, both ring
# modes and keep_strips off/on, and 10 training steps ring vs full.
if(FLATPEAK_HAVE_MPI)
  add_executable(ring_dtp_case ${CMAKE_CURRENT_SOURCE_DIR}/dist/ring_dtp_case.cpp)
  target_compile_options(ring_dtp_case PRIVATE ${FLATPEAK_WARNINGS})
  target_link_libraries(ring_dtp_case PRIVATE flatpeak_engine)
  add_test(NAME mpi_ring_dtp_w1 COMMAND $<TARGET_FILE:ring_dtp_case>)
  foreach(w 2 4)
    add_test(NAME mpi_ring_dtp_w${w}
             COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np ${w} $<TARGET_FILE:ring_dtp_case>)
  endforeach()
  set_tests_properties(mpi_ring_dtp_w1 mpi_ring_dtp_w2 mpi_ring_dtp_w4 PROPERTIES LABELS mpi TIMEOUT 300
                       RUN_SERIAL TRUE ENVIRONMENT "OMP_NUM_THREADS=1;OMPI_MCA_btl_vader_single_copy_mechanism=none")
endif()
# LLEP and PipelinedLLEP at the dispatch level (llep_case.cpp, issue 6): W ranks against one rank and
# against standard expert parallelism, the pipelined chunk bound on the ledger, meta against cpu.
if(FLATPEAK_HAVE_MPI)
  add_executable(llep_case ${CMAKE_CURRENT_SOURCE_DIR}/dist/llep_case.cpp)
  target_compile_options(llep_case PRIVATE ${FLATPEAK_WARNINGS})
  target_link_libraries(llep_case PRIVATE flatpeak_engine)
  add_test(NAME mpi_llep_dispatch_w1 COMMAND $<TARGET_FILE:llep_case>)
  foreach(w 2 4)
    add_test(NAME mpi_llep_dispatch_w${w}
             COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np ${w} $<TARGET_FILE:llep_case>)
  endforeach()
  set_tests_properties(mpi_llep_dispatch_w1 mpi_llep_dispatch_w2 mpi_llep_dispatch_w4 PROPERTIES LABELS mpi
                       TIMEOUT 300 RUN_SERIAL TRUE
                       ENVIRONMENT "OMP_NUM_THREADS=1;OMPI_MCA_btl_vader_single_copy_mechanism=none")
endif()
# LLEP and PipelinedLLEP in whole-model training (llep_train.py, issue 6): 10 steps on 2 and 4 ranks
# track the standard dispatch's losses within 1e-5.
if(FLATPEAK_HAVE_MPI)
  add_test(NAME mpi_llep_train
           COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/dist/llep_train.py --bin-dir ${PROJECT_BINARY_DIR}
                   --configs ${PROJECT_SOURCE_DIR}/configs)
  set_tests_properties(mpi_llep_train PROPERTIES LABELS mpi TIMEOUT 600 RUN_SERIAL TRUE)
endif()
# flatpeak bench dispatch on 2 ranks, cpu and meta (llep_bench.py, issue 6).
if(FLATPEAK_HAVE_MPI)
  add_test(NAME mpi_llep_bench COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/dist/llep_bench.py
                                       --bin-dir ${PROJECT_BINARY_DIR})
  set_tests_properties(mpi_llep_bench PROPERTIES LABELS mpi TIMEOUT 300 RUN_SERIAL TRUE)
endif()
