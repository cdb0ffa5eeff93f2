"""kiln_build.py — the PEP 517 build backend of the kiln Python package (pyproject.toml names it).

It exists so that `pip install ./python` works as the README says, offline, with nothing but
pip: it needs no setuptools, no wheel package and no download (get_requires_* return []), and
it puts the library in the wheel. What a wheel holds:

  kiln/**.py       the package and its subpackages (pure Python, ctypes)
  kiln/libkiln.so  the first of: $KILN_WHEEL_LIB (a path; an error when it is not a file),
                   python/kiln/libkiln.so, <tree>/build/lib/libkiln.so of the kiln source tree
                   this directory sits in (what `make` writes). None found: the wheel is pure
                   Python (tag py3-none-any) and kiln looks for the library at run time
                   (docs/python.md); one found: the wheel is tagged for this platform
                   (py3-none-linux_x86_64), since it carries a native library.
  kiln/_kiln_hot.abi3.so  the batch run() in C (kiln/hot.c, CPython's stable ABI), when
                   `make` built it beside that libkiln.so. Optional: where it does not load
                   (a Python before 3.10), the package runs on ctypes alone (kiln/_hot.py).

The copy is taken when the wheel is built: after rebuilding the library, reinstall (or use an
editable install, `pip install -e ./python`, whose package finds build/lib/libkiln.so of the
tree). The version is __version__ of kiln/_version.py; the metadata is below.
"""

import base64
import hashlib
import io
import os
import re
import sys
import sysconfig
import tarfile
import time
import zipfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # python/
ROOT = os.path.dirname(HERE)  # the kiln source tree, when python/ sits in one
NAME = "kiln-attention"
DIST = "kiln_attention"  # NAME as wheel and dist-info file names spell it
SUMMARY = ("Python binding of kiln, a runtime JIT generator of GPU attention kernels "
           "(FlashInfer-shaped wrappers)")
REQUIRES_PYTHON = ">=3.8"
EXTRAS = {"torch": ["torch"]}
LIBRARY = "libkiln.so"
HOT = "_kiln_hot.abi3.so"  # the optional run() in C (kiln/hot.c), taken from beside LIBRARY
# Zip entries get this time (or $SOURCE_DATE_EPOCH): the same inputs give the same wheel.
EPOCH = time.gmtime(int(os.environ.get("SOURCE_DATE_EPOCH", "315532800")))[:6]


def version():
    """__version__ of kiln/_version.py, read as text (the package is not imported)."""
    with open(os.path.join(HERE, "kiln", "_version.py"), encoding="utf-8") as f:
        m = re.search(r'^__version__\s*=\s*"([^"]+)"', f.read(), re.M)
    if not m:
        raise RuntimeError("kiln_build: no __version__ = \"...\" in kiln/_version.py")
    return m.group(1)


def library():
    """The libkiln.so to put in the wheel (see the top of this file), or None."""
    env = os.environ.get("KILN_WHEEL_LIB")
    if env:
        if not os.path.isfile(env):
            raise RuntimeError(f"kiln_build: KILN_WHEEL_LIB={env} is not a file")
        return env
    candidates = [os.path.join(HERE, "kiln", LIBRARY)]
    if os.path.isfile(os.path.join(ROOT, "include", "kiln.h")):  # python/ in a kiln tree
        candidates.append(os.path.join(ROOT, "build", "lib", LIBRARY))
    return next((p for p in candidates if os.path.isfile(p)), None)


def metadata():
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {NAME}",
        f"Version: {version()}",
        f"Summary: {SUMMARY}",
        f"Requires-Python: {REQUIRES_PYTHON}",
        "License: see the repository",
    ]
    for extra, reqs in EXTRAS.items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {r}; extra == "{extra}"' for r in reqs]
    lines.append("Description-Content-Type: text/markdown")
    with open(os.path.join(HERE, "README.md"), encoding="utf-8") as f:
        return "\n".join(lines) + "\n\n" + f.read()


