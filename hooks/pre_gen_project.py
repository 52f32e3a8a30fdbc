"""Refuse answers that would render a broken project, before any file is written.

Cookiecutter renders this file with Jinja and runs it inside the new project folder.
The answers arrive as data, one JSON literal (``ANSWERS_JSON``), so tests import this
file and call the validators in ``VALIDATORS`` directly. Each returns None or
``"<what is wrong>; <what is accepted>"``. A refusal prints
``ERROR: <variable>: <message>`` for the first bad variable (cookiecutter.json order,
then combinations) and exits 1.

Cookiecutter 2.7 creates the project folder before this hook runs and, after a refusal,
deletes it only if it created it (with ``-f``, an existing folder is left as it was).
It creates the folder with ``mkdir(parents=True)`` and deletes only the last level, so a
slug holding ``/``, refused here, may leave an empty parent folder: accepted.
"""

from __future__ import annotations

import json
import keyword
import os
import re
import sys
import unicodedata
from collections.abc import Callable, Mapping
from functools import partial

# tojson writes ' as \u0027, so no answer can close this literal.
ANSWERS_JSON = r'''{{ cookiecutter | tojson }}'''  # fmt: skip

TRAINING_LOOPS = ("trainer", "native")
MIXED_PRECISIONS = ("auto", "bf16", "fp16", "no")
EXPERIMENT_TRACKERS = ("none", "tensorboard", "wandb", "mlflow")

