"""test_basic.py — the Python package without torch and without a GPU: library loading, the
ctypes mirrors against the C layout ($KILN_ABI, set by tests/test_python.c), specs, errors,
compile-only kernels into a temporary cache, inspection, and the raw launch path's checks.

Run from the repository root: `python3 -m unittest discover -s python/tests -v` (the C runner's
python_unittest test does exactly this with KILN_LIB pointing at the build under test). The
package is imported from this source tree unless KILN_TEST_INSTALLED=1 (then: the installed one).
"""

import ctypes
import os
import re
import subprocess
import sys
import tempfile
import unittest

_SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # python/
if os.environ.get("KILN_TEST_INSTALLED") != "1" and os.path.isdir(os.path.join(_SRC, "kiln")):
    sys.path.insert(0, _SRC)

import kiln  # noqa: E402
from kiln import _lib  # noqa: E402

HEADER = os.path.join(os.path.dirname(_SRC), "include", "kiln.h")
SPEC = "op=decode head_dim=64"
CANON = "op=decode dtype=f16 head_dim=64 group=1 layout=nhd mask=none window=0 logits=none lse=0"


def _run_python(code, env_extra=None):
    """Run code in a fresh interpreter (with this test's sys.path); (exit code, output)."""
    env = dict(os.environ)
    env.update(env_extra or {})
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    return r.returncode, r.stdout + r.stderr


class TestImport(unittest.TestCase):
    def test_import_without_torch(self):
        # sys.modules["torch"] = None makes every `import torch` fail, as if it were absent.
        code = (
            "import sys; sys.modules['torch'] = None\n"
            "import kiln\n"
            "assert str(kiln.Variant('op=decode')).startswith('op=decode')\n"
            "try:\n"
            "    kiln.single_decode_with_kv_cache(None, None, None)\n"
            "except ImportError as e:\n"
            "    assert 'torch' in str(e), e\n"
            "else:\n"
            "    raise SystemExit('the wrapper ran without torch')\n"
            "print('ok')\n"
        )
        code_rc, out = _run_python(code)
        self.assertEqual(code_rc, 0, out)
        self.assertIn("ok", out)

    def test_import_does_not_load_torch(self):
        code_rc, out = _run_python("import sys, kiln; print('torch' in sys.modules)")
        self.assertEqual(code_rc, 0, out)
        self.assertEqual(out.strip().splitlines()[-1], "False")

    def test_missing_library(self):
        # The import works; the first call names the path it tried.
        code = (
            "import kiln\n"
            "try:\n"
            "    kiln.version()\n"
            "except kiln.KilnLibraryError as e:\n"
            "    print('error:', e)\n"
        )
        code_rc, out = _run_python(code, {"KILN_LIB": "/nonexistent/libkiln.so"})
        self.assertEqual(code_rc, 0, out)
        self.assertIn("/nonexistent/libkiln.so", out)
        self.assertIn("KILN_LIB", out)

    def test_versions(self):
        self.assertEqual(kiln.version(), kiln.__version__)
        if os.path.exists(HEADER):
            with open(HEADER) as f:
                m = re.search(r'#define KILN_VERSION_STRING "([^"]+)"', f.read())
            self.assertIsNotNone(m)
            self.assertEqual(kiln.__version__, m.group(1))
        self.assertRegex(kiln.nvrtc_version(), r"^\d+\.\d+$")

    def test_library_path(self):
        path = kiln.library_path()
        self.assertTrue(os.path.exists(path), path)
        if os.environ.get("KILN_LIB"):
            self.assertEqual(path, os.environ["KILN_LIB"])


