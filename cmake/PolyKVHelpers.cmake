# polykv_add_gtest(NAME SOURCES a.cc b.cc LIBS lib... [LABELS l...] [TIMEOUT s] [TEST_PREFIX p])
# Builds one GoogleTest binary and registers each TEST with ctest (gtest_discover_tests).
function(polykv_add_gtest name)
  cmake_parse_arguments(ARG "" "TIMEOUT;TEST_PREFIX" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gtest_main)
  target_compile_definitions(${name} PRIVATE
    POLYKV_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
    POLYKV_TEST_DATA_DIR="${PROJECT_SOURCE_DIR}/tests/data"
    POLYKV_BINARY_DIR="${PROJECT_BINARY_DIR}")
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 600)
  endif()
  # A GTEST_SKIP() is reported by ctest as skipped, never counted as a pass.
  set(props TIMEOUT ${ARG_TIMEOUT} SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
  if(ARG_LABELS)
    # gtest_discover_tests flattens its PROPERTIES, so "a;b" would set label a and a bogus
    # property b: one label per test (ctest -L is a regex, so "integration-bigmodel" is
    # selected by -L integration and by -L bigmodel).
    list(LENGTH ARG_LABELS label_count)
    if(label_count GREATER 1)
      message(FATAL_ERROR "polykv_add_gtest(${name}): one label only, got \"${ARG_LABELS}\" "
        "(join them with '-', e.g. integration-bigmodel)")
    endif()
    list(APPEND props LABELS "${ARG_LABELS}")
  endif()
  gtest_discover_tests(${name} TEST_PREFIX "${ARG_TEST_PREFIX}" DISCOVERY_TIMEOUT 120 PROPERTIES ${props})
endfunction()

# polykv_add_library(name STATIC|SHARED GLOBS pattern... [EXCLUDE file...])
# A module's library: the sources matching GLOBS (relative to the calling folder) less EXCLUDE,
# its public headers in include/ (as <polykv/...>, installed to CMAKE_INSTALL_INCLUDEDIR) and
# its private ones in src/.
function(polykv_add_library name type)
  cmake_parse_arguments(ARG "" "" "GLOBS;EXCLUDE" ${ARGN})
  list(TRANSFORM ARG_GLOBS PREPEND "${CMAKE_CURRENT_SOURCE_DIR}/")
  file(GLOB srcs CONFIGURE_DEPENDS ${ARG_GLOBS})
  foreach(f IN LISTS ARG_EXCLUDE)
    list(REMOVE_ITEM srcs "${CMAKE_CURRENT_SOURCE_DIR}/${f}")
  endforeach()
  add_library(${name} ${type} ${srcs})
  target_include_directories(${name} PUBLIC
    $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
    PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
endfunction()
