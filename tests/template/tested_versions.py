"""The versions a render installs: {{cookiecutter.project_slug}}/constraints.txt, read off this environment.

A render's `make install` installs with its constraints.txt: the exact version of every package its
dependencies pull in, as the template's tests ran them. This module works that list out from the installed
packages' metadata, for the dependencies a render declares (its pyproject.toml, the dev extra included),
and writes the template's file: packages that only some answers need (a loop, a yes/no feature, a tracker)
sit in a Jinja block of that condition, so a render pins only what its answers install.

    python tests/template/tested_versions.py          # print what the file should hold
    python tests/template/tested_versions.py --write  # write it (`make lock` does, after a fresh install)

tests/template/test_versions.py fails when the file and this environment disagree.
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import sys
import tempfile
import tomllib
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

from cookiecutter.main import cookiecutter
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

TEMPLATE_DIR = Path(__file__).resolve().parents[2]
CONSTRAINTS = TEMPLATE_DIR / "{{cookiecutter.project_slug}}" / "constraints.txt"
HEADER = """\
# The exact versions this project's tests passed with, on Python {python} (torch's CPU build there: pip
# takes the CUDA build of the same version on a GPU machine). `make install` installs with them;
# pyproject.toml keeps the ranges that an install as a library accepts. `make test-latest` runs the tests
# on the newest versions those ranges allow, and `make lock` writes this file from an environment.
"""


def declared_requirements(answers: dict[str, object]) -> list[str]:
    """What a render of these answers declares in its pyproject.toml: its dependencies and its dev extra."""
    with tempfile.TemporaryDirectory() as scratch:
        config = Path(scratch, "config.yaml")  # keeps cookiecutter's replay file out of $HOME
        config.write_text(f"replay_dir: {json.dumps(str(Path(scratch, 'replay')))}\n", encoding="utf-8")
        project = cookiecutter(str(TEMPLATE_DIR), no_input=True, extra_context=answers, output_dir=scratch,
                               config_file=str(config))
        project_table = tomllib.loads(Path(project, "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return project_table["dependencies"] + project_table.get("optional-dependencies", {}).get("dev", [])


def installed_closure(requirements: Iterable[str]) -> dict[str, str]:
    """{name: installed version} of requirements and of everything they need, here; the local label of a
    version (torch's +cpu) is dropped, so that the pin holds for every build of that release."""
    versions: dict[str, str] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    queue = [Requirement(text) for text in requirements]
    queue = [requirement for requirement in queue if requirement.marker is None or requirement.marker.evaluate()]
    while queue:
        requirement = queue.pop()
        name = canonicalize_name(requirement.name)
        if (name, frozenset(requirement.extras)) in seen:
            continue
        seen.add((name, frozenset(requirement.extras)))
        try:
            distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            sys.exit(f"error: {name} is not installed here, so its tested version is unknown: install the "
                     "template's requirements-dev.txt first (make lock does)")
        versions[name] = Version(distribution.version).public
        for text in distribution.requires or []:
            needed = Requirement(text)
            extras = {"", *requirement.extras}
            if needed.marker is None or any(needed.marker.evaluate({"extra": extra}) for extra in extras):
                queue.append(needed)
    return dict(sorted(versions.items()))


def feature_conditions() -> dict[str, dict[str, object]]:
    """{Jinja condition: the answers that turn it on} for each answer that can add dependencies: each yes/no
    answer, and each tracker but none."""
    config = json.loads((TEMPLATE_DIR / "cookiecutter.json").read_text(encoding="utf-8"))
    conditions = {f"cookiecutter.{name}": {name: True} for name, value in config.items() if isinstance(value, bool)}
    for tracker in config["experiment_tracker"][1:]:
        conditions[f'cookiecutter.experiment_tracker == "{tracker}"'] = {"experiment_tracker": tracker}
    return conditions


@functools.cache
def shipped_versions() -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """(what every render pins, {Jinja condition: what only renders that meet it pin}). A loop's least render
    has every yes/no answer off and no tracker; each condition adds what one answer brings to it."""
    config = json.loads((TEMPLATE_DIR / "cookiecutter.json").read_text(encoding="utf-8"))
    loops = config["training_loop"]
    least = {name: False for name, value in config.items() if isinstance(value, bool)} | {"experiment_tracker": "none"}
    versions: dict[str, str] = {}
    needs: dict[str, list[str]] = {}  # package: the terms of the condition under which a render pins it
    for loop in loops:
        base = installed_closure(declared_requirements({**least, "training_loop": loop}))
        versions |= base
        for name in base:
            needs.setdefault(name, []).append(f'cookiecutter.training_loop == "{loop}"')
        for condition, answers in feature_conditions().items():
            added = installed_closure(declared_requirements({**least, **answers, "training_loop": loop}))
            versions |= added
            for name in added.keys() - base.keys():
                needs.setdefault(name, []).append(f'(cookiecutter.training_loop == "{loop}" and {condition})')
    common: dict[str, str] = {}
    only_when: dict[str, dict[str, str]] = {}
    for name, terms in sorted(needs.items()):
        if all(f'cookiecutter.training_loop == "{loop}"' in terms for loop in loops):
            common[name] = versions[name]
            continue
        for condition in feature_conditions():  # in both loops: the condition alone
            if all(f'(cookiecutter.training_loop == "{loop}" and {condition})' in terms for loop in loops):
                terms = [term for term in terms if not term.endswith(f" and {condition})")] + [condition]
        only_when.setdefault(" or ".join(terms), {})[name] = versions[name]
    return common, only_when


def constraints_text() -> str:
    common, only_when = shipped_versions()
    python = ".".join(platform.python_version_tuple()[:2])
    lines = [HEADER.format(python=python).rstrip("\n")]
    lines += [f"{name}=={version}" for name, version in common.items()]
    for condition, versions in sorted(only_when.items()):
        lines.append(f"{{%- if {condition} %}}")
        lines += [f"{name}=={version}" for name, version in versions.items()]
        lines.append("{%- endif %}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {CONSTRAINTS.relative_to(TEMPLATE_DIR)}")
    text = constraints_text()
    if parser.parse_args().write:
        CONSTRAINTS.write_text(text, encoding="utf-8")
        print(f"wrote {CONSTRAINTS.relative_to(TEMPLATE_DIR)}: {text.count('==')} pins")
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