class TestABI(unittest.TestCase):
    def test_struct_layout(self):
        abi = os.environ.get("KILN_ABI")
        if not abi:
            self.skipTest("KILN_ABI not set (tests/test_python.c sets it)")
        checked, wrong = 0, []
        for item in abi.split(","):
            name, _, value = item.partition("=")
            struct, _, field = name.partition(".")
            self.assertIn(struct, _lib.ABI_STRUCTS, f"{struct} has no ctypes mirror in _lib.py")
            cls = _lib.ABI_STRUCTS[struct]
            if field and not hasattr(cls, field):
                wrong.append(f"{name}: no such field in the ctypes mirror")
                continue
            got = getattr(cls, field).offset if field else ctypes.sizeof(cls)
            if got != int(value):
                wrong.append(f"{name}: ctypes {got} vs C {value}")
            checked += 1
        self.assertEqual(wrong, [], "python/kiln/_lib.py no longer mirrors include/kiln.h")
        # Every mirrored struct's size is among what the C side sent.
        sizes = {item.partition("=")[0] for item in abi.split(",") if "." not in item}
        self.assertEqual(sizes, set(_lib.ABI_STRUCTS))
        self.assertGreater(checked, 10)

    def test_status_table(self):
        # The Python table has the C enum's entries in its order: the first name past the end
        # is "unknown status", and a few descriptions line up.
        n = len(_lib.STATUS_NAMES)
        self.assertEqual(kiln.status_str(n), "unknown status")
        self.assertNotEqual(kiln.status_str(n - 1), "unknown status")
        self.assertEqual(kiln.status_str(_lib.STATUS["OK"]), "ok")
        self.assertEqual(kiln.status_str(_lib.STATUS["PARSE"]), "spec does not parse")
        self.assertEqual(kiln.status_str(_lib.STATUS["NVRTC"]), "NVRTC compile failed")
        self.assertEqual(kiln.status_str(_lib.STATUS["CACHE_MISS"]), "kernel not in cache (strict mode)")
        self.assertEqual(kiln.status_str(_lib.STATUS["MISMATCH"]),
                         "result does not match the reference")


class TestVariant(unittest.TestCase):
    CANONICAL = [
        CANON,
        "op=prefill dtype=bf16 head_dim=128 group=4 layout=nhd mask=causal window=0 logits=softcap lse=0",
        "op=prefill dtype=f16 head_dim=256 group=8 layout=hnd mask=none window=1 logits=alibi lse=1",
        "op=decode q_dtype=bf16 kv_dtype=bf16 out_dtype=f16 head_dim=128 group=64 layout=nhd "
        "mask=none window=0 logits=none lse=0",
    ]

    def test_roundtrip(self):
        for spec in self.CANONICAL:
            v = kiln.Variant.from_spec(spec)
            self.assertEqual(str(v), spec)
            self.assertEqual(kiln.Variant(str(v)), v)
            self.assertEqual(hash(kiln.Variant(str(v))), hash(v))

    def test_canonicalises(self):
        v = kiln.Variant("  head_dim=64\t op=decode ")
        self.assertEqual(str(v), CANON)
        self.assertEqual(v.spec, CANON)
        self.assertEqual(repr(v), f"kiln.Variant({CANON!r})")
        self.assertEqual(str(kiln.Variant()), str(kiln.Variant.default()))

    def test_fields(self):
        v = kiln.Variant(self.CANONICAL[2])
        self.assertEqual(v.op, "prefill")
        self.assertEqual(v.dtype, "f16")
        self.assertEqual(v.head_dim, 256)
        self.assertEqual(v.group, 8)
        self.assertEqual(v.layout, "hnd")
        self.assertEqual(v.mask, "none")
        self.assertIs(v.window, True)
        self.assertEqual(v.logits, "alibi")
        self.assertIs(v.lse, True)
        self.assertEqual(v.params, ())
        self.assertEqual(v.logits_expr, "")
        self.assertEqual(v.mask_data, "none")
        mixed = kiln.Variant(self.CANONICAL[3])
        self.assertIsNone(mixed.dtype)
        self.assertEqual((mixed.q_dtype, mixed.kv_dtype, mixed.out_dtype), ("bf16", "bf16", "f16"))
        self.assertEqual(v.to_dict()["head_dim"], 256)

    def test_keywords_and_replace(self):
        v = kiln.Variant(op="decode", dtype="bf16", head_dim=128, group=4, window=True)
        self.assertEqual(
            str(v),
            "op=decode dtype=bf16 head_dim=128 group=4 layout=nhd mask=none window=1 logits=none lse=0",
        )
        w = v.replace(mask="causal", lse=1, out_dtype="f16")
        self.assertEqual(w.mask, "causal")
        self.assertIs(w.lse, True)
        self.assertIsNone(w.dtype)
        self.assertEqual(v.mask, "none")  # v is unchanged
        self.assertEqual(kiln.Variant(SPEC, group=2).group, 2)

    def test_bad_spec(self):
        for spec, token in [
            ("op=fast", "op=fast"),
            ("op=decode head_dim=96", "head_dim=96"),
            ("group=0", "group=0"),
            ("bogus=1", "bogus=1"),
            ("op=decode op=prefill", "op=prefill"),
            ("head_dim", "head_dim"),
        ]:
            with self.subTest(spec=spec):
                with self.assertRaises(kiln.KilnParseError) as cm:
                    kiln.Variant.from_spec(spec)
                e = cm.exception
                self.assertIn(token, e.message)
                self.assertIn(token, str(e))
                self.assertEqual(e.status, _lib.STATUS["PARSE"])
                self.assertEqual(e.status_name, "PARSE")
                self.assertIsInstance(e, ValueError)
                self.assertIsInstance(e, kiln.KilnError)

    def test_bad_fields(self):
        with self.assertRaises(kiln.KilnParseError) as cm:
            kiln.Variant(op="fast")
        self.assertIn("decode, prefill", str(cm.exception))
        with self.assertRaises(kiln.KilnUnsupportedError) as cm:
            kiln.Variant(head_dim=96)
        self.assertIn("head_dim", str(cm.exception))
        with self.assertRaises(kiln.KilnUnsupportedError):
            kiln.Variant(q_dtype="bf16")  # q_dtype must equal kv_dtype
        with self.assertRaises(TypeError):
            kiln.Variant(colour="blue")
        with self.assertRaises(TypeError):
            kiln.Variant(head_dim="64")
        with self.assertRaises(TypeError):
            kiln.Variant(42)


