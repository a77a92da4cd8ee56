# Checks that ctest's label selection finds the tests the labels promise (run by
# integration_labels_test): -L bigmodel lists AgentsSmolLM2 tests, -L integration lists them
# too, and -LE bigmodel (what sanitize.sh runs) lists none of them.
function(tests_for out)
  execute_process(COMMAND ${CTEST} --test-dir ${BUILD_DIR} -N ${ARGN}
    OUTPUT_VARIABLE text RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "ctest -N ${ARGN} failed (${rc}): ${text}")
  endif()
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

tests_for(big -L bigmodel)
if(NOT big MATCHES "AgentsSmolLM2\\.")
  message(FATAL_ERROR "ctest -L bigmodel selects no AgentsSmolLM2 test:\n${big}")
endif()
if(big MATCHES "AgentsStories\\.")
  message(FATAL_ERROR "ctest -L bigmodel selects stories260K tests:\n${big}")
endif()
tests_for(integration -L integration)
if(NOT integration MATCHES "AgentsSmolLM2\\." OR NOT integration MATCHES "AgentsStories\\.")
  message(FATAL_ERROR "ctest -L integration misses tests:\n${integration}")
endif()
tests_for(small -LE bigmodel)
if(small MATCHES "AgentsSmolLM2\\.")
  message(FATAL_ERROR "ctest -LE bigmodel still selects AgentsSmolLM2 tests:\n${small}")
endif()
message(STATUS "labels: bigmodel, integration and -LE bigmodel select what they promise")
