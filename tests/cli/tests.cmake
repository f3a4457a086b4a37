# End-to-end tests of the flatpeak command (Python drivers, no torch needed).
set(FP_CLI_PY /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/cli/test_train.py --bin $<TARGET_FILE:flatpeak>
    --configs ${PROJECT_SOURCE_DIR}/configs)
foreach(case resume_bit_exact resume_bit_exact_bf16 resume_bit_exact_bf16_deepseek bench_step_bf16 kill_during_checkpoint checkpoint_checksums bad_inputs demo_loss_falls eval_token_file documents_and_held_out grad_accum out_reuse signals
             signal_mpi faults cli_edges extend oom_hints disk_full report)
  add_test(NAME cli_${case} COMMAND ${FP_CLI_PY} ${case})
  set_tests_properties(cli_${case} PROPERTIES LABELS "cli;slow" TIMEOUT 600)
endforeach()
# flatpeak plan (tests/cli/test_plan.py): presets with JSON and SVG, plan vs `step --device meta`, errors,
# a run config's schedules (plan --config).
foreach(case matches_meta_step bad_inputs compare_timeline from_run_config choose_every mesh_experts shrinks_what_binds)
  add_test(NAME cli_plan_${case} COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/cli/test_plan.py
           --bin $<TARGET_FILE:flatpeak> --configs ${PROJECT_SOURCE_DIR}/configs ${case})
  set_tests_properties(cli_plan_${case} PROPERTIES LABELS "cli;quick" TIMEOUT 300)
endforeach()
add_test(NAME cli_plan_presets_json_plot COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/cli/test_plan.py
         --bin $<TARGET_FILE:flatpeak> --configs ${PROJECT_SOURCE_DIR}/configs presets_json_plot)
set_tests_properties(cli_plan_presets_json_plot PROPERTIES LABELS "cli;slow" TIMEOUT 300)
# Optimizer schedules (tests/cli/test_optim.py): offload training and resume vs the device AdamW, bench optimizer.
foreach(case train_resume_offload train_emulated_link bench_smoke)
  add_test(NAME cli_optim_${case} COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/cli/test_optim.py
           --bin $<TARGET_FILE:flatpeak> --configs ${PROJECT_SOURCE_DIR}/configs ${case})
  set_tests_properties(cli_optim_${case} PROPERTIES LABELS "cli;slow" TIMEOUT 300)
endforeach()
# Hugging Face checkpoint directories (tests/cli/test_hf.py, needs torch): eval vs the PyTorch twin on F32, sharded
# BF16 and F16 weights in both config.json spellings and every RoPE scaling, refused keys and tensors, train
# --init-from, convert without loss; gpt-oss directories with fused and MXFP4 experts.
foreach(case eval_matches_twin refusals init_from convert_round_trip gpt_oss_checkpoints)
  add_test(NAME cli_hf_${case} COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/cli/test_hf.py
           --bin $<TARGET_FILE:flatpeak> --configs ${PROJECT_SOURCE_DIR}/configs ${case})
  set_tests_properties(cli_hf_${case} PROPERTIES LABELS "cli;slow" TIMEOUT 300)
endforeach()
# The demo learns recall (tests/cli/test_demo.py): scripts/demo in full with this build's binary; its recall
# accuracy at 1024 tokens must end >= 0.9. About 40 s on 2 idle cores.
add_test(NAME cli_demo_learns_recall COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/cli/test_demo.py
         --bin $<TARGET_FILE:flatpeak> --root ${PROJECT_SOURCE_DIR})
set_tests_properties(cli_demo_learns_recall PROPERTIES LABELS "cli;slow" TIMEOUT 600)
# bench vocab in bf16 (tests/cli/test_bench.py): its own checks against float64 and the full head pass with
# bf16 tolerances, on one rank and on 2 ranks with the FSDP lm_head, and the peaks follow the dtypes.
foreach(case vocab_bf16 vocab_bf16_mpi)
  add_test(NAME cli_bench_${case} COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/cli/test_bench.py
           --bin $<TARGET_FILE:flatpeak> ${case})
  set_tests_properties(cli_bench_${case} PROPERTIES LABELS "cli;slow" TIMEOUT 300)
endforeach()
# Runs that stay flat (scripts/soak, issue 34): 200 steps in fp32, bf16 and on 2 ranks, the heap in use growing by
# at most 1 MiB per 1,000 steps after step 50 (the 2,000-step figures, resident memory too, in docs/benchmarks.md).
add_test(NAME cli_soak_short COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/scripts/soak --bin $<TARGET_FILE:flatpeak>
                                     --steps 200 --variants fp32,bf16,mpi2-balanced --seq-len 512 --batch 2 --from 50
                                     --every 25 --short)
set_tests_properties(cli_soak_short PROPERTIES LABELS "cli;slow" TIMEOUT 300 RUN_SERIAL TRUE)
# Real text, end to end (tests/cli/test_data.py, issue 34): scripts/make_token_file.py on /usr/share/common-licenses
# with a BPE tokenizer the test trains itself (.venv-tokenizers, made by scripts/deps test), then training with
# documents and held-out evaluation; byte-level documents through the document index.
foreach(case tokenizer index)
  add_test(NAME cli_data_${case} COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/cli/test_data.py
           --bin $<TARGET_FILE:flatpeak> --root ${PROJECT_SOURCE_DIR} ${case})
  set_tests_properties(cli_data_${case} PROPERTIES LABELS "cli;slow" TIMEOUT 300)
endforeach()
# bench kernels (tests/cli/test_bench_kernels.py): every entry of the kernel table at --scale small on cpu, in f32
# and bf16, timed with a positive rate or listed "not supported" / "missing"; meta lists them untimed; an unknown
# backend, a bad regex or dtype are refused. A few seconds each.
foreach(case cpu_small meta_and_bad)
  add_test(NAME cli_bench_kernels_${case} COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/cli/test_bench_kernels.py
           --bin $<TARGET_FILE:flatpeak> --root ${PROJECT_SOURCE_DIR} ${case})
  set_tests_properties(cli_bench_kernels_${case} PROPERTIES LABELS "cli;quick" TIMEOUT 120)
endforeach()
# train.checkpoint_async (tests/cli/test_ckpt_async.py): background checkpoints equal the sync ones byte for byte
# (1 rank fp32 and bf16 in shards, 2 ranks), resume from one bit-exact, kill -9 / SIGTERM mid-write, the plan's host
# copy equals the run's.
foreach(case same_files resume kill_mid_write plan_bytes)
  add_test(NAME cli_ckpt_async_${case} COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/cli/test_ckpt_async.py
           --bin $<TARGET_FILE:flatpeak> --configs ${PROJECT_SOURCE_DIR}/configs ${case})
  set_tests_properties(cli_ckpt_async_${case} PROPERTIES LABELS "cli;slow" TIMEOUT 300)
endforeach()
