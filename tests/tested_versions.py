"""The versions a render installs: {{cookiecutter.project_slug}}/constraints.txt, read off this environment.

A render's `make install` installs with its constraints.txt: the exact version of every package its
dependencies pull in, as the template's tests ran them. This module works that list out from the installed
packages' metadata, for the dependencies a render declares (its pyproject.toml, the dev extra included),
and writes the template's file: packages that only one tracker needs sit in a Jinja block of their own, so a
render pins only what its answers can install.

    python tests/tested_versions.py          # print what the file should hold
    python tests/tested_versions.py --write  # write it (`make lock` does, after a fresh install)

tests/test_versions.py fails when the file and this environment disagree.
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

TEMPLATE_DIR = Path(__file__).resolve().parent.parent
CONSTRAINTS = TEMPLATE_DIR / "{{cookiecutter.project_slug}}" / "constraints.txt"
HEADER = """\
# The exact versions this project's tests passed with, on Python {python} (torch's CPU build there: pip
# takes the CUDA build of the same version on a GPU machine). `make install` installs with them;
# pyproject.toml keeps the ranges that an install as a library accepts. `make test-latest` runs the tests
# on the newest versions those ranges allow, and `make lock` writes this file from an environment.
"""


def answer_sets() -> list[dict[str, object]]:
    """One set of answers per loop and tracker, every yes/no feature on: every dependency a render can have."""
    answers = json.loads((TEMPLATE_DIR / "cookiecutter.json").read_text(encoding="utf-8"))
    features = {name: True for name, default in answers.items() if isinstance(default, bool)}
    return [{**features, "training_loop": loop, "experiment_tracker": tracker}
            for loop in answers["training_loop"] for tracker in answers["experiment_tracker"]]


def declared_requirements(answers: dict[str, object]) -> dict[str, list[str]]:
    """A render's pyproject.toml: {"": its dependencies, extra: that extra's} ."""
    with tempfile.TemporaryDirectory() as scratch:
        config = Path(scratch, "config.yaml")  # keeps cookiecutter's replay file out of $HOME
        config.write_text(f"replay_dir: {json.dumps(str(Path(scratch, 'replay')))}\n", encoding="utf-8")
        project = cookiecutter(str(TEMPLATE_DIR), no_input=True, extra_context=answers, output_dir=scratch,
                               config_file=str(config))
        project_table = tomllib.loads(Path(project, "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return {"": project_table["dependencies"], **project_table.get("optional-dependencies", {})}


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


@functools.cache
def shipped_versions() -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """(what every render pins, {tracker: what only that tracker's renders pin})."""
    common: dict[str, str] = {}
    per_tracker: dict[str, list[str]] = {}
    for answers in answer_sets():
        declared = declared_requirements(answers)
        tracker = str(answers["experiment_tracker"])
        trackers = [name for name in declared if name not in ("", "dev")]  # the extras named after trackers
        tracker_packages = {Requirement(text).name for name in trackers for text in declared[name]}
        own = [text for text in declared[""] + declared["dev"] if Requirement(text).name not in tracker_packages]
        common |= installed_closure(own)
        if tracker != "none":
            per_tracker.setdefault(tracker, []).extend(declared[""] + declared.get(tracker, []))
    tracker_only = {
        tracker: {name: version for name, version in installed_closure(requirements).items() if name not in common}
        for tracker, requirements in per_tracker.items()
    }
    return dict(sorted(common.items())), tracker_only


def constraints_text() -> str:
    common, tracker_only = shipped_versions()
    python = ".".join(platform.python_version_tuple()[:2])
    lines = [HEADER.format(python=python).rstrip("\n")]
    lines += [f"{name}=={version}" for name, version in common.items()]
    for tracker, versions in tracker_only.items():
        lines.append(f'{{%- if cookiecutter.experiment_tracker == "{tracker}" %}}')
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
