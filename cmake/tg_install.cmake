# What `cmake --install build [--prefix P]` puts under the prefix, besides
# the programs (tg_add_programs installs each into bin/):
#   share/tangram/profiles/   the shipped profiles and their retention files
#   share/tangram/tangramd.env the environment file of the systemd unit, to
#                             copy to /etc/tangram/ and edit
#   lib/systemd/system/tangramd.service  the unit, ExecStart and its
#                             documentation link pointing into the prefix
#                             (systemd reads /usr/local/lib/systemd/system)
#   share/doc/tangram/        README.md and docs/*.md (not docs' README)
# DESTDIR is honoured (staged installs, the container build).
file(GLOB tg_shipped_profiles CONFIGURE_DEPENDS
     ${CMAKE_SOURCE_DIR}/profiles/*.json)
install(FILES ${tg_shipped_profiles}
        DESTINATION ${CMAKE_INSTALL_DATADIR}/tangram/profiles)
install(FILES ${CMAKE_SOURCE_DIR}/deploy/systemd/tangramd.env
        DESTINATION ${CMAKE_INSTALL_DATADIR}/tangram)
file(GLOB tg_docs CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/docs/*.md)
list(FILTER tg_docs EXCLUDE REGEX "/README\\.md$") # the folder's own index
install(FILES ${CMAKE_SOURCE_DIR}/README.md ${tg_docs}
        DESTINATION ${CMAKE_INSTALL_DOCDIR})
# The unit names /usr/local (the default prefix) in two places; they follow
# the prefix given at install time, which only the install script knows.
install(CODE "
  set(tg_unit_src \"${CMAKE_SOURCE_DIR}/deploy/systemd/tangramd.service\")
  set(tg_unit_tmp \"${CMAKE_BINARY_DIR}/tangramd.service\")
  file(READ \"\${tg_unit_src}\" tg_unit)
  string(REPLACE \"/usr/local/bin/tangramd\"
         \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}/tangramd\"
         tg_unit \"\${tg_unit}\")
  string(REPLACE \"/usr/local/share/doc/tangram/\"
         \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_DOCDIR}/\"
         tg_unit \"\${tg_unit}\")
  file(WRITE \"\${tg_unit_tmp}\" \"\${tg_unit}\")
  file(INSTALL DESTINATION \"\${CMAKE_INSTALL_PREFIX}/lib/systemd/system\"
       TYPE FILE PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ
       FILES \"\${tg_unit_tmp}\")
")
