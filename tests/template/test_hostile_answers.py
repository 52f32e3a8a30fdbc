"""Hostile free text renders as inert data; text that would break a line is refused.

project_name and description are the only free-text answers. Each hostile string is
rendered twice: from a replay file, which hands it to the templates verbatim as a typed
answer would, and, when it holds no Jinja, as ``key=value`` extra context (cookiecutter
renders extra context as Jinja before the hooks run, so Jinja-looking text cannot
arrive verbatim that way).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from conftest import error_lines
from cookiecutter.exceptions import FailedHookException

SLUG = "hostile-project"
PACKAGE = "hostile_project"

# MARKER becomes a path that must never be created.
HOSTILE_TEXT = {
    "double-quotes": 'Say "hello" to "DDP"',
    "single-quotes": "It's Bob's model",
    "triple-quotes": "''' and \"\"\" inside",
    "backslashes": "C:\\new\\table, \\n and \\u0041",
    "trailing-backslash": "ends with a backslash \\",
    "command-substitution": "$(touch MARKER)",
    "backticks": "`touch MARKER`",
    "shell-chain": "x; touch MARKER && echo ok | cat > /dev/null",
    "shell-expansions": "${HOME} $PATH ${#array[@]} $((6*7)) ~root *",
    "python-injection": "'); import os; os.system('touch MARKER'); ('",
    "jinja-expression": "{{ 7*7 }}",
    "jinja-cookiecutter": "{{ cookiecutter.project_slug }}",
    "jinja-raw": "{% raw %}",
    "jinja-endraw-comment": "{% endraw %} {# not a comment",
    "jinja-code": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "html": "<script>alert('x')</script> & <b>co</b>",
    "yaml-syntax": "key: value - [a, b] {c: d} # no comment !tag *alias &anchor",
    "toml-syntax": 'name = "x" [tool] # comment',
    "markdown": "# Heading | table | *bold* [link](http://x)",
    "format-strings": "100% %s %(x)s {0} {name}",
    "unicode": "Ünïcødé 日本語 Ελληνικά",
    "emoji": "Fine-tune 👩‍💻 fast 🚀",
    "bidi-and-zero-width": "abc\u202edef\u200bghi",
    "leading-dash": "--help",
}

# Line breaks and control characters would split the README title: refused.
REFUSED_TEXT = {
    "newline": "two\nlines",
    "carriage-return": "a\rb",
    "tab": "a\tb",
    "escape-sequence": "\x1b[2J",
    "unicode-line-separator": "a\u2028b",
    "nul": "a\x00b",
}

def has_jinja(text: str) -> bool:
    return any(delimiter in text for delimiter in ("{{", "{%", "{#"))


def cases(marks: dict | None = None) -> list:
    """(route, name) for every hostile text and route it can take, with readable ids."""
    marks = marks or {}
    routes = [("replay", name) for name in HOSTILE_TEXT] + [
        ("command-line", name)
        for name, text in HOSTILE_TEXT.items()
        if not has_jinja(text)
    ]
    return [
        pytest.param((route, name), id=f"{route}-{name}", marks=marks.get(name, ()))
        for route, name in routes
    ]


@pytest.fixture(scope="session")
def marker_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("markers")


@pytest.fixture(scope="session")
def baseline(render, tmp_path_factory) -> Path:
    """The same project with the default name and description."""
    output_dir = tmp_path_factory.mktemp("baseline")
    return render(output_dir, {"project_slug": SLUG, "package_name": PACKAGE})


@pytest.fixture(scope="session")
def hostile_projects(
    render, tmp_path_factory, marker_dir
) -> dict[tuple[str, str], tuple]:
    """Render every case once per session: (route, name) -> (text, project folder)."""
    projects = {}
    for param in cases():
        route, name = param.values[0]
        text = HOSTILE_TEXT[name].replace("MARKER", str(marker_dir / f"PWNED_{name}"))
        answers = {
            "project_name": text,
            "description": text,
            "project_slug": SLUG,
            "package_name": PACKAGE,
        }
        output_dir = tmp_path_factory.mktemp(f"{route}-{name}")
        project = render(output_dir, answers, replay=route == "replay")
        projects[(route, name)] = (text, project)
    return projects


def test_nothing_in_the_answers_was_executed(hostile_projects, marker_dir):
    assert hostile_projects
    assert list(marker_dir.iterdir()) == []


@pytest.mark.parametrize("case", cases())
def test_pyproject_holds_the_description_exactly(hostile_projects, case):
    text, project = hostile_projects[case]
    pyproject = tomllib.loads((project / "pyproject.toml").read_text(encoding="utf-8"))
    assert pyproject["project"]["description"] == text
    assert pyproject["project"]["name"] == SLUG


@pytest.mark.parametrize("case", cases())
def test_readme_shows_the_project_name_literally(hostile_projects, case):
    text, project = hostile_projects[case]
    assert text in (project / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("case", cases())
def test_recorded_answers_hold_the_text_exactly(hostile_projects, case):
    text, project = hostile_projects[case]
    recorded = json.loads((project / ".cookiecutter.json").read_text(encoding="utf-8"))
    assert recorded["cookiecutter"]["project_name"] == text
    assert recorded["cookiecutter"]["description"] == text


@pytest.mark.parametrize("case", cases())
def test_python_files_compile(hostile_projects, case):
    _, project = hostile_projects[case]
    python_files = sorted(project.rglob("*.py"))
    assert python_files
    for path in python_files:
        compile(path.read_text(encoding="utf-8"), str(path), "exec")


@pytest.mark.parametrize("case", cases())
def test_yaml_files_parse(hostile_projects, case):
    _, project = hostile_projects[case]
    for path in [*project.rglob("*.yaml"), *project.rglob("*.yml")]:
        yaml.safe_load(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("case", cases())
def test_free_text_never_reaches_scripts_or_python(hostile_projects, baseline, case):
    _, project = hostile_projects[case]
    code_files = sorted(
        path.relative_to(baseline)
        for pattern in ("scripts/*", "**/*.py")
        for path in baseline.glob(pattern)
    )
    assert code_files
    for relative in code_files:
        assert (project / relative).read_bytes() == (
            baseline / relative
        ).read_bytes(), relative


def test_scripts_pass_bash_n_and_shellcheck(hostile_projects):
    # One file per distinct content: the renders' scripts are meant to be identical.
    scripts_by_content = {
        script.read_bytes(): script
        for _, project in hostile_projects.values()
        for script in sorted((project / "scripts").glob("*"))
        if script.is_file()
    }
    scripts = sorted(scripts_by_content.values())
    if not scripts:
        pytest.skip("the template has no scripts yet")
    for script in scripts:
        result = subprocess.run(
            ["bash", "-n", str(script)], capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, f"{script}: {result.stderr}"
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed")
    result = subprocess.run(
        [shellcheck, "--external-sources", *map(str, scripts)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("variable", ["project_name", "description"])
@pytest.mark.parametrize("route", ["replay", "command-line"])
@pytest.mark.parametrize("text", list(REFUSED_TEXT.values()), ids=list(REFUSED_TEXT))
def test_text_that_breaks_a_line_is_refused(
    render, tmp_path, capfd, variable, route, text
):
    answers = {variable: text, "project_slug": SLUG, "package_name": PACKAGE}
    with pytest.raises(FailedHookException):
        render(tmp_path, answers, replay=route == "replay")
    lines = error_lines(capfd.readouterr().err)
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"ERROR: {variable}: ")
    assert list(tmp_path.iterdir()) == []


def test_command_line_answers_are_jinja_to_cookiecutter(render, tmp_path):
    # Cookiecutter renders key=value answers like cookiecutter.json defaults, before
    # any hook; the project shows the result, not the expression.
    project = render(tmp_path, {"project_name": "Model {{ 6*7 }}"})
    assert project.name == "model-42"
    assert "Model 42" in (project / "README.md").read_text(encoding="utf-8")


def test_a_pair_column_answer_reaches_the_real_configs_and_the_readme(render, tmp_path):
    project = render(tmp_path, {"text_column": "premise", "text_pair_column": "hypothesis"})
    for name in ("default.yaml", "local_files.yaml"):
        config = yaml.safe_load((project / "configs" / name).read_text(encoding="utf-8"))
        assert (config["text_column"], config["text_pair_column"]) == ("premise", "hypothesis"), name
    readme = (project / "README.md").read_text(encoding="utf-8")
    assert "--text_column premise --text_pair_column hypothesis --label_column" in readme


def test_yaml_look_alike_answers_stay_strings_in_the_config(render, tmp_path):
    answers = {
        "model_name_or_path": "True",
        "dataset_name": "null",
        "text_column": "on",
        "label_column": "NO",
    }
    project = render(tmp_path, answers)
    config = yaml.safe_load(
        (project / "configs" / "default.yaml").read_text(encoding="utf-8")
    )
    assert {key: config[key] for key in answers} == answers
