"""Every supported combination renders a clean project; unsupported ones are refused.

Supported: the full product training_loop x include_slurm x mixed_precision
(2 x 2 x 4 = 16) and every file set of the yes/no answers (include_slurm,
include_kubernetes, include_lora, include_doctor, include_fsdp) in each loop, the
precisions taken in turn, so that every loop meets every file set and every precision;
each is rendered once per session with the same non-default name, model, dataset and
columns, so nothing can pass by being the default. Each render gets the exact file set,
the chosen loop's files, run bits, no template leftovers, ruff, ``bash -n`` and
shellcheck, TOML/YAML parsing, and the recorded answers; each is replayed from them. The
Kubernetes files' contents: test_kubernetes.py.

Unsupported: ``UNSUPPORTED`` below, each refused with its one ERROR line.

The two ``rendered_suite`` tests run a rendered project's own tests (real torchrun,
minutes); ``pytest -m "not rendered_suite"`` leaves them out.
"""

from __future__ import annotations

import ast
import itertools
import json
import math
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest
import yaml
from conftest import (
    PROJECT_TEMPLATE,
    TEMPLATE_DIR,
    cookiecutter_json,
    docs_text,
    error_lines,
    pre_gen,
    relative_files,
)
from cookiecutter.exceptions import FailedHookException
from cookiecutter.utils import create_env_with_context

# Answers shared by every render; slug and package name are left to derive.
BASE_ANSWERS = {
    "project_name": "Review Sentiment",
    "description": "Sentiment of product reviews, trained with DDP.",
    "model_name_or_path": "distilbert/distilbert-base-uncased",
    "dataset_name": "stanfordnlp/sst2",
    "text_column": "sentence",
    "label_column": "sentiment",
}
SLUG = "review-sentiment"
PACKAGE = "review_sentiment"


class Combination(NamedTuple):
    training_loop: str
    include_slurm: bool
    mixed_precision: str
    include_kubernetes: bool = False
    experiment_tracker: str = "none"
    include_lora: bool = False
    include_doctor: bool = False
    include_fsdp: bool = False

    @property
    def id(self) -> str:
        slurm = "slurm" if self.include_slurm else "no-slurm"
        kubernetes = "-k8s" if self.include_kubernetes else ""
        tracker = "" if self.experiment_tracker == "none" else f"-{self.experiment_tracker}"
        lora = "-lora" if self.include_lora else ""
        doctor = "-doctor" if self.include_doctor else ""
        fsdp = "-fsdp" if self.include_fsdp else ""
        return f"{self.training_loop}-{slurm}-{self.mixed_precision}{kubernetes}{tracker}{lora}{doctor}{fsdp}"

    @property
    def answers(self) -> dict[str, object]:
        return {**BASE_ANSWERS, **self._asdict()}


PRECISIONS = ("auto", "bf16", "fp16", "no")
# The answers with choices (a list, or yes/no), their values in cookiecutter.json's order.
CHOICES = {
    "training_loop": ["trainer", "native"], "include_slurm": [True, False], "mixed_precision": list(PRECISIONS),
    "include_kubernetes": [False, True], "experiment_tracker": ["none", "tensorboard", "wandb", "mlflow"],
    "include_lora": [False, True], "include_doctor": [False, True], "include_fsdp": [False, True],
}
# Every combination of the answers, the four precisions (which only edit YAML) taken in turn: each renders
# the exact files it should, with no template text left, and passes ruff.
EVERY_COMBINATION = [
    Combination(loop, slurm, PRECISIONS[index % 4], kubernetes, tracker, lora, doctor, fsdp)
    for index, (loop, slurm, kubernetes, tracker, lora, doctor, fsdp) in enumerate(itertools.product(
        *(CHOICES[name] for name in Combination._fields if name != "mixed_precision")))
]
# Kubernetes, the doctor and FSDP add files (FSDP: its version of parallel.py), LoRA files and a few lines at
# their call sites: every file set of the yes/no answers in each loop, without a tracker. Most tests read these.
SUPPORTED = [combo for combo in EVERY_COMBINATION if combo.experiment_tracker == "none"]
# One render per loop, each with the SLURM script, whose tests run it under a real SLURM (without it,
# a render only lacks those files; precision only edits YAML), and with LoRA, the doctor and FSDP, which the
# proofs train and run.
SUITE_RUNS = [
    Combination("trainer", True, "auto", include_lora=True, include_doctor=True, include_fsdp=True),
    Combination("native", True, "auto", include_lora=True, include_doctor=True, include_fsdp=True),
]

def pairwise_cover(choices: dict[str, list]) -> list[dict]:
    """Rows of answers in which every pair of values of any two answers meets at least once. Greedy: each
    row starts from the first pair not met yet and gives every other answer the value that meets the most
    pairs not met (the earlier value on a tie), so the rows are the same at every run."""
    names = list(choices)
    unmet = {((a, x), (b, y)) for a, b in itertools.combinations(names, 2) for x in choices[a] for y in choices[b]}
    rows = []
    while unmet:
        (a, x), (b, y) = min(unmet, key=lambda pair: [(names.index(n), choices[n].index(v)) for n, v in pair])
        row = {a: x, b: y}
        for name in names:
            if name not in row:
                row[name] = max(choices[name], key=lambda value: sum(
                    tuple(sorted([(other, row[other]), (name, value)], key=lambda nv: names.index(nv[0]))) in unmet
                    for other in row))
        rows.append(row)
        unmet -= {((a, row[a]), (b, row[b])) for a, b in itertools.combinations(names, 2)}
    return rows


# A covering set of the answers: every pair of values of any two answers (a tracker and LoRA, fp16 and the
# native loop, ...) together in at least one render, the answers with the most values first (16 renders: the
# 4 x 4 of precision and tracker). Each runs its own `make test` (test_rendered_repo_passes_its_own_make_test).
MOST_VALUES_FIRST = sorted(CHOICES, key=lambda name: -len(CHOICES[name]))  # a stable sort
COVERING_RUNS = [Combination(**row) for row in pairwise_cover({name: CHOICES[name] for name in MOST_VALUES_FIRST})]
# The renders most tests below read: every file set, and the covering set's others (its trackers).
SUPPORTED_AND_COVERING = list(dict.fromkeys(SUPPORTED + COVERING_RUNS))


def combination_params(combinations: list[Combination]) -> list:
    return [pytest.param(combo, id=combo.id) for combo in combinations]


# --- The exact files of each combination ---------------------------------------------

