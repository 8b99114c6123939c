# Runs `troupe topology check FILE` and requires a non-zero exit status and stderr matching
# EXPECT. Usage: cmake -DTROUPE=... -DFILE=... -DEXPECT=<regex> -P check_cli.cmake
execute_process(COMMAND ${TROUPE} topology check ${FILE}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "troupe topology check ${FILE} exited 0 on a malformed file:\n${out}${err}")
endif()
if(NOT err MATCHES "${EXPECT}")
  message(FATAL_ERROR "stderr does not match '${EXPECT}':\n${err}")
endif()
message(STATUS "exit ${rc}, stderr:\n${err}")
