"""What a user sees at the interactive prompts, driven through a real pseudo-terminal.

``python -m cookiecutter <template>`` runs under pexpect exactly as a user would start
it: colours on (TERM=xterm-256color), answers typed one line at a time. Assertions read
the screen with the colour codes stripped.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import sys
from pathlib import Path

import pexpect
import pytest
from conftest import TEMPLATE_DIR, cookiecutter_json, pre_gen

# Every prompt ends with its default in parentheses, then ": " (colour codes between).
PROMPT_END_RE = re.compile(r"\)(?:\x1b\[[0-9;]*m)*: ")
ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
TIMEOUT_S = 30


def variables() -> list[str]:
    return [key for key in cookiecutter_json() if not key.startswith("_")]


def run_prompts(
    output_dir: Path,
    config_file: Path,
    typed: dict[str, str],
    *,
    rows: int = 50,
    columns: int = 200,
) -> tuple[int, list[str]]:
    """Answer every prompt (Enter, or the typed text); return (exit status, screen)."""
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in {"COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR"}
    }
    env["TERM"] = "xterm-256color"
    screen = io.StringIO()
    child = pexpect.spawn(
        sys.executable,
        [
            "-m",
            "cookiecutter",
            "--config-file",
            str(config_file),
            str(TEMPLATE_DIR),
            "-o",
            str(output_dir),
        ],
        env=env,
        encoding="utf-8",
        dimensions=(rows, columns),
        timeout=TIMEOUT_S,
    )
    child.logfile_read = screen
    try:
        for variable in variables():
            child.expect(PROMPT_END_RE)
            child.sendline(typed.get(variable, ""))
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    text = ANSI_RE.sub("", screen.getvalue()).replace("\r\n", "\n").replace("\r", "")
    return child.exitstatus, [line.rstrip() for line in text.split("\n")]


def expected_prompt_lines(default_answers: dict) -> list[str]:
    """The prompt block as cookiecutter 2.7 prints it for cookiecutter.json."""
    config = cookiecutter_json()
    prompts = config["__prompts__"]
    names = variables()
    lines = []
    for number, variable in enumerate(names, start=1):
        head = f"  [{number}/{len(names)}]"
        default = default_answers[variable]
        if isinstance(config[variable], list):
            labels = prompts[variable]
            lines.append(f"{head} {labels['__prompt__']}")
            for index, choice in enumerate(config[variable], start=1):
                lines.append(f"    {index} - {labels[choice]}")
            indices = "/".join(str(i) for i in range(1, len(config[variable]) + 1))
            chosen = config[variable].index(default) + 1
            lines.append(f"    Choose from [{indices}] ({chosen}):")
        elif isinstance(default, bool):
            lines.append(
                f"{head} {prompts[variable]} [y/n] ({'y' if default else 'n'}):"
            )
        else:
            lines.append(f"{head} {prompts[variable]} ({default}):")
    return lines


def test_every_variable_has_a_readable_prompt():
    config = cookiecutter_json()
    prompts = config["__prompts__"]
    assert set(prompts) == set(variables())
    for variable in variables():
        if isinstance(config[variable], list):
            labels = prompts[variable]
            assert set(labels) == {"__prompt__", *config[variable]}, variable
            # Each label starts with the value it stands for, so answers map back.
            for choice in config[variable]:
                assert labels[choice].startswith(choice), (variable, choice)


def test_prompts_show_texts_labels_and_defaults_and_enter_renders_them(
    tmp_path, cookiecutter_config, default_answers
):
    status, screen = run_prompts(tmp_path, cookiecutter_config, typed={})

    assert status == 0, "\n".join(screen)
    prompt_lines = [line for line in screen if line.strip()]
    assert prompt_lines == expected_prompt_lines(default_answers)
    assert "    1 - trainer - Hugging Face Trainer (least code)" in screen

    project = tmp_path / "text-classifier"
    recorded = json.loads((project / ".cookiecutter.json").read_text(encoding="utf-8"))
    assert recorded == {"cookiecutter": default_answers}


@pytest.mark.parametrize(
    ("variable", "typed"),
    [("package_name", "torch"), ("master_port", "80")],
    ids=["package-name-torch", "master-port-80"],
)
def test_bad_typed_answer_shows_its_error_line_first_and_still_on_screen_at_exit(
    tmp_path, cookiecutter_config, variable, typed
):
    output_dir = tmp_path / "out"
    output_dir.mkdir()
    rows, columns = 24, 80  # a default terminal
    status, screen = run_prompts(
        output_dir,
        cookiecutter_config,
        typed={variable: typed},
        rows=rows,
        columns=columns,
    )

    assert status == 1
    error_line = f"ERROR: {variable}: {pre_gen.VALIDATORS[variable](typed)}"
    assert [line for line in screen if line.startswith(f"ERROR: {variable}:")] == [
        error_line
    ]
    # The line right after the last prompt; cookiecutter's own lines (a second,
    # generic ERROR line and its traceback) follow it.
    error_at = screen.index(error_line)
    last_prompt = f"[{len(variables())}/{len(variables())}]"
    assert error_at - 1 == max(
        i for i, line in enumerate(screen) if last_prompt in line
    )
    tail = screen[error_at:]
    while not tail[-1]:
        tail.pop()
    after = [line for line in tail[1:] if line]
    assert after[0] == (
        "ERROR: Stopping generation because pre_gen_project hook script didn't exit"
        " successfully"
    )
    assert after[1] == "Traceback (most recent call last):"
    assert after[-1] == "Hook script failed (exit status: 1)"
    # Terminal rows from the ERROR line to the end, plus the shell's next prompt:
    # the line must not have scrolled off when the user looks. (21 of 24 rows with
    # a venv at /tmp/venv; the traceback's site-packages paths set the margin.)
    used = sum(max(1, math.ceil(len(line) / columns)) for line in tail)
    assert used + 1 <= rows, f"the ERROR line scrolled off: {used} rows from it"
    assert list(output_dir.iterdir()) == []
