# Runs `troupe topology check FILE` (or, with -DFAULTS=PLAN, a one-minute `troupe sim FILE
# --faults PLAN`) and requires a non-zero exit status and stderr matching EXPECT.
# Usage: cmake -DTROUPE=... -DFILE=... [-DFAULTS=...] -DEXPECT=<regex> -P check_cli.cmake
if(DEFINED FAULTS)
  set(command ${TROUPE} sim ${FILE} --workload chat --rate 1 --duration 1min --quiet
    --faults ${FAULTS})
else()
  set(command ${TROUPE} topology check ${FILE})
endif()
execute_process(COMMAND ${command}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "${command} exited 0 on a malformed file:\n${out}${err}")
endif()
if(NOT err MATCHES "${EXPECT}")
  message(FATAL_ERROR "stderr does not match '${EXPECT}':\n${err}")
endif()
message(STATUS "exit ${rc}, stderr:\n${err}")
