# The embedding example against an installed troupe (ctest `embed`, label `embed`).
#
#   cmake -DBUILD_DIR=<troupe build> -DSOURCE_DIR=<troupe source> -DWORK_DIR=<scratch>
#         [-DGENERATOR=Ninja] [-DCXX_COMPILER=...] [-DBUILD_TYPE=...] -P run_embed.cmake
#
# 1. `cmake --install` the current build into WORK_DIR/prefix; run the installed CLI once;
# 2. configure examples/embed against that prefix only (find_package(troupe CONFIG)), build it;
# 3. check that it compiles against the installed headers, not the source or build tree;
# 4. run it: it exits non-zero when one of its own checks fails.
foreach(var BUILD_DIR SOURCE_DIR WORK_DIR)
  if(NOT ${var})
    message(FATAL_ERROR "run_embed.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT GENERATOR)
  set(GENERATOR Ninja)
endif()

function(run step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("-- ${step}: ${ARGN}\n${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "embed: ${step} failed (${rc})")
  endif()
endfunction()

set(prefix ${WORK_DIR}/prefix)
set(example_build ${WORK_DIR}/build)
file(REMOVE_RECURSE ${WORK_DIR})

run(install ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
# The installed CLI finds the installed model configs (<prefix>/share/troupe/models).
run(installed_cli ${CMAKE_COMMAND} -E env --unset=TROUPE_MODELS_DIR
  ${prefix}/bin/troupe perf-model --model deepseek-v4.1-flash --hardware H200 --phase decode
  --ep 8 --context 4096 --requests-per-gpu 16 --json)

set(configure_args -S ${SOURCE_DIR}/examples/embed -B ${example_build} -G ${GENERATOR}
  -Dtroupe_DIR=${prefix}/lib/cmake/troupe
  -DCMAKE_PREFIX_PATH=${prefix}
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
  -DCMAKE_EXPORT_COMPILE_COMMANDS=ON)
if(CXX_COMPILER)
  list(APPEND configure_args -DCMAKE_CXX_COMPILER=${CXX_COMPILER})
endif()
if(BUILD_TYPE)
  list(APPEND configure_args -DCMAKE_BUILD_TYPE=${BUILD_TYPE})
endif()
run(configure ${CMAKE_COMMAND} ${configure_args})
run(build ${CMAKE_COMMAND} --build ${example_build})

# Headers must come from the prefix: no -I/-isystem into troupe's source or build tree.
file(READ ${example_build}/compile_commands.json commands)
foreach(tree ${SOURCE_DIR} ${BUILD_DIR})
  foreach(flag "-I${tree} " "-isystem ${tree} " "-I${tree}\"" "-isystem ${tree}\"")
    string(FIND "${commands}" "${flag}" at)
    if(NOT at EQUAL -1)
      message(FATAL_ERROR "embed: the example compiles with '${flag}' (not the installed headers)")
    endif()
  endforeach()
endforeach()

run(example ${example_build}/embed_pipeline)