COMMON_FILES = {
    ".cookiecutter.json",
    "constraints.txt",
    ".github/workflows/tests.yml",
    ".gitignore",
    ".pre-commit-config.yaml",
    "Makefile",
    "README.md",
    "configs/default.yaml",
    "configs/local_files.yaml",
    "configs/smoke.yaml",
    "configs/smoke_multilabel.yaml",
    "configs/smoke_pairs.yaml",
    "configs/smoke_regression.yaml",
    "docs/decisions.md",
    "docs/models-and-memory.md",
    "docs/multi-node.md",
    "docs/tasks-and-results.md",
    "docs/troubleshooting.md",
    "docs/upgrading.md",
    "pyproject.toml",
    "scripts/_common.sh",
    "scripts/train_multi_node.sh",
    "scripts/train_single_node.sh",
    f"src/{PACKAGE}/__init__.py",
    f"src/{PACKAGE}/compat.py",
    f"src/{PACKAGE}/config.py",
    f"src/{PACKAGE}/data.py",
    f"src/{PACKAGE}/device.py",
    f"src/{PACKAGE}/distributed.py",
    f"src/{PACKAGE}/metrics.py",
    f"src/{PACKAGE}/modeling.py",
    f"src/{PACKAGE}/predict.py",
    f"src/{PACKAGE}/preflight.py",
    f"src/{PACKAGE}/results.py",
    f"src/{PACKAGE}/resume.py",
    f"src/{PACKAGE}/smoke.py",
    f"src/{PACKAGE}/stopping.py",
    f"src/{PACKAGE}/torchrun.py",
    f"src/{PACKAGE}/worker.py",
    "tests/conftest.py",
    "tests/test_compat.py",
    "tests/test_config.py",
    "tests/test_data.py",
    "tests/test_ddp.py",
    "tests/test_distributed.py",
    "tests/test_launch_end_to_end.py",
    "tests/test_metrics.py",
    "tests/test_modeling.py",
    "tests/test_preflight.py",
    "tests/test_scripts.py",
    "tests/test_settings.py",
    "tests/test_smoke.py",
    "tests/test_tasks.py",
    "tests/test_torchrun.py",
}
# Each is <name>_<loop>.py in the template; post-gen keeps the chosen loop's as <name>.py.
PER_LOOP_FILES = {
    f"src/{PACKAGE}/train.py",
    f"src/{PACKAGE}/training_args.py",
    "tests/ddp_probe.py",
    "tests/test_training_args.py",
}
# <name>_<loop>_<ddp|fsdp>.py in the template: the loop's, with DDP alone or also FSDP (include_fsdp).
PER_LOOP_AND_FSDP_FILES = {f"src/{PACKAGE}/parallel.py"}
# Also <name>_<loop>.py in the template, kept only with include_fsdp.
FSDP_ONLY_FILES = {"tests/test_parallel.py"}
NATIVE_ONLY_FILES = {
    f"src/{PACKAGE}/batching.py",
    f"src/{PACKAGE}/checkpoint.py",
    "tests/test_batching.py",
    "tests/test_native_loop.py",
}
# With a tracker only; trackers.py is <name>_<loop>.py in the template, as PER_LOOP_FILES are.
TRACKER_ONLY_FILES = {f"src/{PACKAGE}/tracking.py", f"src/{PACKAGE}/trackers.py", "tests/test_tracking.py",
                      "docs/experiment-tracking.md"}
PER_LOOP_TRACKER_FILES = {f"src/{PACKAGE}/trackers.py"}
SLURM_SCRIPT = "scripts/train_slurm.sbatch"
# The script and its log folder (its tests under a real SLURM are the template's: tests/proofs/).
SLURM_ONLY_FILES = {SLURM_SCRIPT, "logs/.gitkeep"}
KUBERNETES_ONLY_FILES = {"Dockerfile", ".dockerignore", "k8s/trainjob.yaml"}
LORA_ONLY_FILES = {f"src/{PACKAGE}/lora.py", f"src/{PACKAGE}/merge_lora.py", "tests/test_lora.py"}
DOCTOR_ONLY_FILES = {f"src/{PACKAGE}/doctor.py", "tests/test_doctor.py"}
LAUNCHERS = {"scripts/train_single_node.sh", "scripts/train_multi_node.sh"}


def expected_files(combo: Combination) -> set[str]:
    files = COMMON_FILES | PER_LOOP_FILES | PER_LOOP_AND_FSDP_FILES
    if combo.training_loop == "native":
        files |= NATIVE_ONLY_FILES
    if combo.include_fsdp:
        files |= FSDP_ONLY_FILES
    if combo.include_slurm:
        files |= SLURM_ONLY_FILES
    if combo.include_kubernetes:
        files |= KUBERNETES_ONLY_FILES
    if combo.experiment_tracker != "none":
        files |= TRACKER_ONLY_FILES
    if combo.include_lora:
        files |= LORA_ONLY_FILES
    if combo.include_doctor:
        files |= DOCTOR_ONLY_FILES
    return files


def recorded_answers(combo: Combination, default_answers: dict) -> dict[str, object]:
    """What .cookiecutter.json must hold: every answer, slug and package derived."""
    return {
        **default_answers,
        **combo.answers,
        "project_slug": SLUG,
        "package_name": PACKAGE,
    }


# --- One render per combination per session -------------------------------------------


@pytest.fixture(scope="session")
def rendered(render, tmp_path_factory) -> Callable[[Combination], Path]:
    """``rendered(combo)``: the project folder, rendered on first use only."""
    projects: dict[Combination, Path] = {}

    def project_for(combo: Combination) -> Path:
        if combo not in projects:
            output_dir = tmp_path_factory.mktemp(combo.id)
            projects[combo] = render(output_dir, combo.answers)
        return projects[combo]

    return project_for


def run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, check=False, timeout=120
    )


def test_supported_combinations_cover_every_choice_product_and_file_set(default_answers):
    config = cookiecutter_json()
    assert isinstance(config["include_slurm"], bool)
    assert isinstance(config["include_kubernetes"], bool)
    assert config["include_lora"] is False and config["include_doctor"] is False
    loops, booleans = config["training_loop"], [True, False]
    assert {combo[:3] for combo in SUPPORTED} == set(
        itertools.product(loops, booleans, config["mixed_precision"])
    )
    assert isinstance(config["include_fsdp"], bool)
    file_sets = {
        (combo.training_loop, combo.include_slurm, combo.include_kubernetes, combo.include_lora,
         combo.include_doctor, combo.include_fsdp)
        for combo in SUPPORTED
    }
    assert file_sets == set(itertools.product(loops, booleans, booleans, booleans, booleans, booleans))
    assert len(SUPPORTED) == len(set(SUPPORTED)) == len(file_sets) == 64
    assert all(combo.include_lora and combo.include_doctor and combo.include_fsdp for combo in SUITE_RUNS)
    for combo in SUPPORTED:
        answers = recorded_answers(combo, default_answers)
        assert pre_gen.find_first_problem(answers) is None, combo.id


