"""What a user sees on the console of a launch: no false W&B warning from the non-main rank, no
tied-weight notice at every checkpoint, and a precision hint that says where the flag goes."""

from __future__ import annotations

from pathlib import Path

import pytest

from training.distributed.strategy import choose_precision


@pytest.fixture(scope="module")
def ddp_run(shared_runs) -> tuple[Path, str]:
    """The session's two-process DDP run at the defaults (tests/conftest.py): W&B "auto" is offline here,
    since tests/launch.py hides the login, and it checkpoints every 3 steps."""
    return shared_runs["ddp"], shared_runs.console("ddp")


def test_a_ddp_run_warns_nothing_about_wandb_and_leaves_one_offline_run(ddp_run: tuple[Path, str]) -> None:
    out, console = ddp_run
    assert "W&B" not in "\n".join(line for line in console.splitlines() if "warning" in line.lower())
    assert len(list(out.glob("wandb/offline-run-*"))) == 1


def test_checkpoints_do_not_print_the_tied_weight_notice(ddp_run: tuple[Path, str]) -> None:
    # accelerate's save_state printed it at every save (safetensors drops the tied lm_head); checkpoints are
    # written through torch.distributed.checkpoint now, which keeps both names and says nothing.
    out, console = ddp_run
    assert list(out.glob("checkpoints/step_*"))  # the run did save
    assert "Removed shared tensor" not in console


def test_the_cpu_fp16_hint_says_the_precision_is_accelerate_launchs_flag() -> None:
    precision, warning = choose_precision("fp16", "cpu", "")
    assert precision == "no"
    assert "accelerate launch --mixed_precision bf16 ... train.py" in warning


def _help(module: str) -> str:
    import subprocess
    import sys

    from tests.launch import REPO

    done = subprocess.run(
        [sys.executable, "-m", module, "--help"], cwd=REPO, capture_output=True, text=True, timeout=120, check=True
    )
    return " ".join(done.stdout.split())  # argparse wraps lines: compare the words


@pytest.mark.parametrize("module", ["analysis.experiment", "analysis.wandb_report"])
def test_help_shows_each_default_once_and_no_empty_ones(module: str) -> None:
    text = _help(module)
    assert "(default: None)" not in text and "(default: False)" not in text
    flags = text.split(" --")
    assert not [flag for flag in flags if flag.count("(default") > 1]
    if module == "analysis.experiment":
        assert "--seed SEED the seed of every run" in text and "(default: 1337)" in text


def test_tiny_preset_help_gives_its_cpu_time_honestly() -> None:
    from training.config import PRESETS

    assert "seconds" not in str(PRESETS) and "about a minute on 2 cores" in str(PRESETS)
