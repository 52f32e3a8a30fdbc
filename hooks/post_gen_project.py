"""Finish the rendered project: keep the chosen files, set run bits, record the answers.

Cookiecutter renders this file with Jinja and runs it inside the new project folder.
The answers arrive as data: one JSON literal (``ANSWERS_JSON``), never pasted into code.

Steps, in order:

1. Keep the chosen files (``PER_LOOP_FILES``, ``PER_LOOP_AND_FSDP_FILES``,
   ``KEPT_ONLY_WHEN``): the chosen loop's ``<name>_<loop>.py`` becomes ``<name>.py`` and the
   other loop's is deleted; of the four ``parallel_<loop>_<ddp|fsdp>.py``, the one for the
   loop and include_fsdp becomes ``parallel.py``; and a file kept only for an answer
   (native-only modules, the sbatch script and its logs/ folder, the container and Kubernetes
   files, the tracker's modules, test and docs page, LoRA's modules and test, the doctor and its test,
   FSDP's tests) is deleted for any other, every version of it, with a folder it leaves
   empty. A file this step expects but cannot find is a template bug: refused. (Lines of
   shared files that only an answer needs are kept or dropped by Jinja, as ``#% if``
   line statements, before this hook runs.)
2. Make ``scripts/*.sh`` and ``scripts/*.sbatch`` executable.
3. Refuse the project if any text file still holds unrendered template text: a
   double-brace expression, a block tag or a line statement that names ``cookiecutter``. Answers may
   legitimately contain such text, so their rendered forms are masked first.
4. Write ``.cookiecutter.json``, ``{"cookiecutter": <answers>}``, which
   ``cookiecutter --replay-file .cookiecutter.json <template>`` accepts and which
   re-renders the same files. Cookiecutter's own keys (``_output_dir``, ``_repo_dir``,
   ``_checkout``, ``_extensions``...) are left out: the first three hold local
   paths, and the rest come back from the template's cookiecutter.json on replay.
   ``_template`` is kept only when it is a remote URL, without credentials.

A refusal prints one line, ``ERROR: template: <what is wrong>; <what to do>``, and
exits 1; cookiecutter then deletes the project folder if it created it.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import sys
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath

# tojson writes ' as \u0027, so no answer can close this literal.
ANSWERS_JSON = r'''{{ cookiecutter | tojson }}'''  # fmt: skip

REPLAY_FILE = ".cookiecutter.json"
TRAINING_LOOPS = ("trainer", "native")
EXECUTABLE_PATTERNS = ("scripts/*.sh", "scripts/*.sbatch")
# Written so that this file holds no Jinja delimiters besides ANSWERS_JSON. The last: a line statement
# (cookiecutter.json's _jinja2_env_vars) left behind as a comment line.
UNRENDERED_RE = re.compile(
    r"\{\{-?\s*cookiecutter\b|\{[%]-?[^%]*?\bcookiecutter\.|^[ \t]*#%.*\bcookiecutter\.", re.MULTILINE
)
# Cookiecutter's abbreviations for hosted templates (gh:org/repo, ...).
ABBREVIATION_RE = re.compile(r"(gh|gl|bb):[\w./-]+")
# scp-like git address: git@github.com:org/repo.git
SCP_ADDRESS_RE = re.compile(r"[\w.-]+@[\w.-]+:[\w./~-]+")
# Also behind a VCS prefix: git+https, hg+ssh, ...
REMOTE_SCHEMES = ("git", "ssh", "http", "https")


class TemplateBug(Exception):
    """The rendered files are not what this hook was written for."""


# The template ships <name>_<loop>.py for each loop; the project gets <name>.py.
PER_LOOP_FILES = (
    "src/{package}/train.py",
    "src/{package}/trackers.py",
    "src/{package}/training_args.py",
    "tests/ddp_probe.py",
    "tests/test_parallel.py",
    "tests/test_training_args.py",
)
# The template ships <name>_<loop>_<ddp|fsdp>.py for each loop and include_fsdp; the project gets <name>.py:
# parallel.py, how the loop spreads the model over the processes, with DDP alone or also FSDP.
PER_LOOP_AND_FSDP_FILES = ("src/{package}/parallel.py",)
# How the answers that choose a file's version read in its name.
FILE_CHOICES = {
    "training_loop": {loop: loop for loop in TRAINING_LOOPS},
    "include_fsdp": {False: "ddp", True: "fsdp"},
}


def other_than(value: object) -> Callable[[object], bool]:
    """A condition of KEPT_ONLY_WHEN that holds for every answer but ``value``."""
    return lambda answer: answer != value


def fits(answer: object, condition: object) -> bool:
    """Whether an answer meets a condition: a predicate, or the one value it must equal."""
    return condition(answer) if callable(condition) else answer == condition


TRACKER_CHOSEN = ("experiment_tracker", other_than("none"))
# Files kept only when an answer meets this condition (its value, or a predicate), deleted otherwise. A file
# of PER_LOOP_FILES or PER_LOOP_AND_FSDP_FILES is named here by its project path: every version of it goes
# when the condition fails.
KEPT_ONLY_WHEN = {
    ("training_loop", "native"): (
        "src/{package}/batching.py",
        "src/{package}/checkpoint.py",
        "tests/test_batching.py",
        "tests/test_native_loop.py",
    ),
    ("include_slurm", True): (
        "scripts/train_slurm.sbatch",
        "logs/.gitkeep",
    ),
    ("include_kubernetes", True): ("Dockerfile", ".dockerignore", "k8s/trainjob.yaml"),
    TRACKER_CHOSEN: (
        "src/{package}/tracking.py",
        "src/{package}/trackers.py",
        "tests/test_tracking.py",
        "docs/experiment-tracking.md",
    ),
    ("include_lora", True): (
        "src/{package}/lora.py",
        "src/{package}/merge_lora.py",
        "tests/test_lora.py",
    ),
    ("include_doctor", True): ("src/{package}/doctor.py", "tests/test_doctor.py"),
    ("include_fsdp", True): ("tests/test_parallel.py",),  # FSDP's tests (DDP is every other test's)
}


def versions(path: PurePosixPath, variables: tuple[str, ...]) -> dict[str, tuple[object, ...]]:
    """{the template's name of each version of path: the answers (to variables) that choose it}."""
    choices = itertools.product(*(FILE_CHOICES[variable].items() for variable in variables))
    return {
        path.with_stem("_".join([path.stem, *(name for _, name in choice)])).as_posix(): tuple(
            value for value, _ in choice
        )
        for choice in choices
    }


def chosen_file_moves(answers: Mapping[str, object]) -> tuple[dict[str, str], list[str]]:
    """Return ({source: destination} renames, [deletions]) as project-relative paths."""
    package = answers["package_name"]
    unwanted = [
        pattern.format(package=package)
        for (variable, condition), patterns in KEPT_ONLY_WHEN.items()
        if not fits(answers[variable], condition)
        for pattern in patterns
    ]
    chosen_by = {
        **dict.fromkeys(PER_LOOP_FILES, ("training_loop",)),
        **dict.fromkeys(PER_LOOP_AND_FSDP_FILES, ("training_loop", "include_fsdp")),
    }
    renames, deletions = {}, []
    for pattern, variables in chosen_by.items():
        path = pattern.format(package=package)
        chosen = tuple(answers[variable] for variable in variables)
        for source, choice in versions(PurePosixPath(path), variables).items():
            if choice == chosen and path not in unwanted:
                renames[source] = path
            else:
                deletions.append(source)
    versioned = {pattern.format(package=package) for pattern in chosen_by}
    deletions += [path for path in unwanted if path not in versioned]  # those went as their versions, above
    return renames, list(dict.fromkeys(deletions))  # a file kept under two conditions is deleted once


def keep_chosen_files(project: Path, answers: Mapping[str, object]) -> None:
    renames, deletions = chosen_file_moves(answers)
    missing = [path for path in [*renames, *deletions] if not (project / path).is_file()]
    if missing:
        raise TemplateBug(
            f"missing {', '.join(missing)}; the template must ship every file that"
            " PER_LOOP_FILES, PER_LOOP_AND_FSDP_FILES and KEPT_ONLY_WHEN in hooks/post_gen_project.py name"
        )
    for source, destination in renames.items():
        os.replace(project / source, project / destination)
    for path in deletions:
        (project / path).unlink()
        folder = (project / path).parent
        while folder != project and not any(folder.iterdir()):
            folder.rmdir()  # k8s/ without its manifest, logs/ without SLURM
            folder = folder.parent


# Tool caches that running ruff or pytest inside the template folder leaves behind.
CACHE_DIRS = ("__pycache__", ".ruff_cache", ".pytest_cache", ".mypy_cache")


def remove_tool_caches(project: Path) -> None:
    for name in CACHE_DIRS:
        for cache in sorted(project.rglob(name), reverse=True):
            if cache.is_dir():
                shutil.rmtree(cache)


def set_run_bits(project: Path) -> None:
    for pattern in EXECUTABLE_PATTERNS:
        for script in project.glob(pattern):
            if script.name.startswith("_"):
                continue  # sourced by the other scripts, never run
            mode = script.stat().st_mode
            script.chmod(mode | (mode & 0o444) >> 2)  # x wherever r is set


def rendered_forms(value: str) -> set[str]:
    """The ways the templates may write an answer: as is, or through tojson."""
    escaped = json.dumps(value)[1:-1]
    html_safe = escaped
    for char, code in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("'", "\\u0027"),
    ):
        html_safe = html_safe.replace(char, code)
    return {value, escaped, html_safe, json.dumps(value, ensure_ascii=False)[1:-1]}


