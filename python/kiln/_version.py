"""The package version: always KILN_VERSION_STRING of include/kiln.h (python/tests checks it
against the header and against libkiln.so's kiln_version())."""

__version__ = "0.1.0"
