"""The structure the code is meant to keep, read from the source (ast; nothing is imported, and one tiny run is
launched to count the modules a run imports).

(a) no import circle among the project's modules, (b) no import back up a layer
(data <- model <- training <- planner <- analysis, notebooks, lab, scripts, train.py), (c) no function over
60 lines outside tests/, (d) no strategy name as a string literal outside training/distributed/registry.py and tests/,
(e) one write_atomic, (f) no metric key as a string literal outside training/records/schema.py and tests/.
Imports inside functions and under TYPE_CHECKING count: they are dependencies too.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from training.distributed import registry
from training.records import schema as run_schema

REPO = Path(__file__).resolve().parents[1]
# Bottom to top. A module may import from its own layer and the layers below it, never from one above.
LAYERS = (
    ("data",),
    ("model",),
    ("training",),
    ("planner",),
    ("analysis", "notebooks", "lab", "scripts", "train"),
)
LAYER_OF = {top: rank for rank, tops in enumerate(LAYERS) for top in tops}
MAX_FUNCTION_LINES = 60
REGISTRY_FILE = "training/distributed/registry.py"
# Every metric key is spelled in the schema alone: training/records/metrics.py writes the typed records built from
# it (keyword arguments, not strings), and every other module names a metric by the schema's constants.
SCHEMA_FILE = "training/records/schema.py"
# Schema keys that are also everyday words with other meanings here (a checkpoint's step and epoch, a
# config's lr, a corpus's tokens, the planner's loss): only the keys that name one figure are held to it.
COMMON_WORDS = frozenset({"step", "epoch", "tokens", "loss", "lr", "steps", "partial", "warmup"})


@dataclass(frozen=True)
class Import:
    source: str  # the importing module, dotted
    target: str  # the project module imported (the submodule when one is named, else the package)
    where: str  # path:line


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def _project_files() -> tuple[Path, ...]:
    """train.py and every .py file under the layers' folders and tests/ (caches and hidden folders aside)."""
    folders = [REPO / top for top in LAYER_OF if top != "train"] + [REPO / "tests"]
    files = [REPO / "train.py"]
    for folder in folders:
        files += [
            p
            for p in folder.rglob("*.py")
            if not any(part.startswith((".", "__pycache__")) for part in p.relative_to(REPO).parts)
        ]
    return tuple(sorted(files))


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def _is_test(path: Path) -> bool:
    return _rel(path).startswith("tests/")


@cache
def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in _project_files() if not _is_test(p)}


