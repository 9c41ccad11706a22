"""A model whose files are not of its format is refused when it is fetched, with the key and the fix."""
import json

import pytest

from servesweep.models import format_problems, materialise

pytestmark = pytest.mark.shares_host


def _safetensors(path, header=b'{"__metadata__": {}}'):
    path.write_bytes(len(header).to_bytes(8, "little") + header)


def test_a_gguf_that_is_not_one_is_refused_at_download(tmp_path):
    fake = tmp_path / "model.gguf"
    fake.write_text("<!DOCTYPE html><html>a login page saved as the model</html>")
    with pytest.raises(ValueError) as info:
        materialise("m", {"source": {"local": str(fake)}, "format": "gguf"}, tmp_path / "out")
    text = str(info.value)
    assert "config key `models.m.format`" in text and "is not a GGUF file" in text and "fix:" in text


def test_real_formats_pass(tmp_path):
    good = tmp_path / "model.gguf"
    good.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 16)
    assert materialise("m", {"source": {"local": str(good)}, "format": "gguf"}, tmp_path / "out")["path"]
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({}))
    _safetensors(folder / "model.safetensors")
    assert format_problems(folder, "hf") == []


@pytest.mark.parametrize("body", [b"", b"\xff" * 8 + b"{}", (30).to_bytes(8, "little") + b"[1, 2]" + b" " * 24,
                                  b"<html>not weights</html>"])
def test_a_safetensors_file_without_its_header_is_refused(tmp_path, body):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "model-00001-of-00002.safetensors").write_bytes(body)
    _safetensors(folder / "model-00002-of-00002.safetensors")
    problems = format_problems(folder, "hf")
    assert len(problems) == 1 and "model-00001-of-00002.safetensors is not a safetensors file" in problems[0]


def test_dummy_weights_are_not_checked(tmp_path):
    assert format_problems(tmp_path, "hf", "dummy") == [] and format_problems(tmp_path, "gguf", "dummy") == []
