"""The hooks: each validator on its own, then refusals and finishing in real renders."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import (
    HOOKS_DIR,
    PACKAGE_TEMPLATE,
    PROJECT_TEMPLATE,
    TEMPLATE_DIR,
    cookiecutter_json,
    error_lines,
    load_hook,
    post_gen,
    pre_gen,
)
from cookiecutter.environment import StrictEnvironment
from cookiecutter.exceptions import FailedHookException
from cookiecutter.utils import create_env_with_context

ANSWERS_LITERAL = "{{ cookiecutter | tojson }}"


def case_id(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 30 else text[:27] + "..."


def cases(table: dict[str, list]) -> list:
    """Flatten {variable: [value or (value, fragment)]} into pytest params with ids."""
    params = []
    for variable, values in table.items():
        for entry in values:
            args = entry if isinstance(entry, tuple) else (entry,)
            params.append(
                pytest.param(variable, *args, id=f"{variable}={case_id(args[0])}")
            )
    return params


# --- Validators, called directly ----------------------------------------------------

# Dependencies of the rendered project, test folders, and a few standard-library names.
# fmt: off
SHADOWING_NAMES = [
    "torch", "transformers", "datasets", "accelerate", "tokenizers", "test", "tests",
    "numpy", "yaml", "json", "logging", "typing", "code", "wandb", "mlflow", "tensorboard",
]
# fmt: on

GOOD_ANSWERS = {
    "project_name": [
        "Text Classifier",
        "x",
        "Ünïcødé 日本語 👩‍💻",
        'He said "hi" & it\'s $(rm -rf ~) `id` {{ 7*7 }} {% raw %} \\',
    ],
    "project_slug": ["text-classifier", "a", "bert2-imdb"],
    "package_name": ["text_classifier", "_private", "bert2", "match"],
    "description": ["", "Quotes ' \" and a \\ backslash", "100% {0} %s"],
    "training_loop": ["trainer", "native"],
    "model_name_or_path": [
        "bert-base-uncased",
        "distilbert/distilbert-base-uncased",
        "./models/x",
        "/abs/models/x",
        "models/v1.0",
    ],
    "dataset_name": ["imdb", "stanfordnlp/sst2", "./data/reviews"],
    "text_column": ["text", "sentence1", "_t", "Review"],
    "text_pair_column": ["", "sentence2", "hypothesis"],
    "label_column": ["label", "Label", "y"],
    "nproc_per_node": ["auto", "1", "8", "1024", 8],
    "nnodes": ["1", "2", "512", 4],
    "master_port": ["1024", "29500", "65535"],
    "mixed_precision": ["auto", "bf16", "fp16", "no"],
    "experiment_tracker": ["none", "tensorboard", "wandb", "mlflow"],
    "include_slurm": [True, False],
    "include_kubernetes": [True, False],
    "include_lora": [True, False],
    "include_doctor": [True, False],
    "include_fsdp": [True, False],
}

BAD_ANSWERS = {
    "project_name": [
        ("", "is empty"),
        ("   ", "is empty"),
        ("two\nlines", "'\\n'"),
        ("carriage\rreturn", "'\\r'"),
        ("tab\there", "'\\t'"),
        ("\x1b[31mred", "control character"),
        ("line\u2028separator", "line break"),
        ("\ud800", "control character"),
        (3, "is not text"),
        (None, "is not text"),
    ],
    "project_slug": [
        ("", "is empty"),
        ("My Project", "contains 'M'"),
        ("text classifier", "contains whitespace"),
        ("a/b", "path separator"),
        ("a\\b", "path separator"),
        ("../escape", "path separator"),
        ("/abs/path", "path separator"),
        ("..", "contains '..'"),
        ("a..b", "contains '..'"),
        ("3d-model", "starts with a digit"),
        ("-lead", "'-'"),
        ("trail-", "'-'"),
        ("dou--ble", "'-'"),
        ("under_score", "contains '_'"),
        ("dotted.name", "contains '.'"),
        ("x$(id)", "contains '$'"),
        ("ünï", "contains 'ü'"),
        (7, "is not text"),
    ],
    "package_name": [
        ("", "is empty"),
        ("3d", "starts with a digit"),
        ("my-pkg", "contains '-'"),
        ("MyPkg", "contains 'M'"),
        ("pkg name", "contains whitespace"),
        ("a.b", "contains '.'"),
        ("class", "keyword"),
        ("import", "keyword"),
        ("None", "contains 'N'"),
        *[(name, "would shadow") for name in SHADOWING_NAMES],
    ],
    "description": [
        ("two\nlines", "'\\n'"),
        ("nul\x00byte", "'\\x00'"),
        (42, "is not text"),
    ],
    "training_loop": [
        ("keras", "is not a choice"),
        ("", "is not a choice"),
        ("Trainer", "is not a choice"),
        (None, "is not a choice"),
    ],
    "model_name_or_path": [
        ("", "is empty"),
        ("bert base", "contains whitespace"),
        (" bert", "contains whitespace"),
        ("a\nb", "contains whitespace"),
        ("$(touch x)", "contains '$'"),
        ("`id`", "contains '`'"),
        ("a;b", "contains ';'"),
        ("a|b", "contains '|'"),
        ("a&b", "contains '&'"),
        ("~/models", "contains '~'"),
        ("C:\\models", "contains ':'"),
        ("name@rev", "contains '@'"),
        ("..", "'..' path component"),
        ("../models", "'..' path component"),
        ("models/../../etc", "'..' path component"),
        ("-rf", "starts with '-'"),
        ("--help", "starts with '-'"),
    ],
    "dataset_name": [
        ("", "is empty"),
        ("imdb;rm", "contains ';'"),
        ("../data", "'..' path component"),
        ("my data", "contains whitespace"),
    ],
    "text_column": [
        ("", "is empty"),
        ("my text", "contains whitespace"),
        ("1st", "starts with a digit"),
        ("review-text", "contains '-'"),
        ("col.name", "contains '.'"),
        ("$x", "contains '$'"),
        ("ü", "contains 'ü'"),
    ],
    "label_column": [("", "is empty"), ("la bel", "contains whitespace")],
    "text_pair_column": [("second text", "contains whitespace"), ("2nd", "starts with a digit"), (None, "is not text")],
    "nproc_per_node": [
        ("0", "below 1"),
        ("1025", "above 1024"),
        ("-1", "not a whole number"),
        ("two", "not a whole number"),
        ("gpu", "'auto'"),
        ("1.5", "not a whole number"),
        ("", "not a whole number"),
        (" 2", "not a whole number"),
        ("08", "leading zero"),
        (True, "not a whole number"),
        (None, "not a whole number"),
    ],
    "nnodes": [
        ("0", "below 1"),
        ("-2", "not a whole number"),
        ("abc", "not a whole number"),
        ("", "not a whole number"),
        ("1.0", "not a whole number"),
        ("01", "leading zero"),
        ("9" * 5000, "not a whole number"),
        (False, "not a whole number"),
    ],
    "master_port": [
        ("1023", "below 1024"),
        ("65536", "above 65535"),
        ("0", "below 1024"),
        (80, "below 1024"),
        ("http", "not a whole number"),
        ("29500 ", "not a whole number"),
        ("", "not a whole number"),
    ],
    "mixed_precision": [
        ("fp8", "is not a choice"),
        ("FP16", "is not a choice"),
        ("", "is not a choice"),
    ],
    "experiment_tracker": [
        ("comet", "is not a choice"),
        ("WandB", "is not a choice"),
        ("", "is not a choice"),
        (None, "is not a choice"),
    ],
    "include_slurm": [
        ("no", "not a boolean"),
        ("yes", "not a boolean"),
        ("true", "not a boolean"),
        (1, "not a boolean"),
        (None, "not a boolean"),
    ],
    "include_kubernetes": [
        ("no", "not a boolean"),
        ("false", "not a boolean"),
        (0, "not a boolean"),
        (None, "not a boolean"),
    ],
    "include_lora": [
        ("yes", "not a boolean"),
        ("False", "not a boolean"),
        (1, "not a boolean"),
        (None, "not a boolean"),
    ],
    "include_doctor": [
        ("yes", "not a boolean"),
        ("n", "not a boolean"),
        (1, "not a boolean"),
        (None, "not a boolean"),
    ],
    "include_fsdp": [
        ("yes", "not a boolean"),
        ("true", "not a boolean"),
        (1, "not a boolean"),
        (None, "not a boolean"),
    ],
}


def test_there_is_one_validator_per_variable_in_cookiecutter_json_order():
    variables = [key for key in cookiecutter_json() if not key.startswith("_")]
    assert list(pre_gen.VALIDATORS) == variables
    assert set(GOOD_ANSWERS) == set(BAD_ANSWERS) == set(variables)


def test_validator_choices_are_the_choices_in_cookiecutter_json():
    config = cookiecutter_json()
    assert list(pre_gen.TRAINING_LOOPS) == config["training_loop"]
    assert list(pre_gen.MIXED_PRECISIONS) == config["mixed_precision"]
    assert list(pre_gen.EXPERIMENT_TRACKERS) == config["experiment_tracker"]
    assert list(post_gen.TRAINING_LOOPS) == config["training_loop"]
    assert list(post_gen.FILE_CHOICES["training_loop"]) == config["training_loop"]
    assert set(post_gen.FILE_CHOICES["include_fsdp"]) == {True, False}


def test_default_answers_pass_every_check(default_answers):
    assert pre_gen.find_first_problem(default_answers) is None


@pytest.mark.parametrize(("variable", "value"), cases(GOOD_ANSWERS))
def test_validator_accepts(variable, value):
    assert pre_gen.VALIDATORS[variable](value) is None


@pytest.mark.parametrize(("variable", "value", "fragment"), cases(BAD_ANSWERS))
def test_validator_refuses_with_a_one_line_reason_and_what_is_accepted(
    variable, value, fragment
):
    message = pre_gen.VALIDATORS[variable](value)
    assert message is not None
    assert fragment in message
    wrong, _, accepted = message.partition("; ")
    assert wrong and accepted, message
    line = f"ERROR: {variable}: {message}"
    assert line.isprintable() and len(line) <= 200, line


@pytest.mark.parametrize("pair", ["review", "stars"])
def test_the_pair_column_must_differ_from_the_text_and_label_columns(default_answers, pair):
    answers = {**default_answers, "text_column": "review", "label_column": "stars", "text_pair_column": pair}
    variable, message = pre_gen.check_combinations(answers)
    assert variable == "text_pair_column"
    assert message == f"'{pair}' is already the text or label column; name the second text's column"
    assert pre_gen.check_combinations({**answers, "text_pair_column": "summary"}) is None
    assert pre_gen.check_combinations({**answers, "text_pair_column": ""}) is None


def test_text_and_label_column_must_differ(default_answers):
    answers = {**default_answers, "text_column": "review", "label_column": "review"}
    variable, message = pre_gen.find_first_problem(answers)
    assert variable == "label_column"
    assert "same column as text_column ('review')" in message
    assert pre_gen.check_combinations({**answers, "label_column": "stars"}) is None


def test_project_name_starting_with_a_digit_is_refused_at_its_slug(default_answers):
    answers = {
        **default_answers,
        "project_name": "3D Vision",
        "project_slug": "3d-vision",
        "package_name": "3d_vision",
    }
    variable, message = pre_gen.find_first_problem(answers)
    assert variable == "project_slug"
    assert "starts with a digit" in message


def test_only_the_first_bad_variable_is_reported(default_answers):
    answers = {**default_answers, "package_name": "class", "master_port": "80"}
    assert pre_gen.find_first_problem(answers)[0] == "package_name"


def test_main_prints_exactly_one_error_line_and_returns_1(
    monkeypatch, capsys, default_answers
):
    bad = {**default_answers, "package_name": "torch", "nnodes": "0"}
    monkeypatch.setattr(pre_gen, "ANSWERS_JSON", json.dumps(bad))
    assert pre_gen.main() == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        "ERROR: package_name: 'torch' would shadow an installed module; "
        + pre_gen.PACKAGE_ACCEPTED
    ]


def test_main_is_silent_for_good_answers(monkeypatch, capsys, default_answers):
    monkeypatch.setattr(pre_gen, "ANSWERS_JSON", json.dumps(default_answers))
    assert pre_gen.main() == 0
    assert capsys.readouterr() == ("", "")


# --- The hooks read answers as data -------------------------------------------------

HOSTILE_TEXT = (
    "'''\"\"\" \\ trailing \\\\ {{ 7*7 }} {% raw %} {# x </script> & \u2028"
    " 👩‍💻 $(id) `id` \\"
)


@pytest.mark.parametrize("hook_name", ["pre_gen_project", "post_gen_project"])
def test_hook_holds_one_jinja_expression_the_answers_literal(hook_name):
    source = (HOOKS_DIR / f"{hook_name}.py").read_text(encoding="utf-8")
    assert source.count(ANSWERS_LITERAL) == 1
    rest = source.replace(ANSWERS_LITERAL, "")
    assert not any(delimiter in rest for delimiter in ("{{", "{%", "{#"))


@pytest.mark.parametrize("hook_name", ["pre_gen_project", "post_gen_project"])
def test_rendered_hook_reads_any_answer_back_exactly(
    hook_name, tmp_path, default_answers
):
    answers = {
        **default_answers,
        "project_name": HOSTILE_TEXT,
        "description": HOSTILE_TEXT + "\n",
        "_output_dir": "/tmp/out",
    }
    context = {"cookiecutter": answers}
    source = (HOOKS_DIR / f"{hook_name}.py").read_text(encoding="utf-8")
    # What cookiecutter.hooks.run_script_with_context does to a hook.
    rendered = create_env_with_context(context).from_string(source).render(**context)
    rendered_file = tmp_path / f"{hook_name}.py"
    rendered_file.write_text(rendered, encoding="utf-8")
    module = load_hook(f"rendered_{hook_name}", rendered_file)
    assert json.loads(module.ANSWERS_JSON) == answers


# --- Refusals through real renders --------------------------------------------------

# (answers given as key=value on the command line, variable the ERROR line names)
BAD_RENDERS = {
    "package-name-keyword": ({"package_name": "class"}, "package_name"),
    "package-name-shadows-torch": ({"package_name": "torch"}, "package_name"),
    "package-name-shadows-stdlib": ({"package_name": "json"}, "package_name"),
    "project-name-newline": ({"project_name": "two\nlines"}, "project_name"),
    "project-name-empty": (
        {"project_name": "", "project_slug": "empty-name"},
        "project_name",
    ),
    "project-name-digit-first": ({"project_name": "3D Vision"}, "project_slug"),
    "slug-with-space": ({"project_slug": "My Project"}, "project_slug"),
    "slug-nested": ({"project_slug": "nested/project"}, "project_slug"),
    "slug-parent": ({"project_slug": "../escaped"}, "project_slug"),
    "slug-parent-inside": ({"project_slug": "inner/../../escaped"}, "project_slug"),
    "slug-absolute": ({"project_slug": "ABSOLUTE/deeper/project"}, "project_slug"),
    "model-command": ({"model_name_or_path": "$(touch pwned)"}, "model_name_or_path"),
    "model-parent-path": ({"model_name_or_path": "../models/x"}, "model_name_or_path"),
    "dataset-space": ({"dataset_name": "my data"}, "dataset_name"),
    "text-column-dash": ({"text_column": "review-text"}, "text_column"),
    "same-columns": ({"label_column": "text"}, "label_column"),
    "nproc-zero": ({"nproc_per_node": "0"}, "nproc_per_node"),
    "nproc-too-many": ({"nproc_per_node": "4096"}, "nproc_per_node"),
    "nnodes-word": ({"nnodes": "two"}, "nnodes"),
    "port-1023": ({"master_port": "1023"}, "master_port"),
    "port-65536": ({"master_port": "65536"}, "master_port"),
}

# Cookiecutter itself stops on these when given on the command line (ValueError, no
# hook), so they can only reach the hook through a replay file.
BAD_REPLAYS = {
    "training-loop-unknown": ({"training_loop": "keras"}, "training_loop"),
    "mixed-precision-unknown": ({"mixed_precision": "fp8"}, "mixed_precision"),
    "experiment-tracker-unknown": ({"experiment_tracker": "comet"}, "experiment_tracker"),
    "include-slurm-string": ({"include_slurm": "no"}, "include_slurm"),
    "include-kubernetes-string": ({"include_kubernetes": "no"}, "include_kubernetes"),
    "include-lora-string": ({"include_lora": "yes"}, "include_lora"),
    "include-doctor-string": ({"include_doctor": "yes"}, "include_doctor"),
    "include-fsdp-string": ({"include_fsdp": "yes"}, "include_fsdp"),
    "nnodes-negative": ({"nnodes": "-1"}, "nnodes"),
    "project-name-jinja-newline": ({"project_name": "{{ x }}\n"}, "project_name"),
}


def parents_named_by_slug(root: Path, output_dir: Path, slug: str) -> set[str]:
    """Folders under root that the slug names above the project folder itself."""
    parts = Path(slug).parts
    named = {
        Path(os.path.normpath(output_dir.joinpath(*parts[:depth])))
        for depth in range(1, len(parts))
    }
    return {
        folder.relative_to(root).as_posix()
        for folder in named
        if folder.is_relative_to(root)
    }


def resolve_placeholders(answers: dict, root: Path) -> dict:
    slug = answers.get("project_slug", "")
    if slug.startswith("ABSOLUTE/"):
        return {**answers, "project_slug": str(root / slug.removeprefix("ABSOLUTE/"))}
    return answers


@pytest.mark.parametrize(
    "output_dir_existed", [True, False], ids=["out-existed", "out-new"]
)
@pytest.mark.parametrize(
    ("answers", "variable", "replay"),
    [pytest.param(*case, False, id=name) for name, case in BAD_RENDERS.items()]
    + [
        pytest.param(*case, True, id=f"replay-{name}")
        for name, case in BAD_REPLAYS.items()
    ],
)
def test_refused_answer_prints_one_error_line_and_leaves_no_file(
    render, tmp_path, capfd, answers, variable, replay, output_dir_existed
):
    output_dir = tmp_path / "work" / "out"
    if output_dir_existed:
        output_dir.mkdir(parents=True)
    answers = resolve_placeholders(answers, tmp_path)
    slug = str(answers.get("project_slug", ""))

    with pytest.raises(FailedHookException):
        render(output_dir, answers, replay=replay)

    lines = error_lines(capfd.readouterr().err)
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"ERROR: {variable}: ")
    # Cookiecutter makes the project folder with mkdir(parents=True) and removes only
    # the project folder: work/out and, for a slug holding '/', the parents the slug
    # names may remain, empty (as the README says). Nothing else is left.
    left = {path.relative_to(tmp_path).as_posix() for path in tmp_path.rglob("*")}
    assert left <= {"work", "work/out", *parents_named_by_slug(tmp_path, output_dir, slug)}
    assert all((tmp_path / name).is_dir() for name in left), left


def test_refusal_on_the_command_line_shows_the_error_line_first(
    tmp_path, cookiecutter_config
):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "cookiecutter",
            "--no-input",
            "--config-file",
            str(cookiecutter_config),
            str(TEMPLATE_DIR),
            "package_name=class",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    # Cookiecutter then logs its own "ERROR: Stopping generation ..." and a traceback.
    assert lines[0] == (
        "ERROR: package_name: 'class' is a Python keyword; " + pre_gen.PACKAGE_ACCEPTED
    )
    assert sum(line.startswith("ERROR: package_name:") for line in lines) == 1
    assert list(tmp_path.iterdir()) == []


def test_refusal_with_overwrite_keeps_the_existing_folder_untouched(
    render, tmp_path, capfd
):
    existing = tmp_path / "text-classifier"
    existing.mkdir()
    (existing / "notes.txt").write_text("mine\n", encoding="utf-8")

    with pytest.raises(FailedHookException):
        render(tmp_path, {"package_name": "class"}, overwrite_if_exists=True)

    assert error_lines(capfd.readouterr().err)[0].startswith("ERROR: package_name: ")
    assert [path.name for path in existing.iterdir()] == ["notes.txt"]
    assert (existing / "notes.txt").read_text(encoding="utf-8") == "mine\n"


# --- Post-generation: what the hook decides; the rendered results are in test_render.py


def test_include_slurm_no_on_the_command_line_arrives_as_false(render, tmp_path):
    project = render(tmp_path, {"include_slurm": "no"})
    assert not (project / "scripts" / "train_slurm.sbatch").exists()
    recorded = json.loads((project / ".cookiecutter.json").read_text(encoding="utf-8"))
    assert recorded["cookiecutter"]["include_slurm"] is False


def test_include_lora_yes_on_the_command_line_arrives_as_true_and_keeps_loras_files(render, tmp_path):
    project = render(tmp_path, {"include_lora": "yes"})
    package = project / "src" / "text_classifier"
    assert (package / "lora.py").is_file() and (package / "merge_lora.py").is_file()
    assert (project / "tests" / "test_lora.py").is_file()
    recorded = json.loads((project / ".cookiecutter.json").read_text(encoding="utf-8"))
    assert recorded["cookiecutter"]["include_lora"] is True


@pytest.mark.parametrize("loop", ["trainer", "native"])
@pytest.mark.parametrize("fsdp", [False, True], ids=["ddp", "fsdp"])
def test_the_chosen_loops_parallel_file_becomes_parallel_py_and_fsdps_tests_stay_only_with_it(loop, fsdp):
    answers = {**MOVE_ANSWERS, "training_loop": loop, "include_fsdp": fsdp}
    renames, deletions = post_gen.chosen_file_moves(answers)
    other = "native" if loop == "trainer" else "trainer"
    kind, other_kind = ("fsdp", "ddp") if fsdp else ("ddp", "fsdp")
    assert renames[f"src/pkg/parallel_{loop}_{kind}.py"] == "src/pkg/parallel.py"
    assert {f"src/pkg/parallel_{loop}_{other_kind}.py", f"src/pkg/parallel_{other}_ddp.py",
            f"src/pkg/parallel_{other}_fsdp.py"} <= set(deletions)
    parallel_files = {path for path in [*renames, *deletions] if path.startswith("src/pkg/parallel")}
    assert len(parallel_files) == 4
    # FSDP's own tests: the loop's version with FSDP, none of the two without.
    if fsdp:
        assert renames[f"tests/test_parallel_{loop}.py"] == "tests/test_parallel.py"
        assert f"tests/test_parallel_{other}.py" in deletions
    else:
        assert not [path for path in renames if path.startswith("tests/test_parallel")]
        assert {f"tests/test_parallel_{loop}.py", f"tests/test_parallel_{other}.py"} <= set(deletions)
    assert "tests/test_parallel.py" not in deletions  # never shipped under its plain name
    assert len(deletions) == len(set(deletions))


def test_a_versioned_file_kept_only_for_an_answer_is_dropped_in_every_version(monkeypatch):
    monkeypatch.setattr(post_gen, "KEPT_ONLY_WHEN", {("include_fsdp", True): ("src/{package}/parallel.py",),
                                                     ("include_slurm", True): ("src/{package}/parallel.py",)})
    answers = {**MOVE_ANSWERS, "include_fsdp": False, "include_slurm": False}
    renames, deletions = post_gen.chosen_file_moves(answers)
    assert not [path for path in renames if path.startswith("src/pkg/parallel")]
    assert sorted(path for path in deletions if path.startswith("src/pkg/parallel")) == [
        f"src/pkg/parallel_{loop}_{kind}.py" for loop in ("native", "trainer") for kind in ("ddp", "fsdp")
    ]


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("/home/me/hf-ddp-template", None),
        ("./hf-ddp-template", None),
        ("hf-ddp-template", None),
        ("~/templates/hf-ddp-template.zip", None),
        ("file:///home/me/hf-ddp-template", None),
        (None, None),
        ("gh:org/hf-ddp-template", "gh:org/hf-ddp-template"),
        (
            "git@github.com:org/hf-ddp-template.git",
            "git@github.com:org/hf-ddp-template.git",
        ),
        (
            "https://github.com/org/hf-ddp-template.git",
            "https://github.com/org/hf-ddp-template.git",
        ),
        ("https://user:token@github.com/org/t", "https://github.com/org/t"),
        ("https://github.com/org/t.zip?token=abc", "https://github.com/org/t.zip"),
        ("ssh://git@example.com:2222/org/t", "ssh://git@example.com:2222/org/t"),
    ],
    ids=case_id,
)
def test_recorded_template_is_a_remote_address_without_credentials(template, expected):
    assert post_gen.remote_template(template) == expected


def test_replay_context_drops_cookiecutter_keys():
    answers = {
        "project_name": "X",
        "_output_dir": "/home/me/out",
        "_repo_dir": "/home/me/tpl",
        "_checkout": "main",
        "_template": "/home/me/tpl",
        "_extensions": ["cookiecutter.extensions.SlugifyExtension"],
        "_jinja2_env_vars": {"line_statement_prefix": "#%"},
    }
    assert post_gen.replay_context(answers) == {"cookiecutter": {"project_name": "X"}}
    remote = {**answers, "_template": "gh:org/t"}
    assert post_gen.replay_context(remote) == {
        "cookiecutter": {"project_name": "X", "_template": "gh:org/t"}
    }


def test_unrendered_scan_finds_template_text_but_not_answers(tmp_path):
    name = "It's {{ cookiecutter.project_slug }} <b>"
    files = {
        "flagged_expression.md": "# {{ cookiecutter.project_name }}\n",
        "flagged_tight.py": "x = '{{cookiecutter.package_name}}'\n",
        "flagged_block.sh": "{% if cookiecutter.include_slurm %}\n",
        "flagged_line_statement.py": "x = 1\n    #% if cookiecutter.include_lora\n",
        "ok_percent_comment.py": "x = 1  #% of the rows, cookiecutter.json\n",
        "ok_actions.yml": "python: ${{ matrix.python }}\n",
        "ok_answer.md": f"# {name}\n",
        "ok_answer_tojson.toml": "description = "
        + StrictEnvironment().from_string("{{ x | tojson }}").render(x=name)
        + "\n",
    }
    for file_name, text in files.items():
        (tmp_path / file_name).write_text(text, encoding="utf-8")
    (tmp_path / "binary.bin").write_bytes(b"\xff\xfe{{ cookiecutter.x }}")
    found = post_gen.find_unrendered(tmp_path, {"project_name": name})
    assert found == ["flagged_block.sh", "flagged_expression.md", "flagged_line_statement.py", "flagged_tight.py"]


def copy_template(destination: Path) -> Path:
    """Copy the template (without its own tests and caches) to break it on purpose."""

    def ignore(directory: str, names: list[str]) -> set[str]:
        skipped = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache"}
        if Path(directory) == TEMPLATE_DIR:
            skipped.add("tests")
        return skipped & set(names)

    return Path(shutil.copytree(TEMPLATE_DIR, destination, ignore=ignore))


def test_post_gen_refuses_a_template_missing_a_chosen_file(render, tmp_path, capfd):
    template = copy_template(tmp_path / "template")
    (template / PACKAGE_TEMPLATE.relative_to(TEMPLATE_DIR) / "train_native.py").unlink()
    with pytest.raises(FailedHookException):
        render(tmp_path / "out", template=template)
    lines = error_lines(capfd.readouterr().err)
    assert len(lines) == 1
    assert lines[0].startswith(
        "ERROR: template: missing src/text_classifier/train_native.py;"
    )
    assert list((tmp_path / "out").iterdir()) == []


def test_post_gen_refuses_unrendered_template_text(render, tmp_path, capfd):
    template = copy_template(tmp_path / "template")
    leftover = template / PROJECT_TEMPLATE.name / "NOTES.md"
    leftover.write_text(
        "{% raw %}{{ cookiecutter.project_name }}{% endraw %}\n", encoding="utf-8"
    )
    with pytest.raises(FailedHookException):
        render(tmp_path / "out", template=template)
    lines = error_lines(capfd.readouterr().err)
    assert lines == [
        (
            "ERROR: template: unrendered Jinja in NOTES.md; wrap literal Jinja in a raw"
            " block or list the file in _copy_without_render"
        )
    ]
    assert list((tmp_path / "out").iterdir()) == []


def test_hook_files_are_importable_without_rendering():
    assert pre_gen.ANSWERS_JSON == ANSWERS_LITERAL
    assert post_gen.ANSWERS_JSON == ANSWERS_LITERAL


# --- Keeping the chosen files and lines, called directly ---------------------------------

# Every yes/no answer at its default, then these.
MOVE_ANSWERS = {**{name: value for name, value in cookiecutter_json().items() if isinstance(value, bool)},
                "package_name": "pkg", "training_loop": "native", "include_slurm": True,
                "include_kubernetes": True, "experiment_tracker": "none"}


@pytest.mark.parametrize("loop", ["trainer", "native"])
def test_a_per_loop_file_kept_only_with_a_tracker_goes_for_both_loops_without_one(loop):
    other = "native" if loop == "trainer" else "trainer"
    renames, deletions = post_gen.chosen_file_moves({**MOVE_ANSWERS, "training_loop": loop})
    assert "src/pkg/trackers.py" not in renames.values()
    assert {f"src/pkg/trackers_{loop}.py", f"src/pkg/trackers_{other}.py", "src/pkg/tracking.py",
            "tests/test_tracking.py"} <= set(deletions)
    assert "src/pkg/trackers.py" not in deletions  # the template holds its loops' files only
    assert renames[f"src/pkg/train_{loop}.py"] == "src/pkg/train.py"


@pytest.mark.parametrize("tracker", ["tensorboard", "wandb", "mlflow"])
def test_any_tracker_but_none_keeps_the_trackers_files(tracker):
    renames, deletions = post_gen.chosen_file_moves({**MOVE_ANSWERS, "experiment_tracker": tracker})
    assert renames["src/pkg/trackers_native.py"] == "src/pkg/trackers.py"
    assert "src/pkg/trackers_trainer.py" in deletions
    assert not {"src/pkg/tracking.py", "tests/test_tracking.py", "src/pkg/trackers.py"} & set(deletions)


def test_a_condition_is_a_value_or_a_predicate():
    assert post_gen.fits("native", "native") and not post_gen.fits("trainer", "native")
    assert post_gen.fits(True, True) and not post_gen.fits(False, True)
    not_none = post_gen.other_than("none")
    assert [post_gen.fits(answer, not_none) for answer in ["none", "wandb", "mlflow"]] == [False, True, True]
