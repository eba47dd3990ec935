"""The README's "Search a corpus over HTTP" blocks, run as written (bash, the real CLI, curl), on free ports."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from asearch.net import free_port

ROOT = Path(__file__).resolve().parents[1]


def _http_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Search a corpus over HTTP", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)```", section, re.S)


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
@pytest.mark.parametrize(
    ("block", "expect_url"),
    [(0, "https://world0.example/wiki/Vantern"), (1, "https://en.wikipedia.org/wiki/Mona_Lisa")],
    ids=["world", "wiki10k"],
)
def test_readme_http_block_works_as_written(block: int, expect_url: str, tmp_path: Path) -> None:
    script = _http_blocks()[block]
    port = re.search(r"--port (\d+)", script).group(1)
    script = script.replace(port, str(free_port()))  # the same commands, on a port free here
    bin_dir = ROOT / ".venv" / "bin"
    # `set -e` plus a trap: a failing command fails the test, and the backgrounded server always stops
    wrapped = f"set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n{script}"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        ["bash", "-c", wrapped.replace(".venv/bin/", f"{bin_dir}/")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    replies, text, decoder = [], done.stdout.strip(), json.JSONDecoder()
    while text:  # curl prints no newline after a body: the two replies may share a line
        obj, end = decoder.raw_decode(text)
        replies.append(obj)
        text = text[end:].lstrip()
    assert len(replies) == 2, done.stdout[-2000:]
    retrieved, accessed = replies
    hits = retrieved["result"][0]
    docs = [h["document"] if "document" in h else h for h in hits]
    assert docs and all({"id", "contents", "url"} <= d.keys() for d in docs)
    assert expect_url in [d["url"] for d in docs], [d["url"] for d in docs]
    page = accessed["result"][0]
    assert page is not None and page["url"] == expect_url and page["contents"]