def _resolve(name: str) -> str | None:
    """The longest prefix of dotted `name` that is a project module, or None for an outside module."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in _modules():
            return ".".join(parts)
        parts.pop()
    return None


def _imports() -> list[Import]:
    found = []
    for module, path in _modules().items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(_tree(path)):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package, one level up per extra dot
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                # `from pkg import sub` names the submodule when there is one, else something of pkg's.
                names = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in _modules() else base for alias in node.names
                ]
            for name in names:
                target = _resolve(name)
                if target is not None and target != module:
                    found.append(Import(module, target, f"{_rel(path)}:{node.lineno}"))
    return found


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return components


def _top(module: str) -> str:
    return module.split(".")[0]


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the string constants that are docstrings (of the module, a class or a function)."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                ids.add(id(first.value))
    return ids


# ---------------------------------------------------------------------------------------------


def test_no_import_circle() -> None:
    imports = _imports()
    edges: dict[str, set[str]] = {}
    for imp in imports:
        edges.setdefault(imp.source, set()).add(imp.target)
    lines = []
    for component in _cycles(edges):
        members = set(component)
        inside = {
            f"{imp.where} {imp.source} -> {imp.target}"
            for imp in imports
            if imp.source in members and imp.target in members
        }
        lines.append(f"circle among {', '.join(component)}:\n    " + "\n    ".join(sorted(inside)))
    assert not lines, "import circles (break each by moving what both sides need below them):\n" + "\n".join(lines)


def test_no_import_up_a_layer() -> None:
    offenders = sorted(
        {
            f"{imp.where} {imp.source} (layer {LAYER_OF[_top(imp.source)]}) imports {imp.target} "
            f"(layer {LAYER_OF[_top(imp.target)]})"
            for imp in _imports()
            if LAYER_OF[_top(imp.target)] > LAYER_OF[_top(imp.source)]
        }
    )
    assert not offenders, "imports up a layer (data <- model <- training <- planner <- the rest):\n" + "\n".join(
        offenders
    )


def test_no_function_over_60_lines() -> None:
    offenders = []
    for path in _project_files():
        if _is_test(path):
            continue
        for node in ast.walk(_tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    offenders.append(f"{_rel(path)}:{node.lineno} {node.name}: {length} lines")
    assert not offenders, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(sorted(offenders))


def _literals_outside(values: set[str], allowed: set[str]) -> list[str]:
    """path:line of each string literal (not a docstring) equal to one of `values` outside tests/ and `allowed`."""
    offenders = []
    for path in _project_files():
        if _is_test(path) or _rel(path) in allowed:
            continue
        tree = _tree(path)
        docstrings = _docstrings(tree)
        for node in ast.walk(tree):  # reaches the constant parts of f-strings too
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value in values
                and id(node) not in docstrings
            ):
                offenders.append(f"{_rel(path)}:{node.lineno} {node.value!r}")
    return sorted(offenders)


def test_strategy_names_are_spelled_only_in_the_registry() -> None:
    names = set(registry.names())
    assert names, "the registry names no strategy"
    offenders = _literals_outside(names, {REGISTRY_FILE})
    assert not offenders, (
        "strategy names as string literals outside training/distributed/registry.py (ask the registry):\n"
        + "\n".join(offenders)
    )


def test_metric_keys_are_spelled_only_in_the_schema() -> None:
    keys = {m.key for m in run_schema.METRICS}
    assert COMMON_WORDS < keys, "an exempted word is no longer a schema key: drop it from COMMON_WORDS"
    offenders = _literals_outside(keys - COMMON_WORDS, {SCHEMA_FILE})
    assert not offenders, (
        f"metric keys as string literals outside {SCHEMA_FILE} (name the schema's constant, e.g. "
        "THROUGHPUT.key, or read and write the typed records of training/records/record.py):\n" + "\n".join(offenders)
    )


def test_one_write_atomic() -> None:
    found = sorted(
        f"{_rel(path)}:{node.lineno}"
        for path in _project_files()
        for node in ast.walk(_tree(path))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "write_atomic"
    )
    assert len(found) == 1, f"expected one write_atomic (training/durable.py), found {len(found)}: {', '.join(found)}"


# ---------------------------------------------------------------------------------------------
# The checks themselves, on small made-up inputs


def test_cycles_finds_only_circles() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_docstrings_are_told_from_other_strings() -> None:
    tree = ast.parse('"""mod"""\ndef f():\n    """doc"""\n    return "x"\nclass C:\n    "cdoc"\n    y = "y"\n')
    docs = _docstrings(tree)
    values = {n.value: id(n) in docs for n in ast.walk(tree) if isinstance(n, ast.Constant)}
    assert values == {"mod": True, "doc": True, "x": False, "cdoc": True, "y": False}


def test_the_import_reader_sees_imports_inside_functions() -> None:
    # model/hf.py imports transformers only inside functions; the reader must see such imports of ours.
    imports = {(imp.source, imp.target) for imp in _imports()}
    assert ("training.checkpoints.export", "training.checkpoints.store") in imports  # inside export_checkpoint


def test_the_readme_is_one_screen_without_dated_counts() -> None:
    """The README is the start, docs/ the rest; counts and timings of the suite go stale there (CI shows them)."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    assert not re.search(r"\b\d[\d,]* (tests|passed)\b", text), "a test count in the README"


PRODUCT = ("data", "model", "training", "planner", "analysis", "notebooks", "train")
MAX_TRAINING_TOP_FILES = 15
MAX_RUN_MODULES = 45


def _imported_names(path: Path) -> list[tuple[str, int]]:
    """Every absolute module name `path` imports (at any depth, inside functions too), with its line."""
    names = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            names += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append((node.module, node.lineno))
    return names


def _forbidden_imports(sources: tuple[str, ...], forbidden: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{_rel(path)}:{line} imports {name}"
        for path in _project_files()
        if _rel(path).split("/")[0].removesuffix(".py") in sources
        for name, line in _imported_names(path)
        if name.split(".")[0] in forbidden
    )


def test_the_product_imports_neither_the_lab_nor_the_tests() -> None:
    offenders = _forbidden_imports(PRODUCT, ("lab", "tests"))
    assert not offenders, "the product imports the lab or tests/ (move what both need into the product):\n" + (
        "\n".join(offenders)
    )


