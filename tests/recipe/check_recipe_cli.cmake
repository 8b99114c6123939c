# Runs one troupe recipe command and checks its exit status and output.
#   -DTROUPE=<binary> -DARGS=<arguments separated by @@> [-DINPUT=<stdin file>]
#   [-DEXPECT_FAIL=1] [-DSTDOUT_FILE=<file the stdout must equal>] [-DSTDOUT_REGEX=<regex>]
#   [-DSTDERR_REGEX=<regex>]
#   -DROUNDTRIP=<file>: `tokenize --file FILE | detokenize` must give FILE back byte for byte.
if(DEFINED ROUNDTRIP)
  execute_process(COMMAND ${TROUPE} tokenize --file ${ROUNDTRIP}
    RESULT_VARIABLE rc OUTPUT_VARIABLE ids ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "tokenize failed (${rc}): ${err}")
  endif()
  execute_process(COMMAND ${TROUPE} detokenize --ids ${ids}
    RESULT_VARIABLE rc OUTPUT_VARIABLE text ERROR_VARIABLE err)
  file(READ ${ROUNDTRIP} want)
  if(NOT rc EQUAL 0 OR NOT text STREQUAL want)
    message(FATAL_ERROR "detokenize (${rc}) gave:\n${text}\nwanted:\n${want}\n${err}")
  endif()
  return()
endif()
string(REPLACE "@@" ";" ARGS "${ARGS}")
if(DEFINED INPUT)
  set(input INPUT_FILE ${INPUT})
endif()
execute_process(COMMAND ${TROUPE} ${ARGS} ${input}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(EXPECT_FAIL)
  if(rc EQUAL 0)
    message(FATAL_ERROR "troupe ${ARGS} exited 0:\n${out}")
  endif()
elseif(NOT rc EQUAL 0)
  message(FATAL_ERROR "troupe ${ARGS} exited ${rc}:\n${err}")
endif()
if(DEFINED STDOUT_FILE)
  file(READ ${STDOUT_FILE} want)
  if(NOT out STREQUAL want)
    message(FATAL_ERROR "stdout differs from ${STDOUT_FILE}:\n${out}")
  endif()
endif()
if(DEFINED STDOUT_REGEX AND NOT out MATCHES "${STDOUT_REGEX}")
  message(FATAL_ERROR "stdout does not match '${STDOUT_REGEX}':\n${out}")
endif()
if(DEFINED STDERR_REGEX AND NOT err MATCHES "${STDERR_REGEX}")
  message(FATAL_ERROR "stderr does not match '${STDERR_REGEX}':\n${err}")
endif()
