# The tier of every gtest case (Note [Test tiers], tests/CMakeLists.txt), read by ctest after the discovered
# lists: quick, unless named below. FLATPEAK_GTEST_BINARIES (gtest_binaries.cmake in the build tree) holds
# "<binary>:<area>" for each gtest binary; <binary>_TESTS is the list of its cases.

# A second or more on 2 cores (ctest's times).
set(flatpeak_slow
    Attention.MatchesReference
    Attention.SlidingWindowMatchesDoubleReference
    AttentionBlock.MatchesReference
    AttentionBlock.OneSweepEqualsTwoPassBitwise
    AttentionBlock.RingMatchesWholeSequence
    AttentionBlock.SlidingWindowMatchesReference
    AttentionBlock.SlidingWindowRingMatchesWholeSequence
    AttentionBlock.ValueWidthMatchesReference
    AdamwUpdate.Bf16GradAndCopyAreTheF32UpdateOfTheWidenedGrad
    AdamwUpdate.MatchesReferenceOnOddSizes
    Router.ForwardBackwardMatchRef
    DeepseekV3.Bf16OffloadStreamOnHostEqualsDeviceAdamW
    DeepseekV3.RoutingBiasFollowsTheLoads
    PlanRepeats.EveryPresetAsTheFullReplay
    PlanReuse.EveryPresetAsRerouted
    Sco.Bf16TenStepsBitIdenticalToDevice
    Sco.RandomCopyDelaysChangeNothing
    Safetensors.CrossCheckWithPython)
# Wall-clock bounds: each runs alone, so that no other test loads the machine while it measures.
set(flatpeak_timing EmulatedLink.TimingBackToBackPiecesCarryTheLinkClock)

foreach(entry ${FLATPEAK_GTEST_BINARIES})
  string(REPLACE ":" ";" parts "${entry}")
  list(GET parts 0 binary)
  list(GET parts 1 area)
  foreach(t ${${binary}_TESTS})
    list(FIND flatpeak_timing "${t}" timing)
    list(FIND flatpeak_slow "${t}" slow)
    if(NOT timing EQUAL -1)
      set_tests_properties("${t}" PROPERTIES LABELS "${area};timing" RUN_SERIAL TRUE)
    elseif(NOT slow EQUAL -1)
      set_tests_properties("${t}" PROPERTIES LABELS "${area};slow")
    else()
      set_tests_properties("${t}" PROPERTIES LABELS "${area};quick")
    endif()
  endforeach()
endforeach()
