# End-to-end tests of the flatpeak command (Python drivers, no torch needed).
set(FP_CLI_PY /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/cli/test_train.py --bin $<TARGET_FILE:flatpeak>
    --configs ${PROJECT_SOURCE_DIR}/configs)
foreach(case resume_bit_exact kill_during_checkpoint bad_inputs demo_loss_falls eval_token_file)
  add_test(NAME cli_${case} COMMAND ${FP_CLI_PY} ${case})
  set_tests_properties(cli_${case} PROPERTIES LABELS cli TIMEOUT 600)
endforeach()
