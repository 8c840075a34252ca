"""Every field a stack file can set has a description: it is what editors show from the JSON Schema."""

from __future__ import annotations

import typing
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel

from components.spec import PlatformSpec


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    """The pydantic models an annotation mentions, through unions, lists, dicts and Annotated."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in typing.get_args(annotation):
        yield from _models_in(arg)


def _reachable(root: type[BaseModel]) -> list[type[BaseModel]]:
    seen: list[type[BaseModel]] = []
    todo = [root]
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.append(model)
        for field in model.model_fields.values():
            todo += _models_in(field.annotation)
    return seen


def test_every_model_of_the_spec_is_walked() -> None:
    names = {m.__name__ for m in _reachable(PlatformSpec)}
    assert {"PlatformSpec", "ModelSpec", "EngineSpec", "RoutingSpec", "ChartVersionsSpec"} <= names
    assert {"ArchitectureSpec", "GpuPoolSpec", "ScalingSpec", "BudgetSpec"} <= names


def test_every_spec_field_has_a_description() -> None:
    undocumented = [
        f"{model.__name__}.{name}"
        for model in _reachable(PlatformSpec)
        for name, field in model.model_fields.items()
        if not (field.description or "").strip()
    ]
    assert not undocumented, (
        "fields without a description (write a docstring under each, in components/spec/): "
        + ", ".join(undocumented)
    )


def test_the_walk_sees_through_optional_and_list_annotations() -> None:
    class Optional(BaseModel):
        x: int

    class Listed(BaseModel):
        y: int

    class Root(BaseModel):
        maybe: Optional | None = None
        many: list[Listed] = []

    assert set(_reachable(Root)) == {Root, Optional, Listed}