def test_no_benchmark_or_script_imports_the_tests() -> None:
    offenders = _forbidden_imports(("lab", "scripts"), ("tests",))
    assert not offenders, "lab/ or scripts/ imports tests/ (lab/launch.py launches for both):\n" + "\n".join(offenders)


def test_the_import_rules_catch_an_offender(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A product file importing the lab or tests/ inside a function, and a script importing tests/, are named."""
    for rel, text in {
        "train.py": "def f():\n    from tests.launch import run\n",
        "analysis/x.py": "import lab.step_time\n",
        "scripts/y.py": "from tests import launch\n",
        "lab/z.py": "import model\n",
    }.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text, encoding="utf-8")
    files = tuple(sorted(tmp_path.rglob("*.py")))
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "_project_files", lambda: files)
    _tree.cache_clear()
    assert _forbidden_imports(PRODUCT, ("lab", "tests")) == [
        "analysis/x.py:1 imports lab.step_time",
        "train.py:2 imports tests.launch",
    ]
    assert _forbidden_imports(("lab", "scripts"), ("tests",)) == ["scripts/y.py:1 imports tests"]
    _tree.cache_clear()


def test_nothing_a_run_imports_measures_the_machine() -> None:
    """The measurements `python -m planner measure` takes (the link, the CPU peak) are never on a run's path."""
    measuring = ("planner.measure", "planner.cpu_peak", "planner.link")
    offenders = sorted(
        f"{_rel(path)}:{line} imports {name}"
        for path in _project_files()
        if _rel(path) == "train.py" or _rel(path).startswith(("training/", "data/", "model/"))
        for name, line in _imported_names(path)
        if name.startswith(measuring)
    )
    assert not offenders, "a run imports a measurement:\n" + "\n".join(offenders)


def test_training_has_few_files_at_its_top() -> None:
    top = sorted(p.name for p in (REPO / "training").glob("*.py"))
    assert len(top) <= MAX_TRAINING_TOP_FILES, f"{len(top)} files directly in training/: {', '.join(top)}"


@pytest.mark.multiprocess  # a launch, though of one process
def test_a_one_process_run_imports_few_of_the_projects_modules(tmp_path: Path) -> None:
    """A tiny run of one step, in a fresh interpreter without a GPU: the project's modules it has imported by its
    end, none of the planner's (a CPU run has nothing to plan)."""
    import os
    import subprocess
    import sys

    script = (
        "import sys, train\n"
        "status = train.main(sys.argv[1:])\n"
        f"root = {str(REPO)!r}\n"
        "print('\\n'.join(sorted(n for n, m in sys.modules.items() if (getattr(m, '__file__', None) or '')"
        ".startswith(root + '/') and '/.venv/' not in m.__file__)))\n"
        "sys.exit(status)\n"
    )
    args = ["--preset", "tiny", "--max_steps", "1", "--eval_blocks", "1", "--wandb_mode", "disabled", "--no-export_hf"]
    result = subprocess.run(
        [sys.executable, "-c", script, *args, "--output_dir", str(tmp_path / "run")],
        cwd=REPO,
        env={**os.environ, "RANK": "0", "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    modules = [line for line in result.stdout.splitlines() if line and " " not in line and "=" not in line]
    assert "training.loop" in modules and "model.gpt2" in modules, "the run's modules were not read"
    assert len(modules) <= MAX_RUN_MODULES, f"{len(modules)} modules: {', '.join(modules)}"
    assert not [m for m in modules if m.startswith("planner")]


_CONFLICT_MARKER = re.compile(r"^(<{7} |={7}$|>{7} )", re.MULTILINE)


def _text_files() -> list[Path]:
    suffixes = {".py", ".md", ".yaml", ".toml", ".txt", ".sh", ".sbatch", ".ipynb"}
    # .compat: lab/compat_check.py's environments, other packages' files.
    skipped = {".venv", ".compat", ".git", "__pycache__", ".pytest_cache", ".ruff_cache", "runs", "wandb"}
    return [
        p
        for p in REPO.rglob("*")
        if p.suffix in suffixes and p.is_file() and not skipped & set(p.relative_to(REPO).parts)
    ]


def test_no_merge_conflict_marker_is_left_in_a_file() -> None:
    marked = [str(p.relative_to(REPO)) for p in _text_files() if _CONFLICT_MARKER.search(p.read_text("utf-8"))]
    assert marked == []
    assert _CONFLICT_MARKER.search("text\n<<<<<<< HEAD\nmore") and not _CONFLICT_MARKER.search("a ======= b")
