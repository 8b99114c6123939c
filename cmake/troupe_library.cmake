# troupe_library(NAME SOURCES ... DEPS ...): one library per source folder.
# Headers are included as "<folder>/<file>.hpp" from the repository root; generated headers
# (Cap'n Proto) from the build root. A folder with headers only becomes an INTERFACE library.
#
# Every library is installed and exported as troupe::<folder> (troupe_runtime ->
# troupe::runtime) in the troupeTargets export set; its folder's headers are installed under
# include/<folder>/, keeping their relative paths, so that "<folder>/<file>.hpp" resolves
# against <prefix>/include exactly as it does against the source tree.
include(GNUInstallDirs)

function(troupe_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  set(includes
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
    $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  if(ARG_SOURCES)
    add_library(${name} STATIC ${ARG_SOURCES})
    target_include_directories(${name} PUBLIC ${includes})
    target_link_libraries(${name} PUBLIC ${ARG_DEPS})
  else()
    add_library(${name} INTERFACE)
    target_include_directories(${name} INTERFACE ${includes})
    target_link_libraries(${name} INTERFACE ${ARG_DEPS})
  endif()

  string(REGEX REPLACE "^troupe_" "" export_name ${name})
  set_target_properties(${name} PROPERTIES EXPORT_NAME ${export_name})
  add_library(troupe::${export_name} ALIAS ${name})
  install(TARGETS ${name} EXPORT troupeTargets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  file(RELATIVE_PATH folder ${PROJECT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR})
  file(GLOB_RECURSE headers RELATIVE ${CMAKE_CURRENT_SOURCE_DIR} CONFIGURE_DEPENDS
    ${CMAKE_CURRENT_SOURCE_DIR}/*.hpp)
  foreach(header IN LISTS headers)
    get_filename_component(dir ${header} DIRECTORY)
    install(FILES ${header} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/${folder}/${dir})
  endforeach()
endfunction()
