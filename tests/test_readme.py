"""The README's Python tour runs as written (with smaller step counts)."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


@pytest.mark.slow
@pytest.mark.process
def test_readme_python_blocks_run(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) >= 3
    code = "\n".join(blocks)
    code = re.sub(r"steps=[0-9_]+", "steps=2_000", code)          # keep it quick
    code = code.replace("@settings(deadline=None)", "@settings(deadline=None, max_examples=5)")
    code = code + "\ntest_my_apply_adds_duplicates()\n"
    script = tmp_path / "tour.py"
    script.write_text("def main():\n" + textwrap.indent(code, "    ")
                      + "\n\nif __name__ == '__main__':\n    main()\n")
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]


@pytest.mark.process
@pytest.mark.parametrize("index", [0, 1])
def test_readme_scripts_run_as_written(tmp_path, index):
    """The ```py blocks are whole scripts (top-level functions, a main guard): each runs
    as a file, unchanged."""
    scripts = re.findall(r"```py\n(.*?)```", README.read_text(), re.S)
    assert len(scripts) == 2
    script = tmp_path / f"script{index}.py"
    script.write_text(scripts[index])
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip(), res.stderr[-3000:]


def test_readme_exit_code_table_is_the_clis():
    """One exit-code table: the README's rows are ``hogkit.cli.EXIT_CODES``, which
    ``hogkit --help`` prints and the commands return."""
    from hogkit.cli import EXIT_CODES
    rows = re.findall(r"^\| (\d+) \| (.+) \|$", README.read_text(), re.M)
    assert [(int(c), t) for c, t in rows if int(c) in dict(EXIT_CODES)] == list(EXIT_CODES)