class TestCompile(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="kiln-py-")
        self.cache = os.path.join(self.tmp.name, "cache")

    def tearDown(self):
        self.tmp.cleanup()

    def test_compile_then_cached(self):
        with kiln.Context(cache_dir=self.cache, no_device=True) as ctx:
            self.assertFalse(ctx.device.present)
            self.assertEqual(ctx.cache_path, os.path.join(self.cache, "kernels.db"))
            k = ctx.compile(SPEC, arch="sm_90a")
            info = k.info
            self.assertFalse(info.from_cache)
            self.assertEqual(info.arch, "sm_90a")
            self.assertEqual(info.spec, CANON)
            self.assertRegex(info.key, r"^[0-9a-f]{32}$")
            self.assertGreater(info.threads, 0)
            self.assertGreater(info.compile_ms, 0)
            self.assertIn("generated", k.source)
            self.assertIn(CANON, k.key_material)
            self.assertIsInstance(k.log, str)
            cubin = k.cubin
            self.assertTrue(cubin.startswith(b"\x7fELF"), cubin[:8])
            self.assertEqual(len(cubin), info.cubin_bytes)
            # The memo: the same variant is the same kernel object.
            self.assertIs(ctx.compile(kiln.Variant(SPEC), arch="sm_90a"), k)
            key = info.key
        with kiln.Context(cache_dir=self.cache, no_device=True) as ctx:
            k = ctx.compile(SPEC, arch="sm_90a")
            self.assertTrue(k.info.from_cache)
            self.assertEqual(k.info.key, key)
            self.assertTrue(k.cubin.startswith(b"\x7fELF"))

    def test_kernel_family(self):
        """The family a kernel was generated for: wgmma for a d128 or d64 prefill on sm_90a,
        mask data included, mma.sync for the same on sm_80 or with few query tokens a request
        (q_tokens), simt for a single-request decode; a batch decode of group 1 is on tensor
        cores (mma.sync)."""
        with kiln.Context(cache_dir=self.cache, no_device=True) as ctx:
            pre = "op=prefill dtype=bf16 head_dim=128 group=4 mask=causal"
            self.assertEqual(ctx.compile(pre, arch="sm_90a").family, "wgmma")
            self.assertEqual(ctx.compile(pre, arch="sm_80").family, "mma.sync")
            self.assertEqual(ctx.compile(pre.replace("128", "64"), arch="sm_90a").family,
                             "wgmma")
            self.assertEqual(ctx.compile(pre + " mask_data=bsr", arch="sm_90a").family,
                             "wgmma")
            self.assertEqual(ctx.compile(pre + " mask_data=bsr", arch="sm_80").family,
                             "mma.sync")
            self.assertEqual(ctx.compile("op=decode dtype=bf16 head_dim=64 group=1",
                                         arch="sm_90a").family, "simt")
            self.assertEqual(ctx.compile("op=decode dtype=bf16 head_dim=64 group=1 kv=paged",
                                         arch="sm_90a").family, "mma.sync")

    def test_context_arch(self):
        with kiln.Context(no_cache=True, no_device=True, arch="sm_90") as ctx:
            self.assertEqual(ctx.arch, "sm_90a")  # normalised
            self.assertEqual(ctx.cache_path, "")
            k = ctx.compile(SPEC)  # the context's arch
            self.assertEqual(k.info.arch, "sm_90a")

    def test_bad_arch(self):
        with kiln.Context(no_cache=True, no_device=True) as ctx:
            with self.assertRaises(kiln.KilnError) as cm:
                ctx.compile(SPEC, arch="sm_70")
            self.assertIn("sm_70", str(cm.exception))
            with self.assertRaises(kiln.KilnNoDeviceError):
                ctx.compile(SPEC)  # no arch named, no device

    def test_no_device(self):
        with kiln.Context(no_cache=True, no_device=True) as ctx:
            with self.assertRaises(kiln.KilnNoDeviceError) as cm:
                ctx.kernel(SPEC)
            self.assertTrue(cm.exception.message)
            self.assertTrue(ctx.errmsg)

    def test_bad_cache_dir(self):
        with self.assertRaises(kiln.KilnError) as cm:
            kiln.Context(cache_dir="/nonexistent/dir/cache", no_device=True)
        self.assertIn("/nonexistent", str(cm.exception))

    def test_raw_launch_checks(self):
        # The launch path's host checks run without a GPU: a compile-only kernel refuses.
        with kiln.Context(no_cache=True, no_device=True) as ctx:
            k = ctx.compile(SPEC, arch="sm_90a")
            with self.assertRaises(kiln.KilnInvalidArgumentError) as cm:
                k.single_decode(kiln.AttnArgs())
            self.assertIn("not loaded", str(cm.exception))
            with self.assertRaises(kiln.KilnInvalidArgumentError) as cm:
                k.single_prefill(kiln.AttnArgs())
            self.assertIn("decode kernel", str(cm.exception))

    def test_closed(self):
        ctx = kiln.Context(no_cache=True, no_device=True)
        k = ctx.compile(SPEC, arch="sm_90a")
        ctx.close()
        ctx.close()  # idempotent
        self.assertTrue(ctx.closed)
        with self.assertRaises(kiln.KilnError):
            ctx.compile(SPEC, arch="sm_90a")
        with self.assertRaises(kiln.KilnError):
            k.source  # noqa: B018
        self.assertIn("closed", repr(ctx))


