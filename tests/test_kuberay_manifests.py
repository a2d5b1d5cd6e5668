"""The KubeRay manifests (``jobs/kuberay/``) against KubeRay's published CRD schema, and against our entry points.

Kubernetes validates a custom resource with its CRD's ``openAPIV3Schema`` and, with strict field validation
(kubectl's default), refuses a field the schema does not declare. :func:`strict_schema` turns that schema into a
JSON Schema that does the same (closed objects where Kubernetes prunes, ``nullable``, no CEL rules), so a typo in
a manifest fails here, in CI, rather than in a cluster. The serve config inside the RayService must be the one of
``jobs/serve.yaml``, and the RayJob's entrypoint must be valid ``jobs/backtest.py`` flags. Unit tier: no cluster,
no Ray started.
"""

from __future__ import annotations

import functools
import importlib
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
KUBERAY = ROOT / "jobs" / "kuberay"
#: Where jobs/kuberay/Dockerfile puts the repository in the image.
IMAGE_ROOT = "/home/ray/distributed-onnx/"
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRDs are 2.4 MB: libyaml reads them in a second


@functools.cache
def crd(plural: str) -> dict[str, Any]:
    return dict(yaml.load((KUBERAY / "crd" / f"ray.io_{plural}.yaml").read_text(), Loader=_LOADER))


def served_schema(definition: dict[str, Any], api_version: str) -> dict[str, Any]:
    """The ``openAPIV3Schema`` of ``api_version`` (``ray.io/v1``), which the CRD must serve."""
    group, version = api_version.split("/")
    assert group == definition["spec"]["group"], (
        f"apiVersion {api_version} is not of group {definition['spec']['group']}"
    )
    (entry,) = [entry for entry in definition["spec"]["versions"] if entry["name"] == version]
    assert entry["served"], f"{api_version} is not served by this CRD"
    return dict(entry["schema"]["openAPIV3Schema"])


def strict_schema(node: Any) -> Any:
    """A copy of a Kubernetes structural schema as a JSON Schema that refuses what the API server refuses.

    An object with ``properties`` and neither ``additionalProperties`` nor ``x-kubernetes-preserve-unknown-fields``
    is closed (the server prunes unknown fields, and strict validation refuses them); ``nullable`` admits null.
    """
    if isinstance(node, list):
        return [strict_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    schema = dict(node)
    if "properties" in schema:
        schema["properties"] = {name: strict_schema(sub) for name, sub in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
    for key in ("items", "additionalProperties", "not"):
        if isinstance(schema.get(key), dict):
            schema[key] = strict_schema(schema[key])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in schema:
            schema[key] = strict_schema(schema[key])
    if schema.get("nullable") and isinstance(schema.get("type"), str):
        schema["type"] = [schema["type"], "null"]
    return schema


def manifest(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((KUBERAY / name).read_text()))


def validation_errors(document: dict[str, Any], plural: str) -> list[str]:
    schema = strict_schema(served_schema(crd(plural), document["apiVersion"]))
    validator = jsonschema.Draft7Validator(schema)
    return sorted(
        f"{'.'.join(map(str, error.absolute_path))}: {error.message}" for error in validator.iter_errors(document)
    )


MANIFESTS = [("rayservice.yaml", "rayservices", "RayService"), ("rayjob.yaml", "rayjobs", "RayJob")]


@pytest.mark.parametrize(("name", "plural", "kind"), MANIFESTS)
def test_each_manifest_validates_against_kuberays_crd_schema(name: str, plural: str, kind: str) -> None:
    document = manifest(name)
    assert document["kind"] == kind == crd(plural)["spec"]["names"]["kind"]
    assert validation_errors(document, plural) == []


def cluster_spec(document: dict[str, Any]) -> dict[str, Any]:
    """The Ray cluster of a RayJob (``rayClusterSpec``) or a RayService (``rayClusterConfig``)."""
    return dict(document["spec"]["rayClusterSpec" if document["kind"] == "RayJob" else "rayClusterConfig"])


@pytest.mark.parametrize(("name", "plural", "kind"), MANIFESTS)
def test_an_unknown_field_a_wrong_type_or_value_fails_the_check(name: str, plural: str, kind: str) -> None:
    unknown = manifest(name)
    cluster_spec(unknown)["headGroupSpec"]["replica"] = 1
    assert any("'replica' was unexpected" in error for error in validation_errors(unknown, plural))

    wrong_type = manifest(name)
    cluster_spec(wrong_type)["workerGroupSpecs"][0]["maxReplicas"] = "four"
    expected = "maxReplicas: 'four' is not of type 'integer'"
    assert any(expected in error for error in validation_errors(wrong_type, plural))

    bad_enum = manifest(name)
    cluster_spec(bad_enum)["authOptions"]["mode"] = "off"
    assert any("authOptions.mode" in error for error in validation_errors(bad_enum, plural))


def test_the_rayservice_serves_the_application_of_jobs_serve_yaml() -> None:
    """Same import path, args and gRPC servicers as ``jobs/serve.yaml``; valid for Serve and for ServeSettings."""
    from ray.serve.schema import ServeDeploySchema

    from distributed_onnx.serve.settings import ServeSettings

    embedded = yaml.safe_load(manifest("rayservice.yaml")["spec"]["serveConfigV2"])
    reference = yaml.safe_load((ROOT / "jobs" / "serve.yaml").read_text())
    ServeDeploySchema.model_validate(embedded)
    (application,) = embedded["applications"]
    (expected,) = reference["applications"]
    assert {key: application[key] for key in ("name", "route_prefix", "import_path", "args")} == {
        key: expected[key] for key in ("name", "route_prefix", "import_path", "args")
    }
    assert embedded["grpc_options"] == reference["grpc_options"]
    module, attribute = application["import_path"].split(":")
    assert callable(getattr(importlib.import_module(module), attribute))
    for servicer in embedded["grpc_options"]["grpc_servicer_functions"]:
        module, attribute = servicer.split(":")
        assert callable(getattr(importlib.import_module(module), attribute))
    settings = ServeSettings.from_sources(application["args"], source="rayservice.yaml serveConfigV2 args")
    assert settings.grpc_port == embedded["grpc_options"]["port"]
    assert settings.port == embedded["http_options"]["port"]


def test_the_rayjob_runs_jobs_backtest_py_with_valid_backtest_settings() -> None:
    from distributed_onnx import cli
    from distributed_onnx.evaluation.settings import BacktestSettings
    from distributed_onnx.settings_flags import given_flags

    words = shlex.split(manifest("rayjob.yaml")["spec"]["entrypoint"])
    local = [str(ROOT / word.removeprefix(IMAGE_ROOT)) if word.startswith(IMAGE_ROOT) else word for word in words]
    assert local[:2] == ["python", str(ROOT / "jobs" / "backtest.py")]
    args = cli._parser(["backtest", *local[2:]]).parse_args(["backtest", *local[2:]])
    settings = BacktestSettings.from_sources(given_flags(args), args.config)
    assert str(settings.output).startswith("s3://")
    assert settings.checkpoint and all(Path(path).is_file() for path in settings.checkpoint)
