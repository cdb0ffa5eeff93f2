"""test_install.py — the README's install, as a newcomer runs it: a fresh venv, `pip install
./python` from the repository root, then `import kiln` from outside the tree with KILN_LIB
unset: kiln.version() and a compile-only kernel for sm_80 (no GPU, a temporary cache), and
the C Runner (kiln/hot.c) loading from the installed package where the build has one.

Offline: the package's build backend (python/_build/kiln_build.py) needs nothing from PyPI,
and pip runs with --no-index and no configuration file. The wheel carries the library under
test: the tree's build/lib/libkiln.so, or $KILN_LIB through $KILN_WHEEL_LIB when the runner
tests another build (make asan). Skips when installed-package tests are asked for
(KILN_TEST_INSTALLED=1), outside a source tree, or where `python3 -m venv` cannot make a venv
with pip (Debian without python3-venv; `make deps` installs it). About 15-30 s.
"""

import filecmp
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

_SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # python/
ROOT = os.path.dirname(_SRC)
TREE_LIB = os.path.join(ROOT, "build", "lib", "libkiln.so")

CHECK = r"""
import json, os, sys
import kiln
from kiln import _hot
with kiln.Context(no_device=True, cache_dir=sys.argv[1]) as ctx:
    k = ctx.compile("op=decode dtype=bf16 head_dim=128 group=4", arch="sm_80")
    print(json.dumps(dict(file=kiln.__file__, lib=kiln.library_path(), version=kiln.version(),
                          package=kiln.__version__, key=k.info.key, arch=k.info.arch,
                          hot=_hot.status())))
"""


def _env(**extra):
    """The environment of the newcomer's shell: no KILN_LIB, no PYTHONPATH, no pip config."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("KILN_LIB", "KILN_WHEEL_LIB", "PYTHONPATH", "PYTHONHOME",
                        "VIRTUAL_ENV") and not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1",
               PIP_NO_INDEX="1", PIP_NO_CACHE_DIR="1")
    env.update(extra)
    return env


def _run(args, cwd, env, timeout=180):
    r = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout + r.stderr


@unittest.skipIf(os.environ.get("KILN_TEST_INSTALLED") == "1", "tests the installed package")
@unittest.skipUnless(os.path.isfile(os.path.join(ROOT, "include", "kiln.h")),
                     "not in a kiln source tree")
class TestPipInstall(unittest.TestCase):
    def test_fresh_venv_install_finds_the_library(self):
        lib = os.environ.get("KILN_LIB") or TREE_LIB
        if not os.path.isfile(lib):
            self.skipTest(f"no library to install: {lib} (run make)")
        extra = {}
        if os.path.realpath(lib) != os.path.realpath(TREE_LIB):
            extra["KILN_WHEEL_LIB"] = lib  # another build is under test: carry that one
        with tempfile.TemporaryDirectory(prefix="kiln-install-") as tmp:
            venv = os.path.join(tmp, "venv")
            code, out = _run([sys.executable, "-m", "venv", venv], tmp, _env())
            py = os.path.join(venv, "bin", "python")
            if code != 0 or _run([py, "-m", "pip", "--version"], tmp, _env())[0] != 0:
                self.skipTest(f"python3 -m venv made no venv with pip here: {out.strip()[-300:]}")

            code, out = _run([py, "-m", "pip", "install", "./python"], ROOT, _env(**extra))
            self.assertEqual(code, 0, f"pip install ./python failed:\n{out}")

            elsewhere = os.path.join(tmp, "elsewhere")  # outside the tree: no python/kiln here
            os.mkdir(elsewhere)
            code, out = _run([py, "-c", CHECK, os.path.join(tmp, "cache")], elsewhere, _env())
            self.assertEqual(code, 0, out)
            got = json.loads(out.strip().splitlines()[-1])
            site = os.path.realpath(venv)
            self.assertTrue(os.path.realpath(got["file"]).startswith(site), got)
            self.assertTrue(os.path.realpath(got["lib"]).startswith(site), got)
            self.assertTrue(filecmp.cmp(got["lib"], lib, shallow=False),
                            f"the installed {got['lib']} is not the library under test {lib}")
            self.assertEqual(got["version"], got["package"])
            self.assertEqual(got["arch"], "sm_80")
            # the C Runner built beside the library travels in the wheel and loads from there
            if os.path.isfile(os.path.join(os.path.dirname(lib), "_kiln_hot.abi3.so")):
                self.assertTrue(got["hot"].startswith("on: "), got["hot"])
                self.assertTrue(os.path.realpath(got["hot"][4:]).startswith(site), got["hot"])
            self.assertRegex(got["key"], r"^[0-9a-f]{32}$")

            # $KILN_LIB still overrides the copy in the package: a path that does not load is
            # an error naming it, never a fall-back to the bundled library.
            code, out = _run([py, "-c", "import kiln; kiln.version()"], elsewhere,
                             _env(KILN_LIB=os.path.join(tmp, "no", "libkiln.so")))
            self.assertNotEqual(code, 0)
            self.assertIn("KILN_LIB", out)
            self.assertTrue(re.search(r"no such file", out), out)


if __name__ == "__main__":
    unittest.main()
