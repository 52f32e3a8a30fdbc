"""Refuse answers that would render a broken project, before any file is written.

Cookiecutter renders this file with Jinja and runs it inside the new project folder.
The answers arrive as data: one JSON literal (``ANSWERS_JSON``), never pasted into code.
Everything else is plain Python, so tests import this file and call the validators.

Each ``check_<variable>`` returns None or ``"<what is wrong>; <what is accepted>"``.
A refusal prints one line, ``ERROR: <variable>: <message>``, for the first bad
variable (in cookiecutter.json order, then combinations), and exits 1.

What cookiecutter 2.7 does around this hook:

- It creates the project folder *before* running the hook, and deletes it after a
  refusal only if it created it. With ``-f`` (overwrite_if_exists) and a folder that
  already exists, a refusal neither writes anything into the folder (files are
  rendered after this hook) nor deletes it.
- ``Path(output_dir, project_slug).mkdir(parents=True)`` follows whatever the slug
  says: ``a/b`` creates ``a/`` too, ``../x`` and ``/abs/x`` land outside the output
  folder. Cookiecutter deletes only the last folder and leaves new parents behind.
  After a refusal this hook therefore starts a short-lived background process that
  waits until cookiecutter has deleted the project folder and then removes those
  parents. It removes a parent only if the slug named it, it was born (filesystem
  creation time) within a second of the project folder, and it is empty. Where the
  OS cannot report creation times, the empty parents stay.
- An empty slug, ``.`` or ``..`` is the output folder or its parent, which exists:
  cookiecutter stops with "directory already exists" before this hook runs.
- A value for a choice variable that is not a choice, given on the command line, makes
  cookiecutter itself stop with a ValueError; ``check_choice`` catches the same in a
  replay file. ``yes``/``no`` given for include_slurm become booleans before this
  hook runs; a replay file can still carry a string, which is refused.
- Values given on the command line (extra context) are rendered as Jinja by
  cookiecutter before this hook sees them (a double-brace ``7*7`` arrives as ``49``);
  typed answers and replay files arrive verbatim.
"""

from __future__ import annotations

import json
import keyword
import os
import re
import struct
import subprocess
import sys
import time
import unicodedata
from collections.abc import Callable, Mapping
from pathlib import Path

# tojson writes ' as \u0027, so no answer can close this literal.
ANSWERS_JSON = r'''{{ cookiecutter | tojson }}'''  # fmt: skip

TRAINING_LOOPS = ("trainer", "native")
MIXED_PRECISIONS = ("auto", "bf16", "fp16", "no")

# Modules the rendered project imports, directly or through its dependencies; a
# package of the same name under src/ would be imported in their place.
SHADOWED_MODULES = frozenset(
    {
        "accelerate",
        "datasets",
        "huggingface_hub",
        "numpy",
        "pytest",
        "safetensors",
        "test",
        "tests",
        "tokenizers",
        "torch",
        "transformers",
        "yaml",
    }
)

SLUG_RE = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")
PACKAGE_RE = re.compile(r"[a-z_][a-z0-9_]*")
HUB_ID_OR_PATH_RE = re.compile(r"[A-Za-z0-9._/-]+")
COLUMN_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# No sign, no spaces, no leading zero: bash reads "08" as a bad octal number.
WHOLE_NUMBER_RE = re.compile(r"0|[1-9][0-9]*")

# Control characters (newline, tab, escape), surrogates, Unicode line/paragraph breaks.
REFUSED_TEXT_CATEGORIES = frozenset({"Cc", "Cs", "Zl", "Zp"})

MAX_NPROC_PER_NODE = 1024
PORT_RANGE = (1024, 65535)

SLUG_ACCEPTED = (
    "use lowercase letters, digits and single '-', starting with a letter,"
    " e.g. text-classifier"
)
PACKAGE_ACCEPTED = "use another lowercase identifier, e.g. text_classifier"
HUB_ID_OR_PATH_ACCEPTED = (
    "use a Hub id (org/name) or a local path (./models/x)"
    " of letters, digits and . _ - /"
)
COLUMN_ACCEPTED = "use letters, digits and '_', not starting with a digit (e.g. text)"