def test_every_combination_and_a_covering_set_of_pairs_are_rendered(default_answers):
    # CHOICES is cookiecutter.json's: every prompt with choices (a list, or yes/no), its values in order.
    config = cookiecutter_json()
    assert CHOICES == {name: [value, not value] if isinstance(value, bool) else value
                       for name, value in config.items() if isinstance(value, bool | list) and not name.startswith("_")}
    assert list(CHOICES) == list(Combination._fields)
    every = {combo._replace(mixed_precision="auto") for combo in EVERY_COMBINATION}
    assert len(every) == len(EVERY_COMBINATION) == math.prod(len(values) for values in CHOICES.values()) // 4
    assert {combo.mixed_precision for combo in EVERY_COMBINATION} == set(PRECISIONS)
    for a, b in itertools.combinations(CHOICES, 2):
        met = {(getattr(combo, a), getattr(combo, b)) for combo in COVERING_RUNS}
        assert met == set(itertools.product(CHOICES[a], CHOICES[b])), f"{a} x {b}: only {met}"
    assert len(COVERING_RUNS) == len(CHOICES["mixed_precision"]) * len(CHOICES["experiment_tracker"])
    assert COVERING_RUNS[0] == Combination(*(values[0] for values in CHOICES.values()))  # the default answers
    assert {combo.training_loop for combo in TRACKER_PROOF_RUNS} == set(config["training_loop"])
    for combo in EVERY_COMBINATION + COVERING_RUNS:
        assert pre_gen.find_first_problem(recorded_answers(combo, default_answers)) is None, combo.id


@pytest.mark.parametrize("combo", combination_params(EVERY_COMBINATION))
def test_render_has_exactly_the_expected_files(rendered, combo):
    project = rendered(combo)
    assert project.name == SLUG
    files = relative_files(project)
    expected = expected_files(combo)
    assert files == expected, (
        f"unexpected: {sorted(files - expected)}; missing: {sorted(expected - files)}"
    )


@pytest.mark.parametrize("combo", combination_params(SUPPORTED_AND_COVERING))
def test_per_loop_files_are_the_chosen_loops_template_files(
    rendered, combo, default_answers
):
    project = rendered(combo)
    answers = recorded_answers(combo, default_answers)
    # With the template's Jinja settings (its #% line statements), which the recorded answers leave out.
    jinja_settings = cookiecutter_json()["_jinja2_env_vars"]
    env = create_env_with_context({"cookiecutter": {**answers, "_jinja2_env_vars": jinja_settings}})
    per_loop = PER_LOOP_FILES | (PER_LOOP_TRACKER_FILES if combo.experiment_tracker != "none" else set())
    per_loop |= FSDP_ONLY_FILES if combo.include_fsdp else set()
    chosen = {name: [combo.training_loop] for name in per_loop}
    chosen |= {name: [combo.training_loop, "fsdp" if combo.include_fsdp else "ddp"] for name in PER_LOOP_AND_FSDP_FILES}
    for name, choices in sorted(chosen.items()):
        path = PROJECT_TEMPLATE / name.replace(PACKAGE, "{{cookiecutter.package_name}}")
        source = path.with_stem("_".join([path.stem, *choices]))
        text = source.read_text(encoding="utf-8")
        expected = env.from_string(text).render(cookiecutter=answers)
        assert (project / name).read_text(encoding="utf-8") == expected, name


@pytest.mark.parametrize("combo", combination_params(SUPPORTED))
def test_exactly_the_launch_scripts_are_executable_for_everyone(rendered, combo):
    # scripts/_common.sh is sourced, never run: no run bits, like every other file.
    project = rendered(combo)
    run_bits = stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH
    modes = {name: (project / name).stat().st_mode for name in relative_files(project)}
    executable = {name: mode & run_bits for name, mode in modes.items() if mode & run_bits}
    launchers = LAUNCHERS | ({SLURM_SCRIPT} if combo.include_slurm else set())
    assert executable == dict.fromkeys(launchers, run_bits)


# Unrendered Jinja: an expression or block naming cookiecutter, any block tag, a line statement
# (cookiecutter.json's _jinja2_env_vars: a line starting with #%), or a cookiecutter.<variable>
# reference (".cookiecutter.json" and "cookiecutter.json" are file names, not leftovers).
LEFTOVER_RE = re.compile(
    r"\{\{-?\s*cookiecutter|\{%|^\s*#%|(?<![\w.])cookiecutter\.(?!json\b)\w"
)


@pytest.mark.parametrize("combo", combination_params(EVERY_COMBINATION))
def test_no_unrendered_template_text(rendered, combo):
    project = rendered(combo)
    found = {}
    for name in sorted(relative_files(project)):
        try:
            text = (project / name).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # not a rendered text file; the exact file set flags it
        for number, line in enumerate(text.splitlines(), start=1):
            if LEFTOVER_RE.search(line):
                found[f"{name}:{number}"] = line.strip()
    assert found == {}


@pytest.mark.parametrize(
    "name",
    sorted(
        path.relative_to(PROJECT_TEMPLATE).as_posix()
        for path in PROJECT_TEMPLATE.rglob("*.py")
    ),
)
def test_template_python_file_parses_before_rendering(name):
    # Jinja only in file names and in #% line statements, which Python reads as comments: ruff, an IDE and a
    # reviewer read the template as code.
    source = (PROJECT_TEMPLATE / name).read_text(encoding="utf-8")
    ast.parse(source, filename=name)


@pytest.mark.parametrize("combo", combination_params(EVERY_COMBINATION))
def test_python_is_ruff_clean_with_the_projects_own_config(rendered, combo):
    project = rendered(combo)
    pyproject = tomllib.loads((project / "pyproject.toml").read_text(encoding="utf-8"))
    assert pyproject["tool"]["ruff"]["lint"]["isort"]["known-first-party"] == [PACKAGE]
    # Run from the project root so ruff finds its pyproject.toml and nothing above it.
    result = run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], project)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("combo", combination_params(SUPPORTED))
