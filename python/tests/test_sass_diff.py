"""tools/scripts/sass_diff.py against two small caches and a stand-in cuobjdump (it prints a
"cubin"'s lines as instructions): kernels are paired across a template change by their key
material without the templates line, and the ones whose SASS changed are counted and grouped.
CPU only."""
import io
import os
import sqlite3
import stat
import sys
import tempfile
import textwrap
import unittest
from contextlib import redirect_stderr, redirect_stdout

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "scripts"))

import sass_diff  # noqa: E402

FAKE = textwrap.dedent("""\
    #!{python}
    import sys
    text = open(sys.argv[-1], "rb").read().decode()
    if "broken" in text:
        sys.exit(3)
    print("\\tcode for sm_90a")
    for i, line in enumerate(text.split(";")):
        print("        /*%04x*/  %s ;  /* 0x0 */" % (16 * i, line.strip()))
    """)

PLAIN = "op=prefill dtype=bf16 head_dim=128 group=4 layout=nhd mask=causal window=0 logits=none lse=0"
CAP = "op=prefill dtype=bf16 head_dim=128 group=4 layout=nhd mask=causal window=0 logits=softcap lse=0"
SNIP = PLAIN + ' params=cap:f32 logits_expr="cap * tanhf ( logits / cap )"'
DEC = "op=decode dtype=f16 head_dim=64 group=1 layout=nhd mask=none window=0 logits=alibi lse=1"


def material(spec, templates, config="threads=384"):
    return (f"kiln-key-format: 1\nspec: {spec}\nconfig: {config}\ntemplates: {templates}\n"
            "nvrtc: 13.0\narch: sm_90a\noptions: --ftz=true\n")


def make_db(path, rows, templates):
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE kernels(key TEXT PRIMARY KEY, spec TEXT NOT NULL, key_material TEXT "
               "NOT NULL, cubin BLOB NOT NULL)")
    for i, (spec, config, cubin) in enumerate(rows):
        db.execute("INSERT INTO kernels VALUES (?, ?, ?, ?)",
                   (f"{templates}{i}", spec, material(spec, templates, config), cubin.encode()))
    db.commit()
    db.close()


class SassDiffTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        d = self.dir.name
        self.tool = os.path.join(d, "cuobjdump")
        with open(self.tool, "w") as f:
            f.write(FAKE.replace("{python}", sys.executable))
        os.chmod(self.tool, os.stat(self.tool).st_mode | stat.S_IEXEC)
        self.old, self.new = os.path.join(d, "old.db"), os.path.join(d, "new.db")
        make_db(self.old, [
            (PLAIN, "threads=384", "HGMMA;FFMA;MUFU.EX2"),
            (PLAIN, "threads=128", "HMMA;FFMA;MUFU.EX2"),   # another config of the same spec
            (CAP, "threads=384", "HGMMA;FMUL;MUFU.TANH;MUFU.EX2"),
            (SNIP, "threads=384", "HGMMA;FMUL;FMUL;MUFU.TANH;FMUL;MUFU.EX2"),
            (DEC, "threads=128", "FFMA;MUFU.EX2"),          # gone from the new cache
        ], "aaaa")
        make_db(self.new, [
            (PLAIN, "threads=384", "HGMMA;FFMA;MUFU.EX2"),
            (PLAIN, "threads=128", "HMMA;FFMA;MUFU.EX2"),
            (CAP, "threads=384", "HGMMA;FMUL;MUFU.TANH;MUFU.EX2"),
            (SNIP, "threads=384", "HGMMA;FMUL;MUFU.TANH;MUFU.EX2"),
        ], "bbbb")

    def tearDown(self):
        self.dir.cleanup()

    def run_tool(self, *args):
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            code = sass_diff.main([*args, "--cuobjdump", self.tool, "--jobs", "2"])
        return code, out.getvalue(), err.getvalue()

    def test_pairs_across_templates(self):
        code, out, _ = self.run_tool(self.old, self.new)
        self.assertEqual(code, 0)
        self.assertIn("5 kernels in", out)
        self.assertIn("4 in both", out)
        self.assertIn("4 compared: 3 with identical SASS, 1 differ", out)
        self.assertIn("1 differ: op=prefill logits=none with a logits snippet", out)
        self.assertIn("logits_expr=\"cap * tanhf ( logits / cap )\": 6 -> 4 instructions", out)

    def test_only(self):
        code, out, _ = self.run_tool(self.old, self.new, "--only", "logits=softcap")
        self.assertEqual(code, 0)
        self.assertIn("1 compared: 1 with identical SASS, 0 differ", out)

    def test_failures(self):
        code, _, err = self.run_tool(self.old, os.path.join(self.dir.name, "missing.db"))
        self.assertEqual(code, 1)
        self.assertIn("missing.db", err)
        make_db(os.path.join(self.dir.name, "broken.db"), [(PLAIN, "threads=384", "broken")], "cccc")
        code, _, err = self.run_tool(self.old, os.path.join(self.dir.name, "broken.db"))
        self.assertEqual(code, 1)
        self.assertIn("-sass failed", err)
        self.assertEqual(sass_diff.cuobjdump_path(self.tool), self.tool)


if __name__ == "__main__":
    unittest.main()