def show(value: object) -> str:
    """Quote a value for an error message: one line, at most 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def describe_bad_character(value: str, allowed: re.Pattern[str]) -> str:
    """Name the first character of value that the one-character pattern refuses."""
    for char in value:
        if char.isspace():
            return "contains whitespace"
        if not allowed.fullmatch(char):
            return f"contains {char!r}"
    return "is malformed"


def check_free_text(value: object, *, required: bool) -> str | None:
    if not isinstance(value, str):
        return f"{show(value)} is not text; use one line of text"
    if required and not value.strip():
        return "is empty; use one line of text, e.g. 'Text Classifier'"
    # A line break would split the README title; control characters have no place
    # in a title; lone surrogates cannot be written as UTF-8.
    for char in value:
        if unicodedata.category(char) in REFUSED_TEXT_CATEGORIES:
            return (
                f"contains {char!r}, a line break or control character;"
                " use one line of text"
            )
    return None


def check_project_name(value: object) -> str | None:
    return check_free_text(value, required=True)


def check_description(value: object) -> str | None:
    return check_free_text(value, required=False)


def check_project_slug(value: object) -> str | None:
    if not isinstance(value, str):
        return f"{show(value)} is not text; {SLUG_ACCEPTED}"
    if SLUG_RE.fullmatch(value):
        return None
    if not value:
        wrong = "is empty"
    elif "/" in value or "\\" in value:
        wrong = f"{show(value)} contains a path separator"
    elif ".." in value:
        wrong = f"{show(value)} contains '..'"
    elif value[0].isdigit():
        wrong = f"{show(value)} starts with a digit (set project_slug explicitly)"
    elif value.startswith("-") or value.endswith("-") or "--" in value:
        wrong = f"{show(value)} has a leading, trailing or doubled '-'"
    else:
        wrong = (
            f"{show(value)} {describe_bad_character(value, re.compile('[a-z0-9-]'))}"
        )
    return f"{wrong}; {SLUG_ACCEPTED}"


def check_package_name(value: object) -> str | None:
    if not isinstance(value, str):
        return f"{show(value)} is not text; {PACKAGE_ACCEPTED}"
    if not value:
        wrong = "is empty"
    elif value[0].isdigit():
        wrong = f"{show(value)} starts with a digit"
    elif not PACKAGE_RE.fullmatch(value):
        wrong = (
            f"{show(value)} {describe_bad_character(value, re.compile('[a-z0-9_]'))}"
        )
    elif keyword.iskeyword(value):
        wrong = f"{show(value)} is a Python keyword"
    elif value in SHADOWED_MODULES or value in sys.stdlib_module_names:
        wrong = f"{show(value)} would shadow an installed module"
    else:
        return None
    return f"{wrong}; {PACKAGE_ACCEPTED}"


def check_hub_id_or_path(value: object) -> str | None:
    if not isinstance(value, str):
        return f"{show(value)} is not text; {HUB_ID_OR_PATH_ACCEPTED}"
    if not value:
        wrong = "is empty"
    elif not HUB_ID_OR_PATH_RE.fullmatch(value):
        wrong = f"{show(value)} {describe_bad_character(value, HUB_ID_OR_PATH_RE)}"
    elif value.startswith("-"):
        wrong = f"{show(value)} starts with '-' and would read as a command-line option"
    elif ".." in value.split("/"):
        wrong = f"{show(value)} contains a '..' path component"
    else:
        return None
    return f"{wrong}; {HUB_ID_OR_PATH_ACCEPTED}"


def check_model_name_or_path(value: object) -> str | None:
    return check_hub_id_or_path(value)


def check_dataset_name(value: object) -> str | None:
    return check_hub_id_or_path(value)


def check_column(value: object) -> str | None:
    if not isinstance(value, str):
        return f"{show(value)} is not text; {COLUMN_ACCEPTED}"
    if not value:
        wrong = "is empty"
    elif COLUMN_RE.fullmatch(value):
        return None
    elif value[0].isdigit():
        wrong = f"{show(value)} starts with a digit"
    else:
        wrong = f"{show(value)} {describe_bad_character(value, COLUMN_RE)}"
    return f"{wrong}; {COLUMN_ACCEPTED}"


def check_text_column(value: object) -> str | None:
    return check_column(value)


def check_label_column(value: object) -> str | None:
    return check_column(value)


def parse_whole_number(value: object) -> int | None:
    """Return the number a "42" (or 42) answer holds, None for anything else."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and WHOLE_NUMBER_RE.fullmatch(value):
        try:
            return int(value)
        except ValueError:  # more digits than int() accepts
            return None
    return None


