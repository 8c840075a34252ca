"""Load only the provider SDK modules a program touches.

A generated Pulumi SDK package (``pulumi_aws.ec2``, ``pulumi_kubernetes.core.v1``) imports every resource module of
its service in its ``__init__``: reaching ``aws.ec2.Vpc`` builds ~200 resource classes and their input types, and
that was about a third of `inferstack plan`. The SDKs already defer each service package until its first attribute
access (``pulumi._utils.lazy_import``); `thin` turns each still-deferred package into one that imports, on a
lookup, only the module the SDK's own layout puts that name in (``Vpc`` in ``ec2/vpc.py`` or ``Namespace`` in
``core/v1/Namespace.py``; ``...Args`` in ``_inputs.py``). A name found nowhere there loads the package whole, as a
plain import would, so a lookup never answers differently than it would without `thin`.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from collections.abc import Iterable, Iterator

from components.base.names import camel_to

_LAZY_MODULE = "_LazyModule"
"""The class name of a package that ``pulumi._utils.lazy_import`` has registered but not yet executed."""

_SHARED_MODULES = ("_inputs", "outputs", "_enums")
"""Where a service package keeps the types that are not one resource's own (nested ``...Args``, enums)."""


def thin(*sdk_roots: str) -> None:
    """Make every still-deferred package under these SDK roots (e.g. ``"pulumi_aws"``) load per name. Idempotent;
    packages already loaded whole stay as they are."""
    for name, module in list(sys.modules.items()):
        if name.partition(".")[0] in sdk_roots and type(module).__name__ == _LAZY_MODULE:
            _make_thin(module)


_LOADED_WHOLE = "__thin_loaded_whole__"


class ThinPackage(types.ModuleType):
    """A service package that imports the module holding a name when that name is first looked up."""

    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        for module_name in _candidate_modules(name):
            module = self._submodule(module_name)
            if module is None:
                continue
            # pulumi_kubernetes names a resource's module after its class: the class, not the module, is the
            # attribute; a name that is only a module is a subpackage (``core.v1``).
            value = vars(module).get(name, module if module_name == name else None)
            if value is not None:
                setattr(self, name, value)
                return value
        self._load_whole()
        return types.ModuleType.__getattribute__(self, name)

    def __dir__(self) -> Iterable[str]:
        self._load_whole()
        return types.ModuleType.__dir__(self)

    def _submodule(self, module_name: str) -> types.ModuleType | None:
        full_name = f"{self.__name__}.{module_name}"
        loaded = sys.modules.get(full_name)
        if loaded is not None:
            return loaded
        spec = importlib.util.find_spec(full_name)
        if spec is None:
            return None
        if spec.submodule_search_locations is None:
            return importlib.import_module(full_name)
        # A nested service package (``pulumi_kubernetes.core`` -> ``v1``): registered, and thin in turn.
        package = importlib.util.module_from_spec(spec)
        sys.modules[full_name] = package
        setattr(self, module_name, package)
        _make_thin(package)
        return package

    def _load_whole(self) -> None:
        """Run the package's own ``__init__``: for a name the layout does not place, and for ``dir()``."""
        spec = self.__spec__
        if spec is None or spec.loader is None or vars(self).get(_LOADED_WHOLE):
            return
        setattr(self, _LOADED_WHOLE, True)
        spec.loader.exec_module(self)


def _make_thin(module: types.ModuleType) -> None:
    module.__class__ = ThinPackage


def _candidate_modules(name: str) -> Iterator[str]:
    """Where the generated SDKs put ``name``: a module of that name (pulumi_kubernetes, and subpackages), its
    snake_case (pulumi_aws), a data source's module for its ``_output`` form, the resource its ``Args``/``ArgsDict`` belong to, then the shared type modules."""
    yield name
    yield camel_to("_", name)
    if name.endswith("_output"):  # a data source's Output form lives beside it: get_x_output in get_x.py
        yield name.removesuffix("_output")
    for suffix in ("ArgsDict", "Args"):
        if name.endswith(suffix) and len(name) > len(suffix):
            resource = name.removesuffix(suffix)
            yield resource
            yield camel_to("_", resource)
            break
    yield from _SHARED_MODULES