# Modules the rendered project imports, directly or through its dependencies; a
# package of the same name under src/ would be imported in their place.
SHADOWED_MODULES = frozenset(
    "accelerate datasets huggingface_hub mlflow numpy pytest safetensors tensorboard test"
    " tests tokenizers torch transformers wandb yaml".split()
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

TEXT_ACCEPTED = "use one line of text"
SLUG_ACCEPTED = "use lowercase letters, digits and single '-', starting with a letter, e.g. text-classifier"
PACKAGE_ACCEPTED = "use another lowercase identifier, e.g. text_classifier"
HUB_ID_OR_PATH_ACCEPTED = "use a Hub id (org/name) or a local path (./models/x) of letters, digits and . _ - /"
COLUMN_ACCEPTED = "use letters, digits and '_', not starting with a digit (e.g. text)"
NPROC_ACCEPTED = f"use 'auto' (one process per visible GPU) or a whole number from 1 to {MAX_NPROC_PER_NODE}"
NNODES_ACCEPTED = "use a whole number of nodes, 1 or more"
PORT_ACCEPTED = f"use a whole number from {PORT_RANGE[0]} to {PORT_RANGE[1]} (e.g. 29500)"


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
        return f"{show(value)} is not text; {TEXT_ACCEPTED}"
    if required and not value.strip():
        return f"is empty; {TEXT_ACCEPTED}, e.g. 'Text Classifier'"
    # A line break would split the README title; control characters have no place
    # in a title; lone surrogates cannot be written as UTF-8.
    for char in value:
        if unicodedata.category(char) in REFUSED_TEXT_CATEGORIES:
            return f"contains {char!r}, a line break or control character; {TEXT_ACCEPTED}"
    return None


def check_word(value: object, rule: Callable[[str], str | None], accepted: str) -> str | None:
    """Refuse an answer that is not text, is empty, or breaks the rule (which names what is
    wrong), and say what is accepted."""
    if not isinstance(value, str):
        return f"{show(value)} is not text; {accepted}"
    wrong = rule(value) if value else "is empty"
    return None if wrong is None else f"{wrong}; {accepted}"


def slug_problem(slug: str) -> str | None:
    if SLUG_RE.fullmatch(slug):
        return None
    if "/" in slug or "\\" in slug:
        return f"{show(slug)} contains a path separator"
    if ".." in slug:
        return f"{show(slug)} contains '..'"
    if slug[0].isdigit():
        return f"{show(slug)} starts with a digit (set project_slug explicitly)"
    if slug.startswith("-") or slug.endswith("-") or "--" in slug:
        return f"{show(slug)} has a leading, trailing or doubled '-'"
    return f"{show(slug)} {describe_bad_character(slug, re.compile('[a-z0-9-]'))}"


def package_problem(name: str) -> str | None:
    if name[0].isdigit():
        return f"{show(name)} starts with a digit"
    if not PACKAGE_RE.fullmatch(name):
        return f"{show(name)} {describe_bad_character(name, re.compile('[a-z0-9_]'))}"
    if keyword.iskeyword(name):
        return f"{show(name)} is a Python keyword"
    if name in SHADOWED_MODULES or name in sys.stdlib_module_names:
        return f"{show(name)} would shadow an installed module"
    return None


def hub_id_or_path_problem(name: str) -> str | None:
    if not HUB_ID_OR_PATH_RE.fullmatch(name):
        return f"{show(name)} {describe_bad_character(name, HUB_ID_OR_PATH_RE)}"
    if name.startswith("-"):
        return f"{show(name)} starts with '-' and would read as a command-line option"
    if ".." in name.split("/"):
        return f"{show(name)} contains a '..' path component"
    return None


def column_problem(column: str) -> str | None:
    if COLUMN_RE.fullmatch(column):
        return None
    if column[0].isdigit():
        return f"{show(column)} starts with a digit"
    return f"{show(column)} {describe_bad_character(column, COLUMN_RE)}"


def check_whole_number(value: object, low: int, high: int | None, accepted: str) -> str | None:
    """Accept a number from low to high, given as an int or as text such as "42"."""
    number = value if isinstance(value, int) and not isinstance(value, bool) else None
    if isinstance(value, str) and WHOLE_NUMBER_RE.fullmatch(value):
        try:
            number = int(value)
        except ValueError:  # more digits than int() accepts
            pass
    if number is None:
        return f"{show(value)} is not a whole number without sign or leading zero; {accepted}"
    if number < low:
        return f"{number} is below {low}; {accepted}"
    if high is not None and number > high:
        return f"{number} is above {high}; {accepted}"
    return None


def check_nproc_per_node(value: object) -> str | None:
    if value == "auto":
        return None
    return check_whole_number(value, 1, MAX_NPROC_PER_NODE, NPROC_ACCEPTED)


def check_choice(value: object, choices: tuple[str, ...]) -> str | None:
    if value in choices:
        return None
    return f"{show(value)} is not a choice; use one of: {', '.join(choices)}"


def check_boolean(value: object) -> str | None:
    if isinstance(value, bool):
        return None
    # A string such as "no" would be truthy in the templates' if-blocks.
    return f"{show(value)} is not a boolean; use true or false (yes/no at the prompt)"


# In cookiecutter.json order: the first bad variable in this order is reported.
VALIDATORS: dict[str, Callable[[object], str | None]] = {
    "project_name": partial(check_free_text, required=True),
    "project_slug": partial(check_word, rule=slug_problem, accepted=SLUG_ACCEPTED),
    "package_name": partial(check_word, rule=package_problem, accepted=PACKAGE_ACCEPTED),
    "description": partial(check_free_text, required=False),
    "training_loop": partial(check_choice, choices=TRAINING_LOOPS),
    "model_name_or_path": partial(check_word, rule=hub_id_or_path_problem, accepted=HUB_ID_OR_PATH_ACCEPTED),
    "dataset_name": partial(check_word, rule=hub_id_or_path_problem, accepted=HUB_ID_OR_PATH_ACCEPTED),
    "text_column": partial(check_word, rule=column_problem, accepted=COLUMN_ACCEPTED),
    "text_pair_column": lambda value: None if value == "" else check_word(value, column_problem, COLUMN_ACCEPTED),
    "label_column": partial(check_word, rule=column_problem, accepted=COLUMN_ACCEPTED),
    "nproc_per_node": check_nproc_per_node,
    "nnodes": partial(check_whole_number, low=1, high=None, accepted=NNODES_ACCEPTED),
    "master_port": partial(
        check_whole_number, low=PORT_RANGE[0], high=PORT_RANGE[1], accepted=PORT_ACCEPTED
    ),
    "mixed_precision": partial(check_choice, choices=MIXED_PRECISIONS),
    "experiment_tracker": partial(check_choice, choices=EXPERIMENT_TRACKERS),
    "include_slurm": check_boolean,
    "include_kubernetes": check_boolean,
    "include_lora": check_boolean,
    "include_doctor": check_boolean,
    "include_fsdp": check_boolean,
}


def check_combinations(answers: Mapping[str, object]) -> tuple[str, str] | None:
    """Refuse answers that are each valid but cannot work together: columns that repeat each
    other, which would feed the model its own labels or one text twice. Precision is settled at
    run time, and every launcher works with any number of processes and nodes."""
    pair = answers["text_pair_column"]
    if pair in (answers["text_column"], answers["label_column"]):
        return "text_pair_column", f"{show(pair)} is already the text or label column; name the second text's column"
    if answers["text_column"] != answers["label_column"]:
        return None
    same = f"is the same column as text_column ({show(answers['text_column'])})"
    return "label_column", f"{same}; use the column that holds the class labels"


def find_first_problem(answers: Mapping[str, object]) -> tuple[str, str] | None:
    """Return (variable, message) for the first bad answer, or None."""
    for variable, check in VALIDATORS.items():
        if variable not in answers:
            return variable, "is missing; the template's cookiecutter.json must define it"
        message = check(answers[variable])
        if message is not None:
            return variable, message
    return check_combinations(answers)


def main() -> int:
    problem = find_first_problem(json.loads(ANSWERS_JSON))
    if problem is None:
        return 0
    variable, message = problem
    line = f"ERROR: {variable}: {message}"
    if sys.stderr.isatty() and "NO_COLOR" not in os.environ:
        line = f"\x1b[1;31m{line}\x1b[0m"  # bold red: cookiecutter's traceback follows it
    print(line, file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
