"""The frameworks stay optional: ``import mixprec`` (and ``mixprec.integrations``)
imports none of them, even where they are installed."""

from __future__ import annotations

import json
import subprocess
import sys

FRAMEWORKS = ("lightning", "pytorch_lightning", "accelerate", "transformers")


def test_import_mixprec_imports_no_framework() -> None:
    code = ("import sys, json, mixprec, mixprec.integrations\n"
            f"print(json.dumps([m for m in {FRAMEWORKS!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=300)
    assert json.loads(out.stdout.splitlines()[-1]) == []