def test_scripts_pass_bash_n_and_shellcheck(rendered, combo):
    project = rendered(combo)
    scripts = sorted(
        path.relative_to(project).as_posix()
        for pattern in ("scripts/*.sh", "scripts/*.sbatch")
        for path in project.glob(pattern)
    )
    assert set(scripts) == {
        name for name in expected_files(combo) if name.startswith("scripts/")
    }
    for script in scripts:
        result = run(["bash", "-n", script], project)
        assert result.returncode == 0, f"{script}: {result.stderr}"
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck is missing: pip install -r requirements-dev.txt"
    result = run([shellcheck, "-x", *scripts], project)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("combo", combination_params(SUPPORTED))
def test_pyproject_parses_and_names_the_project(rendered, combo):
    project = rendered(combo)
    pyproject = tomllib.loads((project / "pyproject.toml").read_text(encoding="utf-8"))
    assert pyproject["project"]["name"] == SLUG
    assert pyproject["project"]["description"] == BASE_ANSWERS["description"]


# Each tracker's packages; mlflow's SQLite store needs sqlalchemy and alembic.
TRACKER_PACKAGES = {
    "tensorboard": ["tensorboard"],
    "wandb": ["wandb"],
    "mlflow": ["mlflow-skinny", "sqlalchemy", "alembic"],
}


def requirement_names(requirements: list[str]) -> list[str]:
    return [re.match(r"[A-Za-z0-9._-]+", requirement).group() for requirement in requirements]


@pytest.mark.parametrize("combo", combination_params([*SUITE_RUNS, *COVERING_RUNS]))
def test_the_chosen_trackers_packages_are_dependencies_and_every_tracker_an_extra(rendered, combo):
    # `make install` and the by-hand `pip install -e ".[dev]"` (docs/upgrading.md) then bring the chosen one.
    # With none, no tracker is a dependency or an extra.
    pyproject = tomllib.loads((rendered(combo) / "pyproject.toml").read_text(encoding="utf-8"))
    project = pyproject["project"]
    every_tracker_package = {name for names in TRACKER_PACKAGES.values() for name in names}
    dependencies = requirement_names(project["dependencies"])
    assert [name for name in dependencies if name in every_tracker_package] == TRACKER_PACKAGES.get(
        combo.experiment_tracker, []
    )
    extras = {name: requirement_names(packages) for name, packages in project["optional-dependencies"].items()}
    assert extras == {"dev": extras["dev"], **(TRACKER_PACKAGES if combo.experiment_tracker != "none" else {})}


# Import names that differ from the distribution's.
DISTRIBUTION_OF = {"yaml": "pyyaml"}


