"""Mistakes a user makes on the command line end with one message (the option, the value, the fix), never a
traceback: each test below reproduces a report that used to end in one."""

from __future__ import annotations

import json

from tests.cli.conftest import DATA, run


def _no_traceback(result) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output


def test_a_request_file_with_a_byte_order_mark_is_read(platform_file, tmp_path):
    """Notepad's UTF-8 starts with a BOM; json.loads refused it as 'Expecting value'."""
    request = tmp_path / "bom.json"
    request.write_bytes(b"\xef\xbb\xbf" + (DATA / "ddp.json").read_bytes())
    result = run("render", request, "--platform", platform_file)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["TrainingJobName"]