class TestErrors(unittest.TestCase):
    def test_classes(self):
        from kiln.errors import error_for

        expected = {
            "INVALID_ARGUMENT": kiln.KilnInvalidArgumentError,
            "PARSE": kiln.KilnParseError,
            "UNSUPPORTED": kiln.KilnUnsupportedError,
            "NO_DEVICE": kiln.KilnNoDeviceError,
            "CUDA": kiln.KilnCudaError,
            "NVRTC": kiln.KilnCompileError,
            "CACHE": kiln.KilnCacheError,
            "CACHE_MISS": kiln.KilnCacheMiss,
            "NOT_FOUND": kiln.KilnNotFoundError,
            "NO_MEMORY": kiln.KilnNoMemoryError,
            "WORKSPACE": kiln.KilnWorkspaceError,
            "IO": kiln.KilnIOError,
            "MISMATCH": kiln.KilnMismatchError,
        }
        self.assertEqual(set(expected) | {"OK"}, set(_lib.STATUS_NAMES))
        for name, cls in expected.items():
            e = error_for(_lib.STATUS[name], "what failed")
            self.assertIs(type(e), cls)
            self.assertEqual(e.status_name, name)
            self.assertEqual(str(e), f"what failed [{name}]")
        self.assertIs(type(error_for(999, "x")), kiln.KilnError)

    def test_batch_names_exist(self):
        # The FlashInfer batch names are the wrappers now (tests: test_batch.py).
        for name in ("BatchDecodeWithPagedKVCacheWrapper", "BatchPrefillWithPagedKVCacheWrapper",
                     "BatchPrefillWithRaggedKVCacheWrapper", "MultiLevelCascadeAttentionWrapper",
                     "merge_state", "merge_state_in_place", "merge_states"):
            self.assertTrue(callable(getattr(kiln, name)), name)

if __name__ == "__main__":
    unittest.main()
