"""Bad input: each case is a one-line DataError that names the file; the CLI exits 2 with one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from data import DataConfig, DataError, build_datasets
from data.prepare import main as prepare_main
from tests.test_data_support import config, log_sink, write_kaggle_csv

REPO = Path(__file__).resolve().parents[1]


def error_of(tmp_path: Path, **overrides) -> str:
    _, log = log_sink()
    with pytest.raises(DataError) as err:
        build_datasets(config(tmp_path, **overrides), log=log)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_missing_path(tmp_path: Path):
    missing = tmp_path / "articles9.csv"
    assert str(missing) in error_of(tmp_path, paths=[str(missing)])


def test_glob_without_matches(tmp_path: Path):
    assert "nothing*.csv" in error_of(tmp_path, paths=[str(tmp_path / "nothing*.csv")])


def test_empty_file(tmp_path: Path):
    (tmp_path / "empty.csv").write_bytes(b"")
    message = error_of(tmp_path, paths=[str(tmp_path / "empty.csv")])
    assert str(tmp_path / "empty.csv") in message and "empty" in message


def test_csv_with_header_only(tmp_path: Path):
    path = write_kaggle_csv(tmp_path / "articles1.csv", [])
    assert str(path) in error_of(tmp_path, paths=[str(path)])


def test_csv_without_the_text_column_lists_its_columns(tmp_path: Path):
    path = tmp_path / "wrong.csv"
    path.write_text(",id,title,body\n0,1,T,some text\n", encoding="utf-8")
    message = error_of(tmp_path, paths=[str(path)])
    assert str(path) in message and "'content'" in message and "'body'" in message and "--text_column" in message


def test_jsonl_without_the_text_field(tmp_path: Path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"body": "a"}\n', encoding="utf-8")
    assert str(path) in error_of(tmp_path, paths=[str(path)])


@pytest.mark.parametrize("suffix", ["csv", "txt", "jsonl"])
def test_bytes_that_are_not_utf8_with_strict_utf8(tmp_path: Path, suffix: str):
    path = tmp_path / f"latin1.{suffix}"
    text = {
        "csv": ",id,title,content\n0,1,T,caf\xe9 au lait\n",
        "txt": "Ceci n'est pas un caf\xe9 au lait.",
        "jsonl": '{"text": "un caf\xe9 au lait, please"}\n',
    }[suffix]
    offset = text.encode("latin-1").index(b"\xe9")
    path.write_bytes(text.encode("latin-1"))
    message = error_of(tmp_path, paths=[str(path)], strict_utf8=True)
    assert str(path) in message and "UTF-8" in message and f"offset {offset}" in message and "--strict_utf8" in message


def test_strict_utf8_gives_the_file_offset_after_a_byte_order_mark(tmp_path: Path):
    path = tmp_path / "bom.txt"
    path.write_bytes(b"\xef\xbb\xbfabc\xff")
    assert "offset 6" in error_of(tmp_path, paths=[str(path)], strict_utf8=True)


def test_strict_utf8_names_a_truncated_character_at_the_end(tmp_path: Path):
    path = tmp_path / "cut.txt"
    path.write_bytes("enough text, then a cut euro sign \u20ac".encode()[:-1])
    assert "offset 34" in error_of(tmp_path, paths=[str(path)], strict_utf8=True)


def test_corpus_shorter_than_one_block(tmp_path: Path):
    path = write_kaggle_csv(tmp_path / "tiny.csv", ["Just a few words."])
    message = error_of(tmp_path, paths=[str(path)], block_size=64, val_fraction=0.0)
    assert str(path) in message and "fewer than one block of 65" in message


def test_corpus_too_short_for_a_validation_block_too(tmp_path: Path):
    path = write_kaggle_csv(tmp_path / "tiny.csv", ["Just a few words. " * 10])
    message = error_of(tmp_path, paths=[str(path)], block_size=40)
    assert str(path) in message and "--val_fraction 0" in message


def test_invalid_config_values_are_refused():
    with pytest.raises(ValueError, match="--val_fraction"):
        DataConfig(val_fraction=1.0)
    with pytest.raises(ValueError, match="--block_size"):
        DataConfig(block_size=0)


def test_cli_reports_bad_input_in_one_line_and_exits_2(tmp_path: Path):
    missing = tmp_path / "articles1.csv"
    out = subprocess.run(
        [sys.executable, "-m", "data.prepare", "--data", str(missing), "--cache_dir", str(tmp_path / "cache")],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert len(out.stderr.splitlines()) == 1 and str(missing) in out.stderr


def test_cli_too_short_corpus_is_still_one_line(tmp_path: Path, capsys):
    path = write_kaggle_csv(tmp_path / "tiny.csv", ["Just a few words."])
    code = prepare_main(
        ["--data", str(path), "--block_size", "512", "--cache_dir", str(tmp_path / "c"), "--num_proc", "1"]
    )
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1 and str(path) in err


def test_cli_prints_stats_on_success(tmp_path: Path, capsys):
    code = prepare_main(["--block_size", "64", "--cache_dir", str(tmp_path / "c"), "--num_proc", "1"])
    out = capsys.readouterr().out
    assert code == 0 and '"cache_hit": false' in out and '"blocks":' in out
