# The model against its PyTorch twin (tests/reference/*.py, run with /usr/bin/python3, which has torch).
# Included from tests/CMakeLists.txt, so CMAKE_CURRENT_SOURCE_DIR is tests/.

# The twin checked on its own: naive-loop attention and MoE, gradcheck, safetensors I/O, check_case.py.
add_test(NAME twin_selfcheck COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/reference/test_twin_selfcheck.py)
set_tests_properties(twin_selfcheck PROPERTIES LABELS "reference;slow" TIMEOUT 300)

# The model against the twin: dump_case builds the model, runs one forward/backward and writes
# weights, batch, logits, losses and every gradient; check_case.py recomputes them in float64 and
# fails on any tensor off by more than 1e-5 (max-relative), or when no expert went without tokens.
# The _docs cases pack documents into the batch (EOS at fixed positions, Note [Documents from EOS] in
# src/data/documents.h): the twin runs each document's attention alone (per_document in
# qwen3_moe_twin.py), so flatpeak's document starts are checked against packing by definition.
add_executable(dump_case ${CMAKE_CURRENT_SOURCE_DIR}/reference/dump_case.cpp)
target_compile_options(dump_case PRIVATE ${FLATPEAK_WARNINGS})
target_link_libraries(dump_case PRIVATE flatpeak_engine fp_bench)
foreach(case gqa_norm mha_nonorm hf_layers yarn mla mla_yarn gqa_norm_docs gqa_window_docs mla_docs gptoss gptoss_yarn
             gptoss_docs)
  add_test(NAME model_vs_twin_${case}
           COMMAND sh -c "$<TARGET_FILE:dump_case> ${CMAKE_CURRENT_BINARY_DIR}/case_${case}.safetensors ${case} && /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/reference/check_case.py ${CMAKE_CURRENT_BINARY_DIR}/case_${case}.safetensors --rtol 1e-5")
  set_tests_properties(model_vs_twin_${case} PROPERTIES LABELS "reference;quick" TIMEOUT 600)
endforeach()

# The same cases in flatpeak's bf16 recipe against the bf16 twin (the twin with flatpeak's cast points,
# Note [The bf16 twin's cast points] in qwen3_moe_twin.py): dump_case ... bf16 writes the rounded weights
# and the widened outputs; check_case.py reads "precision": "bf16" from the file and fails on a loss
# off by more than 5e-3 relative, logits by 5e-3 or any gradient by 3e-2 norm-relative. The DeepSeek-V3
# cases keep the routing bias f32 (Note [Parameters kept in f32] in model/params.h) and take a larger
# router (Note [A bf16 DeepSeek case away from ties] in dump_case.cpp).
foreach(case gqa_norm mha_nonorm hf_layers yarn mla mla_yarn gqa_norm_docs gptoss gptoss_yarn)
  add_test(NAME model_vs_twin_bf16_${case}
           COMMAND sh -c "$<TARGET_FILE:dump_case> ${CMAKE_CURRENT_BINARY_DIR}/case_${case}_bf16.safetensors ${case} bf16 && /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/reference/check_case.py ${CMAKE_CURRENT_BINARY_DIR}/case_${case}_bf16.safetensors")
  set_tests_properties(model_vs_twin_bf16_${case} PROPERTIES LABELS "reference;quick" TIMEOUT 600)
endforeach()

# 10 AdamW steps of the whole model against the twin with torch.optim.AdamW: losses within 1e-4.
add_executable(train_case ${CMAKE_CURRENT_SOURCE_DIR}/reference/train_case.cpp)
target_compile_options(train_case PRIVATE ${FLATPEAK_WARNINGS})
target_link_libraries(train_case PRIVATE flatpeak_engine fp_bench)
add_test(NAME training_vs_twin
         COMMAND sh -c "$<TARGET_FILE:train_case> ${CMAKE_CURRENT_BINARY_DIR}/train_case.safetensors 10 && /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/reference/check_training.py ${CMAKE_CURRENT_BINARY_DIR}/train_case.safetensors --rtol 1e-4")
set_tests_properties(training_vs_twin PROPERTIES LABELS "reference;quick" TIMEOUT 600)