def check_whole_number(
    value: object, low: int, high: int | None, accepted: str
) -> str | None:
    number = parse_whole_number(value)
    if number is None:
        wrong = "is not a whole number without sign or leading zero"
        return f"{show(value)} {wrong}; {accepted}"
    if number < low:
        return f"{number} is below {low}; {accepted}"
    if high is not None and number > high:
        return f"{number} is above {high}; {accepted}"
    return None


def check_nproc_per_node(value: object) -> str | None:
    accepted = (
        f"use 'auto' (one process per visible GPU) or a whole number"
        f" from 1 to {MAX_NPROC_PER_NODE}"
    )
    if value == "auto":
        return None
    return check_whole_number(value, 1, MAX_NPROC_PER_NODE, accepted)


def check_nnodes(value: object) -> str | None:
    return check_whole_number(value, 1, None, "use a whole number of nodes, 1 or more")


def check_master_port(value: object) -> str | None:
    low, high = PORT_RANGE
    return check_whole_number(
        value, low, high, f"use a whole number from {low} to {high} (e.g. 29500)"
    )


def check_choice(value: object, choices: tuple[str, ...]) -> str | None:
    if value in choices:
        return None
    return f"{show(value)} is not a choice; use one of: {', '.join(choices)}"


def check_training_loop(value: object) -> str | None:
    return check_choice(value, TRAINING_LOOPS)


def check_mixed_precision(value: object) -> str | None:
    return check_choice(value, MIXED_PRECISIONS)


def check_include_slurm(value: object) -> str | None:
    if isinstance(value, bool):
        return None
    # A string such as "no" would be truthy in the templates' if-blocks.
    return f"{show(value)} is not a boolean; use true or false (yes/no at the prompt)"


# In cookiecutter.json order: the first bad variable in this order is reported.
VALIDATORS: dict[str, Callable[[object], str | None]] = {
    "project_name": check_project_name,
    "project_slug": check_project_slug,
    "package_name": check_package_name,
    "description": check_description,
    "training_loop": check_training_loop,
    "model_name_or_path": check_model_name_or_path,
    "dataset_name": check_dataset_name,
    "text_column": check_text_column,
    "label_column": check_label_column,
    "nproc_per_node": check_nproc_per_node,
    "nnodes": check_nnodes,
    "master_port": check_master_port,
    "mixed_precision": check_mixed_precision,
    "include_slurm": check_include_slurm,
}


def check_combinations(answers: Mapping[str, object]) -> tuple[str, str] | None:
    """Refuse answers that are each valid but cannot work together.

    - text_column == label_column: the model would be fed its own labels.

    A project_name starting with a digit slugifies to a slug, and then a package
    name, starting with a digit; check_project_slug refuses that slug, so it needs
    no rule here. No other pair is impossible: fp16 and bf16 are settled at run
    time against the hardware, and every launcher works with 'auto' or a number of
    processes, with one node or many.
    """
    if answers["text_column"] == answers["label_column"]:
        return (
            "label_column",
            (
                f"is the same column as text_column ({show(answers['text_column'])});"
                " use the column that holds the class labels"
            ),
        )
    return None


def find_first_problem(answers: Mapping[str, object]) -> tuple[str, str] | None:
    """Return (variable, message) for the first bad answer, or None."""
    for variable, check in VALIDATORS.items():
        if variable not in answers:
            return (
                variable,
                "is missing; the template's cookiecutter.json must define it",
            )
        message = check(answers[variable])
        if message is not None:
            return variable, message
    return check_combinations(answers)


# --- Leaving nothing behind on refusal -------------------------------------------

CLEANUP_FLAG = "--remove-new-parents"
BIRTH_WINDOW_S = 1.0
CLEANUP_WAIT_S = 5.0