def find_unrendered(project: Path, answers: Mapping[str, object]) -> list[str]:
    """Project-relative paths of text files that still hold template syntax."""
    masks = set()
    for value in answers.values():
        if isinstance(value, str) and UNRENDERED_RE.search(value):
            masks |= rendered_forms(value)
    ordered_masks = sorted(masks, key=len, reverse=True)
    found = []
    for path in sorted(project.rglob("*")):
        if not path.is_file() or path.is_symlink():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files are copied, not rendered
        for mask in ordered_masks:
            text = text.replace(mask, "")
        if UNRENDERED_RE.search(text):
            found.append(path.relative_to(project).as_posix())
    return found


def remote_template(template: object) -> str | None:
    """The template address without credentials, or None for a local path."""
    if not isinstance(template, str):
        return None
    if ABBREVIATION_RE.fullmatch(template) or SCP_ADDRESS_RE.fullmatch(template):
        return template
    try:
        parts = urllib.parse.urlsplit(template)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme.rpartition("+")[2] not in REMOTE_SCHEMES or not parts.hostname:
        return None
    user = f"{parts.username}@" if parts.username and not parts.password else ""
    host = parts.hostname + (f":{port}" if port else "")
    return urllib.parse.urlunsplit((parts.scheme, user + host, parts.path, "", ""))


