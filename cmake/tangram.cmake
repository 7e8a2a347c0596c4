# Helpers shared by the folder CMakeLists.

# tg_add_library(NAME DIR [LIBS ...]): a static library from every *.c in DIR
# except program mains (tangram*.c); CONFIGURE_DEPENDS so new files are
# picked up without editing CMake.
function(tg_add_library name dir)
  file(GLOB srcs CONFIGURE_DEPENDS ${dir}/*.c)
  list(FILTER srcs EXCLUDE REGEX "/tangram[^/]*\\.c$")
  if(NOT srcs)
    add_library(${name} INTERFACE)
    target_link_libraries(${name} INTERFACE ${ARGN})
    return()
  endif()
  add_library(${name} STATIC ${srcs})
  target_link_libraries(${name} PUBLIC ${ARGN})
endfunction()

# tg_add_programs(DIR): every DIR/tangram*.c becomes a program named after
# it with '_' turned into '-' (tangram_worker.c -> tangram-worker,
# tangramd.c -> tangramd), installed into bin/ by cmake --install; the
# files X_*.c beside a tangram_X.c are parts of that program.
function(tg_add_programs dir)
  file(GLOB mains CONFIGURE_DEPENDS ${dir}/tangram*.c)
  foreach(src ${mains})
    get_filename_component(stem ${src} NAME_WE)
    string(REPLACE "_" "-" prog ${stem})
    # A program tangram_X.c may be split into X_*.c beside it.
    string(REGEX REPLACE "^tangram_" "" part ${stem})
    file(GLOB helpers CONFIGURE_DEPENDS ${dir}/${part}_*.c)
    add_executable(${prog} ${src} ${helpers})
    target_link_libraries(${prog} PRIVATE tg_all)
    install(TARGETS ${prog} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endforeach()
endfunction()

# tg_add_unit_tests(DIR LABEL): every DIR/test_*.c becomes a cmocka program
# and a ctest test (one process each, 900 s timeout: the limit only ends a
# hang, and must hold for a 2-core machine running ctest -j4 under ASan,
# where the slowest unit test, seconds alone, runs many times slower). Only
# the "gpu" label may skip: there exit code 77 means "no device"; anywhere
# else it fails.
function(tg_add_unit_tests dir label)
  file(GLOB tests CONFIGURE_DEPENDS ${dir}/test_*.c)
  foreach(src ${tests})
    get_filename_component(stem ${src} NAME_WE)
    add_executable(${stem} ${src})
    target_link_libraries(${stem} PRIVATE tg_testsupport tg_all PkgConfig::CMOCKA)
    set_target_properties(${stem} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
    add_test(NAME ${stem} COMMAND ${stem})
    set_tests_properties(${stem} PROPERTIES
      LABELS ${label} TIMEOUT 900 ENVIRONMENT "${TANGRAM_TEST_ENV}")
    if(label STREQUAL "gpu")
      set_tests_properties(${stem} PROPERTIES SKIP_RETURN_CODE 77)
    endif()
  endforeach()
endfunction()
