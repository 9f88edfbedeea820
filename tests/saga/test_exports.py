"""The saga package's public names: the versioning API is exported, and documented."""

from __future__ import annotations

import inspect

import saga

VERSIONING = {
    "COMPATIBILITY_RULES",
    "KEEP",
    "Change",
    "CompensationShape",
    "DrainNote",
    "IncompatibleChange",
    "Instance",
    "Migrated",
    "Migration",
    "MigrationRefused",
    "MigrationReport",
    "MigrationResult",
    "Plan",
    "Registration",
    "RegistrySnapshot",
    "Rule",
    "Shape",
    "StepShape",
    "Stranded",
    "TypeShape",
    "VersionDrained",
    "VersionError",
    "VersionInUse",
    "VersionStatus",
    "Versions",
    "WorkerInfo",
    "check_registry",
    "compare_shapes",
    "migration",
    "run_migration",
    "shape_of",
    "stranded_instances",
}


def test_the_versioning_api_is_exported() -> None:
    assert set(saga.__all__) >= VERSIONING


def test_every_exported_class_and_function_has_a_docstring() -> None:
    for name in saga.__all__:
        value = getattr(saga, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert inspect.getdoc(value), name


COMPOSITION = {"BranchView", "Group", "GroupState", "ParentLink"}


def test_the_composition_api_is_exported() -> None:
    assert set(saga.__all__) >= COMPOSITION


def test_the_templates_are_exported_and_documented() -> None:
    import saga.templates

    assert set(saga.templates.__all__) == {
        "ApprovalChain",
        "ApprovalRequest",
        "Decision",
        "approval_chain",
        "batch",
        "chunked",
    }
    for name in saga.templates.__all__:
        assert inspect.getdoc(getattr(saga.templates, name)), name
