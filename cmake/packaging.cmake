# The .deb for nodes without Kubernetes (Debian 12):
#   cmake --build --preset release && (cd build/release && cpack -G DEB)
# gives build/release/allocd_<version>_<arch>.deb with
#   /usr/bin/allocd, /usr/bin/allocctl               (the install rules in tools/)
#   /usr/lib/python3/dist-packages/allocd/           (import allocd: its .py
#       files, the tracker's source and liballocd_client.so, +
#       liballocd_torch.so with the CUDA toolkit)
#   /usr/lib/allocd/liballocd_interpose.so           (allocd run; CUDA toolkit only)
#   /usr/lib/allocd/_run/sitecustomize.py            (allocd run's Python start)
#   /usr/lib/systemd/system/allocd.service           (deploy/systemd)
#   /etc/default/allocd, /etc/allocd/config.json     (conffiles)
# and maintainer scripts that create the system user and group allocd. Its
# Depends come from dpkg-shlibdeps (the libraries the binaries load) plus
# python3.
#
# The interposer is also part of a plain `cmake --install` (<prefix>/lib/allocd,
# where an installed `allocd run` looks); the Python package (pip installs it
# elsewhere: `pip install build/release/python`), the unit and the files
# under /etc only of the package (components python and system, excluded
# from a plain install, which must not write to /etc).
if(NOT ALLOCD_BUILD_SERVER)
  return()
endif()

# Debian's python3 imports distribution packages from here.
set(_python_dir lib/python3/dist-packages/allocd)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/client/python/allocd/
        DESTINATION ${_python_dir} COMPONENT python EXCLUDE_FROM_ALL
        FILES_MATCHING PATTERN "*.py" PATTERN "*.cpp"
        PATTERN "__pycache__" EXCLUDE)
install(TARGETS allocd_client_c LIBRARY DESTINATION ${_python_dir}
        COMPONENT python EXCLUDE_FROM_ALL)
if(TARGET allocd_torch)
  install(TARGETS allocd_torch LIBRARY DESTINATION ${_python_dir}
          COMPONENT python EXCLUDE_FROM_ALL)
endif()
if(TARGET allocd_interpose)
  # Where `allocd run` looks: ../lib/allocd next to the allocd binary. The
  # Python start goes beside it: it imports the job's own allocd package.
  install(TARGETS allocd_interpose LIBRARY DESTINATION lib/allocd)
  install(FILES ${PROJECT_SOURCE_DIR}/client/python/allocd/_run/sitecustomize.py
          DESTINATION lib/allocd/_run)
endif()

set(_systemd ${PROJECT_SOURCE_DIR}/deploy/systemd)
install(FILES ${_systemd}/allocd.service DESTINATION lib/systemd/system
        COMPONENT system EXCLUDE_FROM_ALL)
install(FILES ${_systemd}/allocd.default DESTINATION /etc/default RENAME allocd
        COMPONENT system EXCLUDE_FROM_ALL)
install(FILES ${_systemd}/config.json DESTINATION /etc/allocd
        COMPONENT system EXCLUDE_FROM_ALL)

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME allocd)
set(CPACK_PACKAGE_VENDOR allocd)
set(CPACK_PACKAGE_CONTACT "allocd maintainers <allocd@users.noreply.github.com>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "node daemon and tools for PyTorch's CUDA caching allocator")
set(CPACK_PACKAGE_DESCRIPTION
    "allocd serve shares a node's GPU memory between training processes, pushes\n\
allocator configs to them and exports Prometheus metrics; allocctl\n\
administers it; import allocd connects PyTorch jobs. allocd replay, tune and\n\
check-config model PyTorch's caching allocator offline.")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
# One package of every component (the binaries are "Unspecified").
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_GROUPING ALL_COMPONENTS_IN_ONE)
set(CPACK_COMPONENTS_ALL Unspecified python system)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "python3, passwd")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${_systemd}/deb/conffiles ${_systemd}/deb/postinst ${_systemd}/deb/prerm
    ${_systemd}/deb/postrm)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)