def replay_context(answers: Mapping[str, object]) -> dict[str, dict[str, object]]:
    """What --replay-file needs: the answers, and the template URL if it is remote."""
    recorded = {key: value for key, value in answers.items() if not key.startswith("_")}
    template = remote_template(answers.get("_template"))
    if template is not None:
        recorded["_template"] = template
    return {"cookiecutter": recorded}


def write_replay_file(project: Path, answers: Mapping[str, object]) -> None:
    text = json.dumps(
        replay_context(answers), indent=2, sort_keys=True, ensure_ascii=False
    )
    (project / REPLAY_FILE).write_text(text + "\n", encoding="utf-8")


def load_answers() -> dict[str, object]:
    return json.loads(ANSWERS_JSON)


def finish_project(project: Path, answers: Mapping[str, object]) -> None:
    remove_tool_caches(project)
    keep_chosen_files(project, answers)
    set_run_bits(project)
    unrendered = find_unrendered(project, answers)
    if unrendered:
        raise TemplateBug(
            f"unrendered Jinja in {', '.join(unrendered[:3])}"
            + (f" and {len(unrendered) - 3} more" if len(unrendered) > 3 else "")
            + "; wrap literal Jinja in a raw block or list the file in"
            " _copy_without_render"
        )
    write_replay_file(project, answers)


def main() -> int:
    try:
        finish_project(Path.cwd(), load_answers())
    except TemplateBug as bug:
        print(f"ERROR: template: {bug}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
