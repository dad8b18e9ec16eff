"""The README's commands are the acceptance tests: each one runs as written, at its defaults.

The commands are read from README.md's code blocks, so the README cannot drift from what is tested.
Only what must change for a CPU test changes: the 124M preset becomes the tiny one, step budgets become
a few steps, `runs/` is a temporary folder, a corpus path is a small All the News-format CSV, and the
W&B report is built with --dry_run (no network here). Everything else, W&B at its default ("auto":
offline without a login) included, is what a user gets.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.launch import REPO, assert_planned_exactly, free_port, launch_env, write_news_csv

pytestmark = pytest.mark.multiprocess

STEPS = "6"
# Commands of the README not run here, each with the reason; a README command in neither this list nor
# the run list fails `test_every_readme_command_is_run_or_excused`.
NOT_RUN = {
    "python3 -m venv": "environment set-up: .ci/run does it on a fresh clone",
    ". .venv/bin/activate": "environment set-up: .ci/run does it on a fresh clone",
    "pip install": "environment set-up: .ci/run does it on a fresh clone",
    "python -m pytest": "the test suite itself",
    "wandb sync": "uploads to W&B: needs a login and the network",
    "xdg-open": "opens a browser",
    "bash scripts/gpu_check.sh": "needs a GPU (docs/gpu_check.md)",
    "accelerate launch --config_file accelerate_configs/ddp_multinode.yaml": "needs several machines: test_strategies.py::test_machines_on_loopback_match_one_process_step_by_step_through_a_rank_0_kill_and_a_resume runs it on loopback",
}
RUN_PREFIXES = ("python train.py", "accelerate launch", "python -m ")


def readme_commands(text: str) -> list[str]:
    """Every command of the README's fenced code blocks, `&&` chains split, trailing comments dropped."""
    commands = []
    for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            for part in line.split("&&"):
                part = re.sub(r"\s+#.*$", "", part).strip()
                if part:
                    commands.append(" ".join(part.split()))
    # Whole launch commands the README gives inline, in backticks (not fragments such as a flag to add).
    commands += [" ".join(c.split()) for c in re.findall(r"`(accelerate launch --config_file [^`]+)`", text)]
    return commands


def _excused(command: str) -> str | None:
    return next((reason for prefix, reason in NOT_RUN.items() if command.startswith(prefix)), None)


@dataclass
class Ran:
    command: str  # as the README writes it
    adapted: str  # as run
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def adapt(command: str, runs: Path, corpus: Path) -> str:
    """The README command with only what a CPU test must change changed (see the module docstring)."""
    tokens = shlex.split(command)
    out: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token in ("--preset", "--presets") and tokens[i + 1] == "gpt2":
            out += [token, "tiny"]
            i += 2
            continue
        if token == "--max_steps":
            out += ["--max_steps", STEPS]
            i += 2
            continue
        if token == "--data":
            out += ["--data", str(corpus)]
            i += 1
            while i < len(tokens) and not tokens[i].startswith("--"):
                i += 1
            continue
        if token.startswith("runs/"):
            token = f"{runs}/{token.removeprefix('runs/')}"  # keeps a trailing slash: a glob of folders only
        out.append(token)
        i += 1
    if out[:2] == ["accelerate", "launch"]:
        out[2:2] = ["--main_process_port", str(free_port())]  # tests may run beside each other
    trains = "train.py" in out or out[:3] == ["python", "-m", "analysis.experiment"]
    if trains and "--max_steps" not in out and "--epochs" not in out:
        out += ["--max_steps", STEPS]
    if out[:3] == ["python", "-m", "analysis.wandb_report"]:
        out += ["--dry_run", "--out", str(runs / "wandb_report.json")]
    # Unquoted globs, as a shell user types them; other tokens quoted where they need it.
    return " ".join(t if re.fullmatch(r"[\w./*=:-]+", t) else shlex.quote(t) for t in out)


