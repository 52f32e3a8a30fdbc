"""Shared helpers and fixtures: where the template is, its hooks, its answers, a real render."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
from cookiecutter.generate import generate_context
from cookiecutter.main import cookiecutter
from cookiecutter.prompt import prompt_for_config

TEMPLATE_DIR = Path(__file__).resolve().parent.parent
HOOKS_DIR = TEMPLATE_DIR / "hooks"
PROJECT_TEMPLATE = TEMPLATE_DIR / "{{cookiecutter.project_slug}}"
PACKAGE_TEMPLATE = PROJECT_TEMPLATE / "src" / "{{cookiecutter.package_name}}"

Render = Callable[..., Path]
# Proofs the template runs inside a render's tests/ (template/test_render.py), never collected here.
collect_ignore = ["proofs"]


def load_hook(name: str, path: Path | None = None) -> ModuleType:
    """Import a hook file as a plain module; its Jinja literal stays unrendered."""
    spec = importlib.util.spec_from_file_location(name, path or HOOKS_DIR / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pre_gen = load_hook("pre_gen_project")
post_gen = load_hook("post_gen_project")


def cookiecutter_json() -> dict:
    return json.loads((TEMPLATE_DIR / "cookiecutter.json").read_text(encoding="utf-8"))


def relative_files(root: Path) -> set[str]:
    """Every file under root, as a POSIX path relative to root."""
    return {path.relative_to(root).as_posix() for path in root.rglob("*") if path.is_file()}


def docs_text(project: Path) -> str:
    """What a render's user reads: its README.md and docs/*.md, one after the other."""
    pages = [project / "README.md", *sorted((project / "docs").glob("*.md"))]
    return "\n".join(page.read_text(encoding="utf-8") for page in pages)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("ERROR:")]


@pytest.fixture(scope="session")
def default_answers() -> dict[str, object]:
    """The answers `cookiecutter --no-input` gives, without cookiecutter's own _keys."""
    context = generate_context(context_file=str(TEMPLATE_DIR / "cookiecutter.json"))
    answers = prompt_for_config(context, no_input=True)
    return {key: value for key, value in answers.items() if not key.startswith("_")}


@pytest.fixture(scope="session")
def cookiecutter_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user config that keeps cookiecutter's replay files out of $HOME."""
    user_dir = tmp_path_factory.mktemp("cookiecutter_user")
    config_file = user_dir / "config.yaml"
    config_file.write_text(
        f"cookiecutters_dir: {json.dumps(str(user_dir / 'cookiecutters'))}\n"
        f"replay_dir: {json.dumps(str(user_dir / 'replay'))}\n",
        encoding="utf-8",
    )
    return config_file


@pytest.fixture(scope="session")
def render(
    tmp_path_factory: pytest.TempPathFactory,
    cookiecutter_config: Path,
    default_answers: dict,
) -> Render:
    """Render the real template with cookiecutter's API; return the project folder.

    ``render(output_dir, answers)`` passes answers as extra context, like
    ``key=value`` on the command line (cookiecutter renders them as Jinja first).
    ``render(output_dir, answers, replay=True)`` passes them in a replay file on top
    of the defaults, verbatim, like answers typed at the prompts;
    ``render(output_dir, replay_file=path)`` uses an existing replay file.
    """

    def render_template(
        output_dir: Path,
        answers: dict[str, object] | None = None,
        *,
        replay: bool = False,
        replay_file: Path | None = None,
        template: Path = TEMPLATE_DIR,
        overwrite_if_exists: bool = False,
    ) -> Path:
        options: dict[str, object] = {"no_input": True, "extra_context": answers}
        if replay:
            replay_file = tmp_path_factory.mktemp("replay") / "answers.json"
            context = {"cookiecutter": {**default_answers, **(answers or {})}}
            replay_file.write_text(json.dumps(context), encoding="utf-8")
        if replay_file is not None:
            options = {"replay": str(replay_file)}
        project = cookiecutter(
            str(template),
            output_dir=str(output_dir),
            config_file=str(cookiecutter_config),
            overwrite_if_exists=overwrite_if_exists,
            **options,
        )
        return Path(project)

    return render_template


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "rendered_suite: runs a rendered project's own test suite (real torchrun,"
        " minutes); leave out with -m 'not rendered_suite'",
    )
    config.addinivalue_line(
        "markers",
        "launches: runs a render's launch scripts with real torchrun (minutes); each test class holds one"
        " render's runs, for pytest-xdist's --dist loadscope",
    )


SUITE_RENDERS = "test_rendered_repo_passes_its_own_test_suite_and_the_template_proofs"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`--dist loadgroup`: the suite renders (each starts a SLURM cluster, and one at a time fits on this
    host) one after the other on one worker, every other test on whichever worker is free. The group is
    named here because pytest-xdist 3.8's `xdist_group` mark groups nothing under pytest 9 (it renames items
    through `Item._nodeid`, which pytest 9 no longer reads); tests/template/test_ci.py holds the grouping."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SuiteRendersTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "suite renders" if f"::{SUITE_RENDERS}[" in nodeid else nodeid

    return SuiteRendersTogether(config, log)
