"""The versions a render installs are the versions its tests passed with, and its declared floors hold.

- constraints.txt, the exact versions each render ships, is what this environment runs the renders' tests on
  (tests/template/tested_versions.py reads it off the installed packages; `make lock` rewrites it);
- a fresh render's `make install` installs exactly those versions (a real install, from the package index);
- both loops' `make test` pass on the floors the rendered pyproject.toml declares (FLOOR_PACKAGES at the lowest
  release their ranges allow, the rest as pip resolves them).

The last two install from the package index and run for minutes: marked ``rendered_suite``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import tested_versions
from conftest import cookiecutter_json
from packaging.requirements import Requirement
from packaging.version import Version
from test_render import make_env, run_make

TRACKERS = cookiecutter_json()["experiment_tracker"][1:]
# The libraries whose floors the floors run installs where a render declares them, each at the lowest release
# its range allows. torch stays at the shipped version: the package index serves older releases only as
# multi-GB CUDA builds.
FLOOR_PACKAGES = ("transformers", "datasets", "accelerate", "peft", "tokenizers")
INSTALL_TIMEOUT = 1200


def pins(text: str) -> dict[str, str]:
    return dict(line.split("==", 1) for line in text.splitlines() if "==" in line and not line.startswith(("#", "{%")))


def test_constraints_txt_holds_the_versions_the_tests_run_on():
    shipped = tested_versions.CONSTRAINTS.read_text(encoding="utf-8")
    assert shipped == tested_versions.constraints_text(), (
        "constraints.txt is not what this environment holds: `make lock` moves it to the newest versions the "
        "ranges allow, or reinstall .venv (rm -rf .venv && make test-fast) to test the shipped ones")


def test_each_package_is_pinned_once_so_the_templates_venv_takes_every_block_at_once():
    # The Makefile installs the template's .venv with every line of constraints.txt but the Jinja ones.
    text = tested_versions.CONSTRAINTS.read_text(encoding="utf-8")
    names = [line.split("==")[0] for line in text.splitlines() if "==" in line and not line.startswith(("#", "{%"))]
    assert len(names) == len(set(names))


ANSWER_SETS = {
    "default": {},
    **{tracker: {"experiment_tracker": tracker, "training_loop": "native"} for tracker in TRACKERS},
    **{f"every-feature-{loop}": {**{name: True for name, value in cookiecutter_json().items()
                                    if isinstance(value, bool)}, "training_loop": loop}
       for loop in cookiecutter_json()["training_loop"]},
}


@pytest.mark.parametrize("answers", ANSWER_SETS.values(), ids=ANSWER_SETS.keys())
def test_a_render_pins_exactly_what_its_own_dependencies_pull_in(render, tmp_path, answers):
    project = render(tmp_path, answers)
    pinned = pins((project / "constraints.txt").read_text(encoding="utf-8"))
    assert pinned == tested_versions.installed_closure(tested_versions.declared_requirements(answers))
    assert {"torch", "transformers", "datasets", "tokenizers"} <= set(pinned)
    for tracker in TRACKERS:
        assert (tracker.replace("mlflow", "mlflow-skinny") in pinned) == (answers.get("experiment_tracker") == tracker)


def installed_versions(python: Path) -> dict[str, str]:
    listed = subprocess.run([str(python), "-m", "pip", "list", "--format", "json", "--exclude-editable"],
                            capture_output=True, text=True, check=True).stdout
    return {package["name"].lower().replace("_", "-"): Version(package["version"]).public
            for package in json.loads(listed)}


@pytest.mark.rendered_suite
def test_make_install_installs_exactly_the_shipped_versions(render, tmp_path):
    project = render(tmp_path, {})
    done = subprocess.run(["make", "install"], cwd=project, env=make_env(), capture_output=True, text=True,
                          timeout=INSTALL_TIMEOUT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    python = project / ".venv" / "bin" / "python"
    check = subprocess.run([str(python), "-m", "pip", "check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout  # torch comes alone from its index, what it needs after it
    installed = installed_versions(python)
    installed.pop("pip")
    shipped = pins((project / "constraints.txt").read_text(encoding="utf-8"))
    assert {name: version for name, version in installed.items() if shipped.get(name) != version} == {}
    assert {"torch", "transformers", "datasets", "tokenizers", "pytest", "ruff"} <= set(installed)


def lowest_allowed(requirement: Requirement, python: Path) -> str:
    """The lowest release on the package index that the requirement's range admits."""
    listed = subprocess.run([str(python), "-m", "pip", "index", "versions", requirement.name],
                            capture_output=True, text=True, timeout=120)
    found = re.search(r"^Available versions: (.+)$", listed.stdout, re.MULTILINE)
    assert found, f"pip index versions {requirement.name}: {listed.stdout}{listed.stderr}"
    return str(min(requirement.specifier.filter(Version(text) for text in found.group(1).split(", "))))


@pytest.mark.rendered_suite
def test_both_loops_pass_their_make_test_on_the_declared_floors(render, tmp_path):
    features = {name: True for name, value in cookiecutter_json().items() if isinstance(value, bool)}
    projects = [render(tmp_path / loop, {**features, "training_loop": loop, "project_name": f"Floors {loop}"})
                for loop in cookiecutter_json()["training_loop"]]
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    floors = {}
    for project in projects:
        for text in tomllib.loads((project / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]:
            requirement = Requirement(text)
            if requirement.name in FLOOR_PACKAGES:
                floors[requirement.name] = lowest_allowed(requirement, python)
    assert {"transformers", "datasets"} <= set(floors)  # a FLOOR_PACKAGES entry no render declares is pip's
    constraints = tmp_path / "floors.txt"
    torch = pins(tested_versions.CONSTRAINTS.read_text(encoding="utf-8"))["torch"]
    constraints.write_text("".join(f"{name}=={version}\n" for name, version in {**floors, "torch": torch}.items()))
    install = [str(python), "-m", "pip", "install", "--quiet", "--constraint", str(constraints), f"torch=={torch}"]
    for project in projects:
        install += ["-e", f"{project}[dev]"]
    done = subprocess.run(install, capture_output=True, text=True, timeout=INSTALL_TIMEOUT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    installed = installed_versions(python)
    assert {name: installed[name] for name in floors} == floors
    for project in projects:
        run_make(project, "test", ["-q", "-p", "no:cacheprovider"], timeout=900, python=python)
