"""bench/generation.py's --trees plumbing: each lab implementation runs once per code tree, from that tree."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_trees_run_each_lab_implementation_from_each_tree():
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "generation.py"),
            "--trees",
            f"a={ROOT}",
            f"b={ROOT}",
            "--impls",
            "lab-static",
            "--settings",
            "2x3",
            "--rounds",
            "1",
            "--repeats",
            "1",
            "--threads",
            "1",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    rows = [line for line in out.stdout.splitlines() if line.startswith("| greedy")]
    assert [row.split("|")[2].strip() for row in rows] == ["lab-static@a", "lab-static@b"]
    assert "vs @a" in out.stdout
    assert rows[0].rstrip(" |").endswith("1.00x (1.00-1.00)")  # the first tree against itself


def test_a_tree_is_where_rlhf_lab_is_imported_from(tmp_path):
    (tmp_path / "rlhf_lab").mkdir()
    (tmp_path / "rlhf_lab" / "__init__.py").write_text("raise ImportError('the broken tree was imported')\n")
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "generation.py"), "--trees", f"a={ROOT}",
                          f"broken={tmp_path}", "--impls", "lab-static", "--settings", "2x3", "--rounds", "1",
                          "--repeats", "1", "--threads", "1"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode != 0
    assert "the broken tree was imported" in out.stderr