@pytest.fixture(scope="session")
def readme() -> list[str]:
    return readme_commands((REPO / "README.md").read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def readme_runs(readme: list[str], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Ran]]:
    """Every runnable README command, in README order (later ones use earlier ones' runs), once, with a cache of
    their own: the README's `python -m planner measure` writes the profile its runs and `planner --run` read."""
    root = tmp_path_factory.mktemp("readme")
    runs, corpus = root / "runs", root / "articles1.csv"
    write_news_csv(corpus, articles=60, words=200)
    env = {
        **launch_env(),
        "GPT2S_CACHE": str(root / "cache"),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    ran = []
    for command in readme:
        if _excused(command) or not command.startswith(RUN_PREFIXES):
            continue
        adapted = adapt(command, runs, corpus)
        result = subprocess.run(
            ["bash", "-c", adapted], cwd=REPO, env=env, capture_output=True, text=True, timeout=900
        )  # a hang guard: the experiment, the longest, takes a few minutes
        ran.append(Ran(command, adapted, result.returncode, result.stdout, result.stderr))
    return runs, ran


def test_every_readme_command_is_run_or_excused(readme: list[str]) -> None:
    unknown = [c for c in readme if not _excused(c) and not c.startswith(RUN_PREFIXES)]
    assert not unknown, f"README commands neither run nor excused: {unknown}"
    assert sum(c.startswith(RUN_PREFIXES) and not _excused(c) for c in readme) >= 10


def test_every_readme_command_exits_0(readme_runs: tuple[Path, list[Ran]]) -> None:
    _, ran = readme_runs
    failed = [f"{r.adapted}\n-> exit {r.returncode}\n{r.output[-3000:]}" for r in ran if r.returncode != 0]
    assert not failed, "\n\n".join(failed)


def _peak(run: Path) -> float | None:
    return json.loads((run / "summary.json").read_text())["peak_flops_per_device"]


def _launched_run_dirs(ran: list[Ran]) -> list[Path]:
    dirs = []
    for r in ran:
        tokens = shlex.split(r.adapted)
        if "train.py" in tokens:
            dirs.append(Path(tokens[tokens.index("--output_dir") + 1]))
    return dirs


def test_each_launch_trains_the_strategy_of_its_config_and_leaves_one_offline_wandb_run(
    readme_runs: tuple[Path, list[Ran]],
) -> None:
    runs, ran = readme_runs
    run_dirs = _launched_run_dirs(ran) + sorted((runs / "experiment" / "runs").glob("*/"))
    expected = {
        "single": ("single", 1),
        "ddp": ("ddp", 2),
        "fsdp": ("fsdp", 2),
        "all-the-news": ("ddp", 2),
        "quickstart": ("single", 1),
    }
    assert {d.name for d in run_dirs} >= set(expected)
    for run_dir in run_dirs:
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["complete"], run_dir
        if run_dir.name in expected:
            assert (summary["strategy"], summary["world_size"]) == expected[run_dir.name], run_dir
        offline = list((run_dir / "wandb").glob("offline-run-*"))
        assert len(offline) == 1 and list(offline[0].glob("run-*.wandb")), run_dir
        config = json.loads((run_dir / "config.json").read_text())
        assert config["launch"]["wandb_mode"] == "offline" and config["run"]["wandb_mode"] == "auto"


def test_launches_at_their_defaults_measure_their_memory_as_planned(readme_runs: tuple[Path, list[Ran]]) -> None:
    """The twin of the 2-process plan checks (which warm up one step): at the default three warm-up
    steps the second step is measured, the first that starts with optimizer state."""
    _, ran = readme_runs
    for run_dir in _launched_run_dirs(ran):
        memory = json.loads((run_dir / "summary.json").read_text())["memory"]
        assert memory["probe_step"] == 2, run_dir
        assert_planned_exactly(run_dir)  # model state byte for byte, the step peak within 0.05%
    plan = next(r for r in ran if r.command.startswith("python -m planner --run"))
    assert plan.stdout.count("step_peak") == 5  # single, and two ranks each of DDP and FSDP
    # Every step time predicted from the profile the README's `python -m planner measure` wrote, none assumed.
    assert plan.stdout.count("note: from the machine profile") == 3 and "assumed" not in plan.stdout
    # Every launch after the README's measure divides its MFU by the CPU peak that measured.
    measured = next(i for i, r in enumerate(ran) if r.command.startswith("python -m planner measure"))
    peaks = [_peak(run) for run in _launched_run_dirs(ran[measured:])]
    assert peaks and all(peak and peak > 0 for peak in peaks)


def test_the_quick_start_line_runs_twice(readme: list[str], readme_runs: tuple[Path, list[Ran]]) -> None:
    runs, ran = readme_runs
    (quickstart,) = [r for r in ran if r.command.startswith("python train.py") and "runs/quickstart" in r.command]
    first = json.loads((runs / "quickstart" / "summary.json").read_text())
    again = subprocess.run(
        ["bash", "-c", quickstart.adapted], cwd=REPO, capture_output=True, text=True, timeout=900, env=launch_env()
    )  # a hang guard; $GPT2S_CACHE is the session's
    assert again.returncode == 0, again.stderr[-3000:]
    second = json.loads((runs / "quickstart" / "summary.json").read_text())
    assert second["steps"] == first["steps"] and len(list((runs / "quickstart" / "wandb").glob("offline-run-*"))) == 1


def test_the_closing_lines_are_the_runs_own(readme_runs: tuple[Path, list[Ran]]) -> None:
    _, ran = readme_runs
    (quickstart, *_) = [r for r in ran if r.command.startswith("python train.py")]
    lines = [line for line in quickstart.stdout.splitlines() if line.strip()]
    assert lines[-2].startswith("done: 6 of 6 steps")
    assert lines[-1].startswith("W&B: offline run in ") and "wandb sync " in lines[-1]
    assert not any(line.startswith("wandb: Run summary") for line in quickstart.output.splitlines())


def test_the_experiment_compares_all_three_with_no_problems(readme_runs: tuple[Path, list[Ran]]) -> None:
    runs, _ = readme_runs
    out = runs / "experiment"
    with (out / "table.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [row["strategy"] for row in rows] == ["single", "ddp", "fsdp"]
    assert len({row["global batch (tokens)"] for row in rows}) == 1  # the driver matched the batches
    assert [row["world size (devices)"] for row in rows] == ["1", "2", "2"]
    for name in (
        "throughput_per_epoch.png",
        "grad_norm_per_epoch.png",
        "training_time_per_epoch.png",
        "peak_memory_per_epoch.png",
        "loss_per_epoch.png",
        "loss_vs_tokens.png",
        "step_time_distribution.png",
    ):
        assert (out / name).stat().st_size > 10_000, name
    report = (out / "report.md").read_text()
    assert "## Problems" not in report and "left out" not in report
    assert "Loss curves agree within noise" in report  # same data, order, batch and seed in fp32
    summaries = [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*/summary.json"))]
    # Equal terms: the same validation blocks and the same MFU peak under every strategy.
    assert len({s["eval_blocks"] for s in summaries}) == 1
    assert len({s["peak_flops_per_device"] for s in summaries}) == 1
    assert {s["threads_per_process"] for s in summaries} == {1}  # accelerate launch: one thread per process


def test_the_report_has_a_row_per_strategy_with_the_runs_own_figures(readme_runs: tuple[Path, list[Ran]]) -> None:
    runs, _ = readme_runs
    assert (runs / "report" / "report.md").is_file()
    with (runs / "report" / "table.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [row["strategy"] for row in rows] == ["single", "ddp", "fsdp"]
    for row in rows:
        summary = json.loads((runs / row["strategy"] / "summary.json").read_text())
        assert row["world size (devices)"] == str(summary["world_size"]), row
        assert row["global batch (tokens)"] == str(summary["global_batch_tokens"]), row
        assert row["tokens trained"] == str(summary["tokens_trained"]) and row["seed"] == str(summary["seed"]), row
    report = (runs / "report" / "report.md").read_text()
    assert all(f"| {strategy}" in report for strategy in ("single", "ddp", "fsdp")), report


def test_the_export_loads_and_gives_the_runs_logits(readme_runs: tuple[Path, list[Ran]]) -> None:
    import torch
    import transformers

    from training.checkpoints.store import load_model_from_checkpoint

    runs, _ = readme_runs
    exported = transformers.GPT2LMHeadModel.from_pretrained(runs / "my-gpt2").eval()
    trained = load_model_from_checkpoint(runs / "fsdp").eval()  # the run's newest checkpoint: its final weights
    tokens = torch.randint(0, 50257, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(exported(tokens).logits, trained(tokens)[0])


def _sampled(folder: Path, prompt: str, new_tokens: int, temperature: float, top_k: int, seed: int) -> str:
    """The README's sampling, computed here with transformers' GPT-2 from the run's export: logits over
    the temperature, cut to the top k, sampled with a generator seeded as --seed seeds it."""
    import torch
    import transformers

    model = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    ids = torch.tensor([tokenizer(prompt).input_ids])
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _ in range(new_tokens):
            logits = model(ids).logits[:, -1, :] / temperature
            kth = torch.topk(logits, top_k).values[:, [-1]]
            probs = torch.softmax(logits.masked_fill(logits < kth, float("-inf")), dim=-1)
            ids = torch.cat((ids, torch.multinomial(probs, 1, generator=generator)), dim=1)
    return prompt + tokenizer.decode(ids[0, len(tokenizer(prompt).input_ids) :].tolist())


def test_the_sample_is_the_runs_own_continuation(readme_runs: tuple[Path, list[Ran]]) -> None:
    runs, ran = readme_runs
    (sample,) = [r for r in ran if r.command.startswith("python -m training.sample")]
    tokens = shlex.split(sample.command)
    flag = {
        name: tokens[tokens.index(name) + 1]
        for name in ("--prompt", "--max_new_tokens", "--temperature", "--top_k", "--seed")
    }
    want = _sampled(
        runs / "quickstart" / "hf",
        flag["--prompt"],
        int(flag["--max_new_tokens"]),
        float(flag["--temperature"]),
        int(flag["--top_k"]),
        int(flag["--seed"]),
    )
    assert len(want) > len(flag["--prompt"]) and sample.stdout == want + "\n"


def test_the_wandb_report_spec_names_the_group_and_the_panels_metrics(readme_runs: tuple[Path, list[Ran]]) -> None:
    from training.records.schema import BARS, CURVES

    runs, _ = readme_runs
    spec = json.loads((runs / "wandb_report.json").read_text())
    text = json.dumps(spec)
    assert '"value": "tiny-demo"' in text and "tiny-demo" in spec.get("title", text)
    for curve in CURVES:
        assert all(f'"{m.wandb_key}"' in text for m in curve.metrics), curve.title
    for bars in BARS:
        assert all(m.key in text for m in bars.metrics), bars.title


def test_ci_runs_the_readme_test_line_as_written() -> None:
    """.ci/run reads the README's set-up-and-test line and runs it with nothing of its own added."""
    ci = (REPO / ".ci" / "run").read_text()
    assert "export " not in ci and "pip " not in ci and "pytest -" not in ci
    pattern = re.search(r"grep -m1 -E '([^']+)' README.md", ci).group(1)
    text = (REPO / "README.md").read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if re.search(pattern, line)]
    assert len(lines) == 1 and lines[0].endswith("python -m pytest -q -n 2 --dist loadfile"), lines
    assert lines[0] in re.findall(r"^```\n(.*?)\n```", text, flags=re.S | re.M)  # the README's own code block