def third_party_imports(folder: Path) -> set[str]:
    """The distributions the modules under folder import (at the top or inside a function)."""
    names = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {alias.name.partition(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names.add(node.module.partition(".")[0])
    return {DISTRIBUTION_OF.get(name, name) for name in names - set(sys.stdlib_module_names) - {PACKAGE}}


@pytest.mark.parametrize("combo", combination_params([*SUITE_RUNS, *COVERING_RUNS]))
def test_the_dependencies_are_what_the_modules_import(rendered, combo):
    """And accelerate for the Trainer, which runs on it; the native loop never uses it (peft, for LoRA,
    brings it itself). The trackers' packages: the test above."""
    project = rendered(combo)
    pyproject = tomllib.loads((project / "pyproject.toml").read_text(encoding="utf-8"))
    every_tracker_package = {name for names in TRACKER_PACKAGES.values() for name in names}
    dependencies = set(requirement_names(pyproject["project"]["dependencies"])) - every_tracker_package
    imported = third_party_imports(project / "src") - set(TRACKER_PACKAGES)
    assert dependencies == imported | ({"accelerate"} if combo.training_loop == "trainer" else set())


@pytest.mark.parametrize("combo", combination_params(SUPPORTED_AND_COVERING))
def test_configs_parse_and_default_yaml_holds_the_answers(rendered, combo):
    project = rendered(combo)
    configs = {
        path.name: yaml.safe_load(path.read_text(encoding="utf-8"))
        for path in sorted((project / "configs").glob("*.yaml"))
    }
    assert set(configs) == {"default.yaml", "local_files.yaml", "smoke.yaml", "smoke_multilabel.yaml",
                            "smoke_pairs.yaml", "smoke_regression.yaml"}
    assert all(isinstance(config, dict) for config in configs.values())
    answer_keys = [
        "model_name_or_path",
        "dataset_name",
        "text_column",
        "label_column",
        "mixed_precision",
    ]
    default = configs["default.yaml"]
    assert {key: default[key] for key in answer_keys} == {
        key: combo.answers[key] for key in answer_keys
    }
    # No second text column was given: no pair line, single texts.
    assert "text_pair_column" not in default and "text_pair_column" not in configs["local_files.yaml"]
    # The tracker answer as report_to; none is the flag's default, so no line at all.
    assert default.get("report_to", "none") == combo.experiment_tracker
    assert "report_to" not in configs["smoke.yaml"]
    # local_files.yaml: the same real run, on local files, into its own output_dir.
    local_files = {**default, "output_dir": "outputs/local_files"}
    del local_files["dataset_name"]
    local_files.update(train_file="data/train.csv", validation_file="data/dev.csv")
    assert configs["local_files.yaml"] == local_files


# Text only the README and docs/ of a render for another answer may hold: (answer, its value) -> strings.
README_TEXT_ONLY_FOR = {
    ("include_slurm", True): ["SLURM", "sbatch", "srun"],
    ("training_loop", "trainer"): [
        "would train with world size",
        "`DataParallel`",
        "trains each rank alone",
        "num_items_in_batch",
        "--activation_checkpointing",  # both loops take --gradient_checkpointing; the Trainer also this name
    ],
    ("training_loop", "native"): [
        "`batching.py`",
        "`checkpoint.py`",
        "the `GradScaler` skipped",
        "any other is refused by the parser",
    ],
    ("include_lora", True): ["LoRA", "--lora_r", "peft", "merge_lora", "adapter"],
    ("include_fsdp", True): ["--fsdp", "FSDP"],
    ("experiment_tracker", "tensorboard"): ["tensorboard --logdir", "TENSORBOARD_LOGGING_DIR"],
    ("experiment_tracker", "wandb"): ["wandb sync", "WANDB_MODE", "offline-run-"],
    ("experiment_tracker", "mlflow"): ["mlflow ui", "MLFLOW_TRACKING_URI", "mlflow.db"],
    ("include_doctor", True): ["Cluster checks: the doctor", "`doctor.py`", "the doctor's `backend` line"],
}
# Any tracker's; with none, no line names --report_to or a tracker module.
TRACKER_SECTION_TEXT = ["# Experiment tracking", "tracking.py` takes your value", "`trackers.py`", "`--report_to`",
                        "the trackers"]


@pytest.mark.parametrize("combo", combination_params(SUPPORTED_AND_COVERING))
def test_readme_docs_and_folders_hold_nothing_for_an_answer_not_chosen(rendered, combo):
    readme = docs_text(rendered(combo))
    for (variable, value), strings in README_TEXT_ONLY_FOR.items():
        chosen = getattr(combo, variable) == value
        found = [text for text in strings if text in readme]
        assert found == (strings if chosen else []), (variable, value)
    tracked = combo.experiment_tracker != "none"
    assert [text for text in TRACKER_SECTION_TEXT if text in readme] == (TRACKER_SECTION_TEXT if tracked else [])
    # logs/, where the sbatch script writes, and its .gitignore lines only with SLURM; the trackers' folders
    # only with a tracker.
    project = rendered(combo)
    assert (project / "logs").is_dir() == combo.include_slurm
    gitignore = (project / ".gitignore").read_text(encoding="utf-8")
    assert ("logs/" in gitignore) == combo.include_slurm
    assert ("wandb/" in gitignore) == ("runs/" in gitignore) == tracked


# What tracker code would name. The files that may name report_to all the same: the Trainer keeps transformers'
# own --report_to (default none), which its training_args.py checks while parsing, as it checks every other flag
# of the Trainer's, and its test names; the config test reads report_to where a shipped config sets it.
TRACKER_WORDS_RE = re.compile(r"track(er|ing)|wandb|mlflow|tensorboard|report_to", re.IGNORECASE)
REPORT_TO_FILES = {
    "trainer": {f"src/{PACKAGE}/training_args.py", "tests/test_training_args.py", "tests/test_config.py"},
    "native": {"tests/test_config.py"},
}


@pytest.mark.parametrize("combo", combination_params(SUPPORTED))
def test_without_a_tracker_no_line_of_code_tests_or_dependencies_names_one(rendered, combo):
    project = rendered(combo)
    found = []
    for name in sorted(name for name in relative_files(project) if name.endswith((".py", ".toml"))):
        for number, line in enumerate((project / name).read_text(encoding="utf-8").splitlines(), start=1):
            words = {match.group().lower() for match in TRACKER_WORDS_RE.finditer(line)}
            if name in REPORT_TO_FILES[combo.training_loop]:
                words.discard("report_to")
            if words:
                found.append(f"{name}:{number}: {line.strip()}")
    assert found == []


@pytest.mark.parametrize("combo", combination_params([combo for combo in SUPPORTED if not combo.include_lora]))
def test_a_render_without_lora_names_neither_lora_nor_peft(rendered, combo):
    # No flag, dependency, module, test or README line of it; only the recorded answer says it was declined.
    project = rendered(combo)
    found = [
        f"{name}:{number}: {line.strip()}"
        for name in sorted(relative_files(project) - {".cookiecutter.json"})
        for number, line in enumerate((project / name).read_text(encoding="utf-8").splitlines(), start=1)
        if re.search("lora|peft", line, flags=re.IGNORECASE)
    ]
    assert found == []


@pytest.mark.parametrize(
    ("combo", "message"),
    [
        pytest.param(
            Combination("native", False, "auto"),
            "error: unrecognized arguments: --lora_r -1 (see --help for the flags it takes)\n",
            id="without-lora-refused-as-unknown",
        ),
        pytest.param(
            Combination("trainer", True, "no", include_kubernetes=True, include_lora=True),
            "error: --lora_r -1: must be >= 0 (0 trains every weight, without LoRA)\n",
            id="with-lora-checked",
        ),
    ],
)
def test_lora_r_is_an_unknown_flag_without_lora_and_a_checked_one_with_it(rendered, combo, message):
    project = rendered(combo)
    env = {**os.environ, "PYTHONPATH": str(project / "src"), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-m", f"{PACKAGE}.preflight", "--model_name_or_path", "some/model",
         "--train_file", "train.csv", "--lora_r", "-1"],
        cwd=project, env=env, capture_output=True, text=True, check=False, timeout=300,
    )
    assert (result.returncode, result.stderr) == (2, message)


@pytest.mark.parametrize("combo", combination_params(SUPPORTED_AND_COVERING))
def test_the_doctor_is_named_only_where_it_was_chosen(rendered, combo):
    # Its module and test, the launch scripts' help and its test, the Trainer's flags' docstring, the README
    # and docs; nothing when not chosen (the recorded answers name include_doctor itself).
    project = rendered(combo)
    naming = {
        name for name in relative_files(project) - {".cookiecutter.json"}
        if "doctor" in (project / name).read_text(encoding="utf-8").lower()
    }
    expected = set()
    if combo.include_doctor:
        expected = DOCTOR_ONLY_FILES | {"README.md", "docs/multi-node.md", "docs/troubleshooting.md",
                                        "scripts/_common.sh", "scripts/train_single_node.sh",
                                        "scripts/train_multi_node.sh", "tests/test_scripts.py"}
        if combo.training_loop == "trainer":
            expected.add(f"src/{PACKAGE}/training_args.py")
    assert naming == expected


@pytest.mark.parametrize("combo", combination_params(SUPPORTED_AND_COVERING))
def test_recorded_answers_are_the_answers_without_local_paths(
    rendered, combo, default_answers
):
    project = rendered(combo)
    text = (project / ".cookiecutter.json").read_text(encoding="utf-8")
    assert json.loads(text) == {"cookiecutter": recorded_answers(combo, default_answers)}
    assert str(project.parent) not in text and str(TEMPLATE_DIR) not in text


@pytest.mark.parametrize("combo", combination_params(SUPPORTED))
def test_replaying_recorded_answers_reproduces_the_same_files(
    rendered, render, tmp_path, combo
):
    project = rendered(combo)
    again = render(tmp_path, replay_file=project / ".cookiecutter.json")

    def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
        return {
            name: ((root / name).read_bytes(), (root / name).stat().st_mode & 0o777)
            for name in relative_files(root)
        }

    assert snapshot(again) == snapshot(project)


def test_command_line_accepts_the_recorded_answers_as_replay_file(
    rendered, tmp_path, cookiecutter_config
):
    project = rendered(Combination("native", False, "auto", include_doctor=True))
    result = run(
        [
            sys.executable,
            "-m",
            "cookiecutter",
            "--config-file",
            str(cookiecutter_config),
            "--replay-file",
            str(project / ".cookiecutter.json"),
            "-o",
            str(tmp_path),
            str(TEMPLATE_DIR),
        ],
        tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert relative_files(tmp_path / project.name) == relative_files(project)


@pytest.mark.parametrize(("nproc_per_node", "gpus"), [("4", "4"), ("auto", "8")])
def test_sbatch_requests_working_gpus_and_no_cpus(render, tmp_path, nproc_per_node, gpus):
    # The one {% if %} in the template: 'auto' requests 8 GPUs, a guess the comment says to change.
    # No CPU line: one could not be undone from the command line, and --cpus-per-gpu makes a CPU
    # partition refuse the job (the generated tests/test_slurm.py submits it to one).
    project = render(tmp_path, {"include_slurm": True, "nproc_per_node": nproc_per_node})
    sbatch = project / "scripts" / "train_slurm.sbatch"
    lines = sbatch.read_text(encoding="utf-8").splitlines()
    assert f"#SBATCH --gpus-per-node={gpus}" in lines
    assert not [line for line in lines if line.startswith(("##SBATCH", "#SBATCH --cpus-per"))]
    result = run(["bash", "-n", str(sbatch)], project)
    assert result.returncode == 0, result.stderr
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck is missing: pip install -r requirements-dev.txt"
    result = run([shellcheck, "-x", "scripts/train_slurm.sbatch"], project)
    assert result.returncode == 0, result.stdout


# --- Unsupported combinations -----------------------------------------------------------

# Answers that are each fine alone (or derived from a fine answer) but not together:
# (answers, variable named by the ERROR line, start of its message).
UNSUPPORTED = {
    "text-column-is-label-column": (
        {"text_column": "review", "label_column": "review"},
        "label_column",
        "is the same column as text_column ('review');",
    ),
    "project-name-digit-first-derives-bad-slug": (
        {"project_name": "2024 Reviews"},
        "project_slug",
        "'2024-reviews' starts with a digit",
    ),
    "project-name-derives-package-shadowing-torch": (
        {"project_name": "Torch"},
        "package_name",
        "'torch' would shadow an installed module;",
    ),
    "project-name-derives-keyword-package": (
        {"project_name": "Class"},
        "package_name",
        "'class' is a Python keyword;",
    ),
    "slug-derives-package-shadowing-test": (
        {"project_slug": "test"},
        "package_name",
        "'test' would shadow an installed module;",
    ),
}


@pytest.mark.parametrize(
    ("answers", "variable", "message"),
    [pytest.param(*case, id=name) for name, case in UNSUPPORTED.items()],
)
def test_unsupported_combination_is_refused_with_its_error_line(
    render, tmp_path, capfd, answers, variable, message
):
    output_dir = tmp_path / "out"
    output_dir.mkdir()
    with pytest.raises(FailedHookException):
        render(output_dir, answers)
    lines = error_lines(capfd.readouterr().err)
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"ERROR: {variable}: {message}"), lines[0]
    assert list(output_dir.iterdir()) == []


def test_project_name_without_letters_or_digits_gets_a_generic_slug(render, tmp_path):
    # "!!!" slugifies to ""; the slug default falls back to "project" rather than to the
    # output folder itself.
    project = render(tmp_path, {"project_name": "!!!"})
    assert project.name == "project"
    assert (project / "src" / "project" / "train.py").is_file()


# --- Each distinct rendered repo passes its own test suite -----------------------------

SUMMARY_RE = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)\b")