def birth_time(path: Path) -> float | None:
    """When path was created, or None where the OS or filesystem cannot say."""
    try:
        stat = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    if hasattr(stat, "st_birthtime"):  # macOS, BSD; Windows from Python 3.12
        return stat.st_birthtime
    if sys.platform.startswith("linux"):
        return linux_birth_time(path)
    return None


def linux_birth_time(path: Path) -> float | None:
    """Read stx_btime with statx(2); os.stat has no birth time on Linux before 3.15."""
    import ctypes
    from ctypes import c_char_p, c_int, c_uint

    statx = getattr(ctypes.CDLL(None, use_errno=True), "statx", None)
    if statx is None:
        return None
    statx.argtypes = [c_int, c_char_p, c_int, c_uint, c_char_p]
    at_fdcwd, at_symlink_nofollow, statx_btime = -100, 0x100, 0x800
    buffer = ctypes.create_string_buffer(256)  # sizeof(struct statx)
    path_bytes = os.fsencode(path)
    if statx(at_fdcwd, path_bytes, at_symlink_nofollow, statx_btime, buffer) != 0:
        return None
    (mask,) = struct.unpack_from("=I", buffer.raw, 0)
    if not mask & statx_btime:
        return None
    seconds, nanoseconds = struct.unpack_from("=qI", buffer.raw, 0x50)
    return seconds + nanoseconds / 1e9


def new_parents_named_by_slug(
    project_dir: Path, output_dir: Path, slug: str
) -> list[Path]:
    """Parents that cookiecutter created for this slug, deepest first.

    A parent counts when the slug names it (not the output folder or above) and it
    was born within BIRTH_WINDOW_S of the project folder: created by the same mkdir.
    """
    project_born = birth_time(project_dir)
    if project_born is None:
        return []
    slug_parts = Path(slug).parts
    named = {
        Path(os.path.normpath(Path(output_dir, *slug_parts[:depth])))
        for depth in range(1, len(slug_parts))
    }
    named -= {output_dir, project_dir, *output_dir.parents}
    new = []
    for folder in named:
        born = birth_time(folder)
        if born is not None and abs(project_born - born) <= BIRTH_WINDOW_S:
            new.append(folder)
    return sorted(new, key=lambda folder: len(folder.parts), reverse=True)


def schedule_removal_of_new_parents(answers: Mapping[str, object]) -> None:
    """Start a detached process that removes new empty parents once cookiecutter
    has deleted the project folder (it does so right after this hook exits)."""
    output_dir = answers.get("_output_dir")
    slug = answers.get("project_slug")
    if not isinstance(output_dir, str) or not isinstance(slug, str):
        return
    project_dir = Path.cwd()
    parents = new_parents_named_by_slug(project_dir, Path(output_dir), slug)
    if not parents:
        return
    command = [
        sys.executable,
        __file__,
        CLEANUP_FLAG,
        str(project_dir),
        *map(str, parents),
    ]
    try:
        subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            cwd=project_dir.anchor,  # not a folder it may have to remove
        )
    except OSError:
        pass


def remove_parents_once_project_is_gone(project_dir: Path, parents: list[Path]) -> None:
    deadline = time.monotonic() + CLEANUP_WAIT_S
    while project_dir.exists():
        if time.monotonic() > deadline:
            return  # cookiecutter kept the folder: it existed before, or was told to
        time.sleep(0.02)
    for folder in parents:
        try:
            folder.rmdir()  # only ever removes an empty folder
        except OSError:
            return


# --- Entry point -------------------------------------------------------------------


def load_answers() -> dict[str, object]:
    return json.loads(ANSWERS_JSON)


def main(argv: list[str]) -> int:
    if argv[:1] == [CLEANUP_FLAG]:
        remove_parents_once_project_is_gone(
            Path(argv[1]), [Path(arg) for arg in argv[2:]]
        )
        return 0
    answers = load_answers()
    problem = find_first_problem(answers)
    if problem is None:
        return 0
    variable, message = problem
    line = f"ERROR: {variable}: {message}"
    if sys.stderr.isatty() and "NO_COLOR" not in os.environ:
        line = f"\x1b[1;31m{line}\x1b[0m"  # bold red: cookiecutter's traceback follows it
    print(line, file=sys.stderr)
    schedule_removal_of_new_parents(answers)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