def _package_files():
    """(archive name, path) of every module of kiln/ and of its subpackages (kiln/integrations)."""
    pkg = os.path.join(HERE, "kiln")
    files = []
    for top, dirs, names in os.walk(pkg):
        dirs[:] = sorted(d for d in dirs if os.path.isfile(os.path.join(top, d, "__init__.py")))
        rel = os.path.relpath(top, HERE).replace(os.sep, "/")
        files += [(f"{rel}/{n}", os.path.join(top, n)) for n in sorted(names) if n.endswith(".py")]
    return files


def _platform_tag():
    return re.sub(r"[^A-Za-z0-9]", "_", sysconfig.get_platform())


def _write_wheel(directory, files, texts, tag):
    """A wheel of `files` ((name, path)) and `texts` ((name, str)); returns its file name."""
    dist_info = f"{DIST}-{version()}.dist-info"
    pure = tag.endswith("-any")
    texts = list(texts) + [
        (f"{dist_info}/METADATA", metadata()),
        (f"{dist_info}/WHEEL", "Wheel-Version: 1.0\nGenerator: kiln_build\n"
         f"Root-Is-Purelib: {'true' if pure else 'false'}\nTag: {tag}\n"),
    ]
    entries = []  # (name, bytes, mode)
    for name, path in files:
        with open(path, "rb") as f:
            mode = 0o755 if name.endswith(".so") else 0o644
            entries.append((name, f.read(), mode))
    entries += [(name, text.encode("utf-8"), 0o644) for name, text in texts]
    record = []
    for name, data, _ in entries:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    entries.append((f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode(), 0o644))
    wheel = f"{DIST}-{version()}-{tag}.whl"
    with zipfile.ZipFile(os.path.join(directory, wheel), "w", zipfile.ZIP_DEFLATED) as z:
        for name, data, mode in entries:
            info = zipfile.ZipInfo(name, EPOCH)
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return wheel


# ---- the PEP 517 / PEP 660 hooks --------------------------------------------------------------


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    files = _package_files()
    lib = library()
    if lib:
        files.append((f"kiln/{LIBRARY}", lib))
        print(f"kiln_build: {lib} goes into the wheel as kiln/{LIBRARY}", file=sys.stderr)
        hot = os.path.join(os.path.dirname(lib), HOT)
        if os.path.isfile(hot):
            files.append((f"kiln/{HOT}", hot))
            print(f"kiln_build: {hot} goes into the wheel as kiln/{HOT}", file=sys.stderr)
    else:
        print(f"kiln_build: no {LIBRARY} found (run `make` at the repository root first, or set "
              "KILN_WHEEL_LIB): the wheel is pure Python and kiln will look for the library at "
              "run time ($KILN_LIB, the system's library path)", file=sys.stderr)
    tag = f"py3-none-{_platform_tag()}" if lib else "py3-none-any"
    return _write_wheel(wheel_directory, files, [], tag)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    # A .pth line puts python/ on sys.path: the package is the tree's, and so is its library
    # (build/lib/libkiln.so, found by kiln/_lib.py next to include/kiln.h).
    return _write_wheel(wheel_directory, [], [(f"{DIST}.pth", HERE + "\n")], "py3-none-any")


def build_sdist(sdist_directory, config_settings=None):
    base = f"{DIST}-{version()}"
    name = f"{base}.tar.gz"
    members = _package_files() + [
        ("pyproject.toml", os.path.join(HERE, "pyproject.toml")),
        ("README.md", os.path.join(HERE, "README.md")),
        ("_build/kiln_build.py", os.path.abspath(__file__)),
    ]
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as t:
        for arc, path in members:
            t.add(path, arcname=f"{base}/{arc}", recursive=False)
        data = metadata().encode("utf-8")
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        info.size, info.mtime, info.mode = len(data), time.mktime(EPOCH + (0, 0, -1)), 0o644
        t.addfile(info, io.BytesIO(data))
    return name