def summary_counts(output: str) -> dict[str, int]:
    """Counts from pytest's last summary line ('3 passed, 1 skipped in 9.1s')."""
    summaries = [
        line for line in output.splitlines() if re.search(r" in [\d.]+s\b", line)
    ]
    assert summaries, f"no pytest summary line in:\n{output[-3000:]}"
    counts = {"passed": 0, "failed": 0, "errors": 0}
    for number, outcome in SUMMARY_RE.findall(summaries[-1]):
        key = "errors" if outcome.startswith("error") else outcome
        counts[key] = int(number)
    return counts


# What proves the template beyond a render's own tests: a real SLURM (two nodes in network namespaces,
# root) and a simulated node of 8 GPUs. They run inside a copy of a render, beside its own tests, whose
# tests/conftest.py they use; no render ships them. Their helpers (tests/support/) are copied with them, all
# but the fault matrix's runner, which the template's own tests run.
PROOFS = TEMPLATE_DIR / "tests" / "proofs"
SUPPORT = TEMPLATE_DIR / "tests" / "support"
NOT_COPIED = ["fault_inject.py", "README.md", "__pycache__"]
SLURM_PROOFS = ["slurm_cluster.py", "test_slurm.py", "test_slurm_cluster.py", "slow_steps.py"]
NATIVE_PROOFS = ["test_native_resume.py", "test_fsdp.py"]
FSDP_PROOFS = ["test_fsdp.py"]  # test_slurm.py's and test_gpu_node.py's FSDP tests skip themselves without it
TRACKER_PROOFS = ["test_tracking_runs.py"]  # marked tracker; they need warm_launch.py and proof_scheduling.py
# Tests of SLURM's own behaviour, which never import the package: the first suite run proves them.
LOOP_INDEPENDENT_TESTS = ["tests/test_slurm_cluster.py"]


def test_loop_independent_proofs_reach_no_loop_code():
    for path in [PROOFS / "test_slurm_cluster.py", SUPPORT / "slurm_cluster.py"]:
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"package_module|PACKAGE|IS_NATIVE|\btrain\b", text), path.name


def add_proofs(project: Path, combo: Combination) -> None:
    """The template's proofs, copied into a render's tests/ (the SLURM ones where it has the sbatch script, the
    native loop's where it has that loop, FSDP's where it has FSDP, the trackers' where it has one)."""
    for path in [*PROOFS.iterdir(), *SUPPORT.iterdir()]:
        if path.name in NOT_COPIED:
            continue
        if path.name in SLURM_PROOFS and not combo.include_slurm:
            continue
        if path.name in NATIVE_PROOFS and combo.training_loop != "native":
            continue
        if path.name in FSDP_PROOFS and not combo.include_fsdp:
            continue
        if path.name in TRACKER_PROOFS and combo.experiment_tracker == "none":
            continue
        if path.is_dir():
            shutil.copytree(path, project / "tests" / path.name)
        else:
            shutil.copy2(path, project / "tests" / path.name)


SUITE_TIMEOUT = 2700


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, parents first (launchers start their own sessions, so no group holds them all)."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            found += [child, *descendants(child)]
    return found


def stop_and_describe(process: subprocess.Popen) -> str:
    """Each process's Python stack (py-spy), then stop them all: what a hung suite was waiting on."""
    pids = [process.pid, *descendants(process.pid)]
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    reports = []
    for pid in pids:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")[:300]
            dump = subprocess.run([py_spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
            stack = dump.stdout or (dump.stderr.splitlines() or ["no stack"])[0]  # not Python: py-spy's reason
            reports.append(f"--- {pid}: {command}\n{stack}")
        except (OSError, subprocess.TimeoutExpired) as error:
            reports.append(f"--- {pid}: {error}")
    for pid in reversed(pids):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    output, _ = process.communicate()
    return "Its processes:\n" + "\n".join(reports) + f"\nIts output:\n{output[-6000:]}"


def make_env() -> dict[str, str]:
    """The environment for a render's make: none of this run's pytest, make or import settings."""
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in {"PYTHONPATH", "PYTEST_ADDOPTS", "PYTEST_PLUGINS", "MAKEFLAGS", "MFLAGS", "MAKELEVEL"}
    }
    return env | {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def run_make(project: Path, target: str, args: list[str], timeout: int, python: Path | str = sys.executable) -> str:
    """`make <target>` in a render, as its README tells a user (on the tests' interpreter, or python); its
    output, once it has passed with at least one test and no failure."""
    env = make_env()
    command = ["make", target, f"PYTHON={python}", f"ARGS={' '.join(args)}"]
    process = subprocess.Popen(
        command, cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"make {target} ran past {timeout} s. {stop_and_describe(process)}")
    counts = summary_counts(output)
    assert process.returncode == 0, output[-12000:]
    assert counts["failed"] == 0 and counts["errors"] == 0, counts
    assert counts["passed"] > 0, counts
    return output


# make test-all (pytest-xdist workers, each module on one), which runs the proofs too, ordered and grouped by
# their plugin (tests/support/proof_scheduling.py).
SUITE_ARGS = ["-q", "-x", "-p", "no:cacheprovider", "-p", "proof_scheduling"]


@pytest.mark.rendered_suite
@pytest.mark.parametrize("combo", combination_params(SUITE_RUNS))
def test_rendered_repo_passes_its_own_test_suite_and_the_template_proofs(rendered, combo, tmp_path):
    # A copy, so the run's caches and outputs never reach the shared render.
    project = Path(shutil.copytree(rendered(combo), tmp_path / SLUG))
    add_proofs(project, combo)
    args = [] if combo == SUITE_RUNS[0] else [f"--ignore={name}" for name in LOOP_INDEPENDENT_TESTS]
    run_make(project, "test-all", [*SUITE_ARGS, *args], SUITE_TIMEOUT)


@pytest.mark.parametrize("loop", ["trainer", "native"])
def test_without_fsdp_its_flags_are_refused_in_one_error_line(rendered, loop):
    # The native loop's parser has no such flag; the Trainer's TrainingArguments inherits transformers' own,
    # which parallel.py refuses while parsing.
    project = rendered(Combination(loop, True, "auto"))
    refused = {
        "--fsdp": "true",
        "--fsdp_config": "fsdp.json",
    }
    for flag, value in refused.items():
        result = subprocess.run(
            [sys.executable, "-m", f"{PACKAGE}.train", "--model_name_or_path", "m", "--train_file", "t.jsonl",
             flag, value],
            cwd=project, env={**os.environ, "PYTHONPATH": "src"}, capture_output=True, text=True, timeout=300,
        )
        assert result.returncode == 2
        expected = (f"unrecognized arguments: {flag} {value} (see --help for the flags it takes)"
                    if loop == "native" else
                    f"{flag} {value}: this project was generated to train with DDP alone (include_fsdp no); drop "
                    "the flag, or generate it again with include_fsdp yes")
        assert result.stderr == f"error: {expected}\n"


@pytest.mark.parametrize("combo", combination_params([c for c in SUPPORTED if not c.include_fsdp]))
def test_without_fsdp_no_file_holds_fsdp_code_or_text(rendered, combo):
    # But the Trainer's parallel.py, which refuses transformers' own --fsdp, and the recorded answers.
    project = rendered(combo)
    allowed = {".cookiecutter.json"} | ({f"src/{PACKAGE}/parallel.py"} if combo.training_loop == "trainer" else set())
    found = sorted(
        name for name in relative_files(project) - allowed
        if re.search(r"fsdp|fully_shard|DTensor|reduce.scatter", (project / name).read_text("utf-8", "replace"),
                     re.IGNORECASE)
    )
    assert found == []


# The trackers' proofs train with each one, so they need a render with a tracker (whichever it is, its
# --report_to takes all three): the first of each loop runs them beside its own tests but the slow ones.
TRACKER_PROOF_RUNS = [next(c for c in COVERING_RUNS if c.training_loop == loop and c.experiment_tracker != "none")
                      for loop in CHOICES["training_loop"]]


@pytest.mark.rendered_suite
@pytest.mark.parametrize("combo", combination_params(COVERING_RUNS))
def test_rendered_repo_passes_its_own_make_test(rendered, combo, tmp_path):
    # The test a user runs before each commit, on each render of the covering set.
    project = Path(shutil.copytree(rendered(combo), tmp_path / SLUG))
    if combo not in TRACKER_PROOF_RUNS:
        run_make(project, "test", ["-q", "-p", "no:cacheprovider"], timeout=600)
        return
    for name in TRACKER_PROOFS:
        shutil.copy2(PROOFS / name, project / "tests" / name)
    for name in ["warm_launch.py", "proof_scheduling.py"]:
        shutil.copy2(SUPPORT / name, project / "tests" / name)
    run_make(project, "test-all", [*SUITE_ARGS, "-m", "'not slow or tracker'"], SUITE_TIMEOUT)


@pytest.mark.parametrize("combo", combination_params(SUPPORTED_AND_COVERING))
def test_every_function_and_class_the_package_defines_is_used_by_the_project(rendered, combo):
    # A render ships only what its loop runs: a top-level definition named nowhere else in the package,
    # the scripts, the configs or the manifests (tests do not count) is code the render does not use.
    project = rendered(combo)
    sources = {path: path.read_text(encoding="utf-8") for path in (project / "src").rglob("*.py")}
    elsewhere = " ".join(
        path.read_text(encoding="utf-8")
        for folder in ("scripts", "configs", "k8s")
        for path in (project / folder).rglob("*")
        if path.is_file()
    ) + (project / "pyproject.toml").read_text(encoding="utf-8")
    unused = []
    for path, text in sources.items():
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name != "main":
                pattern = re.compile(rf"\b{node.name}\b")
                uses = sum(len(pattern.findall(source)) for source in sources.values())
                if uses <= 1 and not pattern.search(elsewhere):
                    unused.append(f"{path.relative_to(project)}: {node.name}")
    assert unused == []


# What a render hands its user, in lines: its tests and test helpers, and its shell scripts (the
# proofs stay in the template: tests/proofs/, tests/support/). src/ has a budget (README.md, "What you
# get"): the default render of each loop, and the fullest (every yes/no answer on, a tracker), within the
# default renders' sizes from when every render had every feature. The launcher (torchrun.py, worker.py)
# is counted apart, held at its size: what it does cannot be had in fewer lines (the README says what).
# src/ as a whole and its lines over 110 characters are held at the counts they have come down to:
# lower them as the code shrinks.
SHELL_CAP, TESTS_CAP = 450, {"default": 2748, "fullest": 3000}
SRC_BUDGET = {"default": {"native": 2900, "trainer": 2600}, "fullest": {"native": 3854, "trainer": 3341}}
LAUNCHER, LAUNCHER_CAP = ("torchrun.py", "worker.py"), 282
SRC_CAP = {"default": {"native": 3153, "trainer": 2780}, "fullest": {"native": 3921, "trainer": 3476}}
LONG_LINES_CAP = {"native": 48, "trainer": 56}
# Not by packing: src/'s characters per non-blank line stay at most what they were before the budget (62).
CHARACTERS_PER_LINE_CAP = 62.0


def line_counts(paths: list[Path]) -> tuple[int, int]:
    """Lines in all of paths, and how many of them are over 110 characters."""
    lines = [line for path in paths for line in path.read_text(encoding="utf-8").splitlines()]
    return len(lines), sum(len(line) > 110 for line in lines)


def characters_per_line(paths: list[Path]) -> float:
    lines = [line for path in paths for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return sum(map(len, lines)) / len(lines)


# Each loop's render with the default answers, and with every feature (every yes/no answer, a tracker).
LEAN_RUNS = {
    **{f"default-{loop}": Combination(loop, True, "auto") for loop in ("trainer", "native")},
    **{f"fullest-{loop}": Combination(loop, True, "auto", True, "mlflow", include_lora=True, include_doctor=True,
                                      include_fsdp=True)
       for loop in ("trainer", "native")},
}


@pytest.mark.parametrize("name", LEAN_RUNS)
def test_render_stays_lean(rendered, name):
    combo = LEAN_RUNS[name]
    project = rendered(combo)
    sources = sorted((project / "src").rglob("*.py"))
    src, long_lines = line_counts(sources)
    launcher, _ = line_counts([path for path in sources if path.name in LAUNCHER])
    tests, _ = line_counts(sorted((project / "tests").rglob("*.py")))
    shell, _ = line_counts(sorted((project / "scripts").glob("*.sh")) + sorted((project / "scripts").glob("*.sbatch")))
    kind, loop = name.split("-")
    cap = SRC_CAP[kind][loop]
    assert src <= cap and long_lines <= LONG_LINES_CAP[loop], (
        f"src/: {src} lines (cap {cap}), {long_lines} over 110 characters (cap {LONG_LINES_CAP[loop]})")
    assert src - launcher <= SRC_BUDGET[kind][loop], (
        f"src/ besides the launcher: {src - launcher} lines, budget {SRC_BUDGET[kind][loop]}")
    assert launcher <= LAUNCHER_CAP, f"the launcher ({', '.join(LAUNCHER)}): {launcher} lines, cap {LAUNCHER_CAP}"
    density = characters_per_line(sources)
    assert density <= CHARACTERS_PER_LINE_CAP, (
        f"src/: {density:.2f} characters per non-blank line, cap {CHARACTERS_PER_LINE_CAP}")
    assert tests <= TESTS_CAP[kind], f"tests/: {tests} lines, cap {TESTS_CAP[kind]}"
    assert shell <= SHELL_CAP, f"scripts/: {shell} lines of shell, cap {SHELL_CAP}"


# --- What a user reads: README.md and docs/ -----------------------------------------------

# The README is the first hour (install, smoke run, own data, launch, train.py, where things are, options,
# tests); the rest is in docs/, one page per topic. Every combination of the answers, and the fullest of each loop.
DOCS_RUNS = list(dict.fromkeys([*LEAN_RUNS.values(), *EVERY_COMBINATION]))
README_LINES_CAP = 250
LINK_RE = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def heading_anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings (outside code blocks)."""
    anchors, in_code = set(), False
    for line in page.read_text(encoding="utf-8").splitlines():
        in_code ^= line.startswith("```")
        if not in_code and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


@pytest.mark.parametrize("combo", combination_params(DOCS_RUNS))
def test_readme_stays_short(rendered, combo):
    lines = (rendered(combo) / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_LINES_CAP, f"README.md: {lines} lines, cap {README_LINES_CAP}: move detail to docs/"


@pytest.mark.parametrize("combo", combination_params(DOCS_RUNS))
def test_every_relative_link_in_readme_and_docs_reaches_a_file_and_heading_of_the_render(rendered, combo):
    project = rendered(combo)
    broken = []
    for page in [project / "README.md", *sorted((project / "docs").glob("*.md"))]:
        for target in LINK_RE.findall(page.read_text(encoding="utf-8")):
            if "://" in target:
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.is_file() or not linked.is_relative_to(project.resolve()):
                broken.append(f"{page.relative_to(project)}: {target}")
            elif anchor and anchor not in heading_anchors(linked):
                broken.append(f"{page.relative_to(project)}: {target} (no such heading)")
    assert broken == []


@pytest.mark.parametrize("combo", combination_params(DOCS_RUNS))
def test_the_template_is_named_once_outside_the_section_on_updating_from_it(rendered, combo):
    # Its tests and benchmarks prove more than the render's own: one sentence says so. Other pages state what
    # holds without pointing at the template's files.
    text = docs_text(rendered(combo))
    start = text.index("## Updating from the template")
    end = text.find("\n#", start + 1)
    text = text[:start] + (text[end:] if end >= 0 else "")
    assert len(re.findall(r"\btemplate\b", text, re.IGNORECASE)) == 1
